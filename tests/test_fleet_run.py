"""`python -m simulations run` end to end on Flower's simulation engine (Ray): a tiny fleet, two methods."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulations.fleet import load_fleet_spec
from simulations.local_superlink import alive
from simulations.runner import run_fleet

TINY = """\
name: tiny
groups:
  - {device: sim:jetson-nano, power-cap-w: 3.0}
  - {device: sim:jetson-tx2nx, power-cap-w: none}
task:
  model: cnn-tiny
  pretrain-samples: 256
  target-accuracy: 0.3
  batch-sizes: [8, 16]
rounds: 1
seeds: {relation: [0]}
budget: {samples: 96}
profiling: {samples: 512, warmup: 0, steps: 1}
evaluation: {every-samples: 32, max-samples: 64}
methods: [ours, state-of-practice]
"""


@pytest.mark.slow
def test_a_tiny_fleet_runs_every_method_and_leaves_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POWERFED_CACHE", str(tmp_path / "cache"))
    fleet = tmp_path / "tiny.yaml"
    fleet.write_text(TINY)
    out = tmp_path / "out"
    lines: list[str] = []
    results = run_fleet(load_fleet_spec(fleet), out, ["ours", "state-of-practice"], echo=lines.append)

    started = results["processes"]["started"]
    assert len(started) >= 3, "flwr, its SuperLink and the simulation should have been seen"
    assert not [p for p in started if alive(p)], "processes of the run are still alive"

    data = json.loads((out / "results.json").read_text())
    assert data["schema"] == "simulations.fleet/1" and data["methods"] == ["ours", "state-of-practice"]
    recs = data["records"]
    assert sorted((r["method"], r["device"], r["power_cap_w"]) for r in recs) == [
        ("ours", "sim:jetson-nano", 3.0),
        ("ours", "sim:jetson-tx2nx", None),
        ("state-of-practice", "sim:jetson-nano", 3.0),
        ("state-of-practice", "sim:jetson-tx2nx", None),
    ]
    assert data["failures"] == [] and [s["method"] for s in data["summary"]] == data["methods"]
    sop = {r["device"]: r for r in recs if r["method"] == "state-of-practice"}
    assert sop["sim:jetson-nano"]["batch_size"] == 16 and sop["sim:jetson-nano"]["profiling_seconds"] == 0.0
    for plot in ("time_to_accuracy.png", "per_cap.png", "makespan.png", "profile_maps/jetson-nano.png"):
        assert (out / "plots" / plot).stat().st_size > 10_000
    assert (out / "summary.txt").read_text().startswith("fleet tiny: 2 boards")
    text = "\n".join(lines)
    assert "[ours] round 1 train: 2/2 clients done" in text and "=== method state-of-practice" in text
