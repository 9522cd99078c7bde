"""`python -m simulations run` end to end on Flower's simulation engine (Ray): a tiny fleet, two methods,
from an empty cache, with a population sampled per round (who was available and sampled is recorded:
the draw's own tests are tests/test_fleet_sampling.py's) — one start-up for both behaviours. Its summary
is the one docs/results/fleets.md quotes for this CPU (tests/cpu_quotes.py): a change that moves the
fleet's numbers (a default, a seed, pre-training, the relation estimate) fails here until the quote is
run again and pasted."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from powerctl.procs import alive
from simulations.fleet import FleetSpec, load_fleet_spec
from simulations.linkstate_index import INSTALLED_LINE
from simulations.runner import run_seeds
from strategies.population import Population
from tests.cpu_quotes import check_against_quotes, quotes

ROOT = Path(__file__).resolve().parents[1]
QUOTED = ROOT / "docs" / "results" / "fleets.md"
"""The page that quotes this run's summary (the block after the line naming this file)."""
MARK = "tests/test_fleet_run.py"

TINY = """\
name: tiny
groups:
  - {device: sim:jetson-nano, power-cap-w: 3.0, count: 6}
  - {device: sim:jetson-tx2nx, power-cap-w: none, count: 6}
task:
  model: cnn-tiny
  pretrain-samples: 256
  target-accuracy: 0.3
  batch-sizes: [8, 16]
rounds: 2
seeds: {run: 6, relation: [0]}
budget: {samples: 96}
profiling: {samples: 512, warmup: 0, steps: 1}
evaluation: {every-samples: 32, max-samples: 64}
population: {clients-per-round: 2, availability: 0.5}
methods: [ours, state-of-practice]
"""
"""Seed 6 samples one Nano and one TX2 NX in each round (partitions 0-5 are Nanos): boards of one kind
in one round would race for the profile cache they share, and the quote would move with the race."""


def _blocks(text: str) -> list[str]:
    """The summary's method table and round-1 choices table: every line from `fleet tiny:` through the
    choices table, without the definitions paragraph between them."""
    lines = [line.strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("fleet tiny:"))
    table = lines[start : lines.index("", start)]
    first = next(i for i, line in enumerate(lines) if i > start and line.startswith("round 1: device"))
    end = next((i for i in range(first, len(lines)) if not lines[i]), len(lines))
    return table + lines[first:end]


def _quoted() -> dict[str, list[str]]:
    """The page's quotes of this run, by the CPU that printed each."""
    return quotes(QUOTED.read_text(encoding="utf-8"), MARK, "fleet tiny:", _blocks)


def second_seed_stops(spec: FleetSpec, offset: int) -> FleetSpec:
    """The product's seed rule (`FleetSpec.for_seed`); seed 2's ServerApp then stops after its first
    round as if it crashed (the soak tests' `inject-server-stop-round`, POWERFED_FAULT_INJECTION=1)."""
    seeded = spec.for_seed(offset)
    if offset == 1:
        stop = dataclasses.replace(seeded.settings, inject_server_stop_round=1)
        seeded = dataclasses.replace(seeded, settings=stop)
    return seeded


@pytest.mark.slow
def test_a_tiny_sampled_fleet_over_two_seeds_records_its_draws_leaves_out_a_failed_seed_and_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 1 is the quoted run from an empty cache; seed 2 (run and data seeds moved, its weights and
    relation vector the cache's) fails in round 1 and is reported and left out of the summary over seeds
    (`--seeds`' loop; its summary arithmetic is tests/test_fleet_seeds.py's)."""
    monkeypatch.setenv("POWERFED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("POWERFED_FAULT_INJECTION", "1")
    fleet = tmp_path / "tiny.yaml"
    fleet.write_text(TINY)
    top = tmp_path / "out"
    lines: list[str] = []
    methods = ["ours", "state-of-practice"]
    seeds = run_seeds(load_fleet_spec(fleet), top, methods, 2, echo=lines.append, seed_spec=second_seed_stops)

    first, second = seeds["seeds"]
    assert (first["status"], first["run_seed"]) == ("ok", 6) and not first["prepared_cached"]
    assert second["status"] == "failed" and seeds["failed_seeds"] == [2] and second["prepared_cached"]
    assert "InjectedServerStop: injected ServerApp stop in round 1" in second["reason"]
    assert second["log"] in second["reason"] and Path(second["log"]).is_file()
    assert [s["seeds"] for s in seeds["summary"]] == [1, 1]
    assert (
        "seed 2 (run 7, data" in (top / "summary.txt").read_text()
        and "FAILED, excluded" in (top / "summary.txt").read_text()
    )
    assert any(line.startswith("=== seed 2 of 2 FAILED after") for line in lines)
    out = top / "seed-1"  # seed 1's own folder: what a single run writes
    # the runner's simulation dispatched through the message index (the index answers as Flower's scan
    # does: tests/test_linkstate_index.py; a run without it: tests/test_flwr_run.py's plain `flwr run`)
    assert INSTALLED_LINE in (out / "flwr.log").read_text()
    data = json.loads((out / "results.json").read_text())
    assert first["summary"] == data["summary"]
    started = data["processes"]["started"] + second["processes"]["started"]
    assert min(len(data["processes"]["started"]), len(second["processes"]["started"])) >= 3, (
        "flwr, its SuperLink and the simulation should have been seen in each run"
    )
    assert not [p for p in started if alive(p)], "processes of the runs are still alive"
    assert data["schema"] == "simulations.fleet/2" and data["methods"] == ["ours", "state-of-practice"]
    assert data["failures"] == [] and [s["method"] for s in data["summary"]] == data["methods"]
    pop = Population(clients_per_round=2, availability=0.5, seed=6)
    for method in data["methods"]:
        rounds = data["population"][method]["rounds"]
        assert rounds == [pop.draw(r, range(12), 12).record() for r in (1, 2)]  # seeded: the same draw here
        for r in rounds:
            trained = sorted(
                x["partition_id"]
                for x in data["records"]
                if x["method"] == method and x["round"] == r["round"]
            )
            assert trained == r["sampled"] and len(trained) == 2
    assert all(s["clients"] == 2 for s in data["summary"])
    recs = data["records"]
    assert {(r["device"], r["power_cap_w"]) for r in recs} == {
        ("sim:jetson-nano", 3.0),
        ("sim:jetson-tx2nx", None),
    }
    for r in recs:
        if r["method"] == "state-of-practice" and r["device"] == "sim:jetson-nano":
            assert r["batch_size"] == 16 and r["profiling_s"] == 0.0
    for plot in ("plots/time_to_accuracy.png", "plots/makespan.png", "summary.png"):
        assert (out / plot).stat().st_size > 10_000
    text = (out / "summary.txt").read_text()
    assert text.startswith("fleet tiny: 12 boards") and "population: 12 boards; 2 sampled per round" in text
    echoed = "\n".join(lines)
    assert "[ours] round 1 train: 2/2 clients done" in echoed and "=== method state-of-practice" in echoed
    check_against_quotes(_blocks(text), QUOTED.relative_to(ROOT), _quoted())
