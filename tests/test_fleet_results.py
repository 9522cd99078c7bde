"""The fleet's results.json, summary table and plots, built from per-method round records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from simulations.fleet import load_fleet_spec
from simulations.fleet_plots import plot_fleet
from simulations.fleet_results import FLEET_SCHEMA, build_results, summary_text

FLEET = """\
groups:
  - {device: sim:jetson-nano, power-cap-w: 3.0}
  - {device: sim:jetson-tx2nx, power-cap-w: [[0, 4.5], [100, 6]]}
task: {model: cnn-tiny, target-accuracy: 0.7, batch-sizes: [8, 16]}
rounds: 2
"""


def client(
    pid: int, device_s: float, prof_s: float, *, b: int, mhz: float, peak: float, reached: bool
) -> dict:
    device, cap = [("sim:jetson-nano", 3.0), ("sim:jetson-tx2nx", 4.5)][pid]
    return {
        "device": device,
        "board": device.removeprefix("sim:"),
        "power_cap_w": cap,
        "batch_size": b,
        "frequency_hz": int(mhz * 1e6),
        "device_s": device_s,
        "energy_j": 3.0 * device_s,
        "peak_power_w": peak,
        "profiled_peak_power_w": min(peak, cap),
        "samples": 100,
        "accuracy": 0.7,
        "reached_target": reached,
        "profiling_s": prof_s,
        "node_key": f"partition-{pid}",
        "partition_id": pid,
        "stand_in": False,
    }


def rnd(n: int, clients: list[dict], accuracy: float) -> dict[str, Any]:
    slowest = max(c["device_s"] + c["profiling_s"] for c in clients)
    over = [
        {"node": c["node_key"], "peak_power_w": c["peak_power_w"], "power_cap_w": c["power_cap_w"]}
        for c in clients
        if c["peak_power_w"] > c["power_cap_w"]
    ]
    summary = {"makespan_s": slowest, "total_energy_j": sum(c["energy_j"] for c in clients), "over_cap": over}
    return {
        "round": n,
        "clients": clients,
        "failed": [],
        "summary": summary,
        "evaluation": {"accuracy": accuracy},
    }


def write_method(folder: Path, method: str, rounds: list[dict]) -> None:
    (folder / method).mkdir(parents=True)
    data = {"schema": "fl_server.results/2", "run": {"config": {"batch-sizes": "8,16"}}, "rounds": rounds}
    (folder / method / "results.json").write_text(json.dumps(data))


@pytest.fixture
def results(tmp_path: Path) -> dict[str, Any]:
    spec_path = tmp_path / "fleet.yaml"
    spec_path.write_text(FLEET)
    spec = load_fleet_spec(spec_path)
    flwr = tmp_path / "flwr"
    # ours: profiles in round 1 (5 s), reaches the target after round 2
    write_method(
        flwr,
        "ours",
        [
            rnd(1, [client(0, 2.0, 5.0, b=16, mhz=614.4, peak=3.02, reached=False),
                    client(1, 1.0, 1.0, b=16, mhz=900, peak=4.4, reached=True)], 0.65),
            rnd(2, [client(0, 1.0, 0.0, b=16, mhz=614.4, peak=2.9, reached=True),
                    client(1, 0.0, 0.0, b=16, mhz=900, peak=2.0, reached=True)], 0.72),
        ],
    )  # fmt: skip
    # state of practice: slower rounds, target after round 1
    write_method(
        flwr,
        "state-of-practice",
        [
            rnd(1, [client(0, 8.0, 0.0, b=16, mhz=307.2, peak=2.5, reached=True),
                    client(1, 4.0, 0.0, b=16, mhz=600, peak=3.3, reached=True)], 0.71),
            rnd(2, [client(0, 0.0, 0.0, b=16, mhz=307.2, peak=2.0, reached=True),
                    client(1, 0.0, 0.0, b=16, mhz=600, peak=2.0, reached=True)], 0.71),
        ],
    )  # fmt: skip
    return build_results(spec, flwr, ["ours", "state-of-practice"], wall_s=12.5)


def test_one_record_per_client_per_round_per_method_with_device_cap_and_schedule(results: dict) -> None:
    assert results["schema"] == FLEET_SCHEMA
    recs = results["records"]
    assert len(recs) == 2 * 2 * 2
    assert {(r["method"], r["round"], r["node_key"]) for r in recs} == {
        (m, n, f"partition-{p}") for m in ("ours", "state-of-practice") for n in (1, 2) for p in (0, 1)
    }
    tx2 = next(r for r in recs if r["partition_id"] == 1)
    assert tx2["device"] == "sim:jetson-tx2nx" and tx2["power_cap_w"] == 4.5
    assert tx2["power_cap_schedule"] == [[0.0, 4.5], [100.0, 6.0]] and tx2["group"] == 1
    assert not results["fleet"]["notes"]  # clients follow the schedule: nothing to warn about
    assert tx2["cap_source"] == "schedule [0s:4.5, 100s:6]" and tx2["switches"] == 0


def test_switches_and_pauses_under_a_changing_cap_are_counted_and_tabled(tmp_path: Path) -> None:
    spec_path = tmp_path / "fleet.yaml"
    spec_path.write_text(FLEET)
    spec = load_fleet_spec(spec_path)
    follower_client = client(1, 3.0, 0.0, b=16, mhz=900, peak=4.4, reached=True)
    event = {
        "t_s": 0.0,
        "power_cap_w": 4.5,
        "old_batch_size": 0,
        "old_frequency_hz": 0,
        "fraction_done": 0.0,
        "predicted_remaining_s": 3.0,
        "in_step_over_cap_s": 0.0,
        "over_cap_s": 0.0,
    }
    follower_client["cap_events"] = [
        {**event, "kind": "start", "new_batch_size": 16, "new_frequency_hz": 900_000_000},
        {
            **event,
            "kind": "switch",
            "t_s": 1.0,
            "power_cap_w": 3.0,
            "new_batch_size": 8,
            "new_frequency_hz": 400_000_000,
            "in_step_over_cap_s": 0.01,
        },
        {
            **event,
            "kind": "pause",
            "t_s": 2.0,
            "power_cap_w": 1.0,
            "new_batch_size": 8,
            "new_frequency_hz": 100_000_000,
            "over_cap_s": 0.5,
        },
        {**event, "kind": "resume", "t_s": 2.6, "new_batch_size": 16, "new_frequency_hz": 900_000_000},
    ]
    follower_client["paused_s"] = 0.6
    flwr = tmp_path / "flwr"
    write_method(flwr, "ours", [rnd(1, [client(0, 2.0, 1.0, b=16, mhz=614.4, peak=2.9, reached=True),
                                        follower_client], 0.72)])  # fmt: skip
    sop = [client(0, 2.0, 0.0, b=16, mhz=307.2, peak=2.5, reached=True),
           client(1, 3.0, 0.0, b=16, mhz=600, peak=3.3, reached=True)]  # fmt: skip
    write_method(flwr, "state-of-practice", [rnd(1, sop, 0.72)])
    results = build_results(spec, flwr, ["ours", "state-of-practice"], wall_s=1.0)
    summary = results["summary"][0]
    assert (summary["switches"], summary["pauses"], summary["paused_s"]) == (1, 1, 0.6)
    text = summary_text(results)
    assert "16@900 → 8@400 → 8@100 → 16@900" in text
    row = next(line for line in text.splitlines() if line.startswith("partition-1"))
    assert row.split()[2:7] == ["1", "1", "1", "0.6", "0.50"]


def test_summary_time_to_target_makespans_energy_violations_and_ratios(results: dict) -> None:
    ours, sop = results["summary"]
    assert (
        ours["makespans_s"] == [7.0, 1.0] and ours["time_to_target_s"] == 8.0 and ours["reached_round"] == 2
    )
    assert ours["training_to_target_s"] == 3.0  # 2.0 + 1.0 without the 5 s profile
    assert sop["time_to_target_s"] == 8.0 and sop["reached_round"] == 1
    assert ours["energy_j"] == pytest.approx(3.0 * 4.0) and sop["energy_j"] == pytest.approx(36.0)
    assert ours["over_cap"] == 1 and sop["over_cap"] == 0 and ours["over_cap_profiled"] == 0
    assert ours["clients_at_target"] == 2 and ours["clients"] == 2
    assert ours["speedup_vs_sop"] == pytest.approx(1.0) and sop["speedup_vs_sop"] == pytest.approx(1.0)
    assert ours["energy_vs_sop"] == pytest.approx(12.0 / 36.0)
    text = summary_text(results)
    assert "ours" in text and "state-of-practice = the largest batch size" in text
    assert "7.0, 1.0" in text and "sim:jetson-tx2nx" in text


def test_a_method_that_never_reaches_the_target_has_no_time_to_target(tmp_path: Path) -> None:
    spec_path = tmp_path / "fleet.yaml"
    spec_path.write_text(FLEET)
    flwr = tmp_path / "flwr"
    write_method(
        flwr, "proxy-batch", [rnd(1, [client(0, 2.0, 0.0, b=8, mhz=307.2, peak=2.0, reached=False)], 0.5)]
    )
    res = build_results(load_fleet_spec(spec_path), flwr / "proxy-batch", ["proxy-batch"], wall_s=1.0)
    (s,) = res["summary"]
    assert s["time_to_target_s"] is None and s["speedup_vs_sop"] is None
    assert ">2.0" in summary_text(res)


def test_plots_are_written(results: dict, tmp_path: Path) -> None:
    paths = plot_fleet(results, tmp_path / "plots")
    names = sorted(p.relative_to(tmp_path / "plots").as_posix() for p in paths)
    assert names == ["makespan.png", "time_to_accuracy.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_a_deadline_method_is_tabled_beside_ours_with_its_round_deadlines(tmp_path: Path) -> None:
    spec_path = tmp_path / "fleet.yaml"
    spec_path.write_text(FLEET)
    spec = load_fleet_spec(spec_path)
    flwr = tmp_path / "flwr"
    fast = [client(0, 2.0, 1.0, b=16, mhz=614.4, peak=2.9, reached=True),
            client(1, 1.0, 1.0, b=16, mhz=900, peak=4.4, reached=True)]  # fmt: skip
    write_method(flwr, "ours", [rnd(1, fast, 0.72)])
    slow = [dict(c, method="ours") for c in fast]  # the client's method is ours; the run's is ours-deadline
    slow[1]["frequency_hz"], slow[1]["energy_j"] = 600_000_000, 2.5
    deadline_round = rnd(1, slow, 0.72)
    deadline_round["summary"]["deadline_s"] = 2.0
    write_method(flwr, "ours-deadline", [deadline_round])
    results = build_results(spec, flwr, ["ours", "ours-deadline"], wall_s=1.0)
    assert {r["method"] for r in results["records"]} == {"ours", "ours-deadline"}
    assert results["summary"][1]["deadlines_s"] == [2.0] and results["summary"][0]["deadlines_s"] == [None]
    text = summary_text(results)
    assert "ours-deadline: round deadlines 2.00 s" in text
    assert any(line.split()[:3] == ["sim:jetson-tx2nx", "4.5", "ours-deadline"] for line in text.splitlines())
