"""The one-board demo end to end, on tiny settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from powerctl.boards import board_model
from simulations.__main__ import main
from simulations.demo import DemoConfig, run_demo, summary_table


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("demo")
    cfg = DemoConfig(
        model="cnn-tiny",
        power_cap_w=2.5,
        target_accuracy=0.3,
        batch_sizes=[8, 32],
        pretrain_samples=256,
        max_samples=3000,
        eval_every_samples=64,
        eval_max_samples=200,
        profile_samples=1000,
        profile_steps=1,
        profile_warmup=0,
    )
    return run_demo(cfg, out, progress=False), out


def test_every_strategy_is_measured_under_the_same_cap(results) -> None:
    res, out = results
    rows = {r["strategy"]: r for r in res["strategies"]}
    assert set(rows) == {"method", "state-of-practice", "proxy-batch", "oracle"}
    cap = res["config"]["power_cap_w"]
    method = rows["method"]
    assert method["peak_power_w"] <= cap * 1.05  # measured while training (1 % sensor noise)
    assert method["profiled_peak_power_w"] <= cap
    nano = board_model("jetson-nano")
    assert rows["state-of-practice"]["frequency_hz"] == nano.fixed_frequency_cap(cap)
    assert rows["state-of-practice"]["batch_size"] == 32
    for r in rows.values():
        if r["reached"]:
            assert r["speedup_vs_state_of_practice"] == pytest.approx(
                rows["state-of-practice"]["device_seconds"] / r["device_seconds"]
            )
        assert (
            r["curve"][-1]["device_seconds"] == pytest.approx(r["device_seconds"], rel=0.2)
            or not r["reached"]
        )
    # the oracle is the fastest measured run among batch sizes at their best feasible frequency
    best = min((r for r in res["all_runs"] if r["reached"]), key=lambda r: r["device_seconds"])
    assert rows["oracle"]["device_seconds"] <= best["device_seconds"] * 1.0001
    saved = json.loads((out / "results.json").read_text())
    assert saved["schema"] == "simulations.demo/1"
    assert (out / "plots" / "strategies.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "profile.json").exists() and (out / "relation.json").exists()
    table = summary_table(res)
    assert all(name in table for name in rows)


def test_bad_flags_are_one_line(capsys) -> None:
    assert main(["demo", "--out", "x", "--power-cap", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--power-cap" in err and "positive" in err and err.count("\n") == 1
