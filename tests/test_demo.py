"""The one-board demo end to end, on tiny settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from powerctl.devices.boards import board_model
from simulations.__main__ import main
from simulations.demo import DEMO_NODE, DemoConfig, demo_work, quiet, run_demo, summary_table

TINY = {
    "model": "cnn-tiny",
    "target-accuracy": 0.3,
    "batch-sizes": "8,32",
    "pretrain-samples": 256,
    "budget-samples": 3000,
    "relation-max-samples": 3000,
    "eval-every-samples": 64,
    "eval-max-samples": 200,
    "profile-samples": 1000,
    "profile-steps": 1,
    "profile-warmup": 0,
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("demo")
    cfg = DemoConfig(power_cap_w=2.5, run=TINY)
    return run_demo(cfg, out, quiet), out


def test_every_strategy_is_measured_under_the_same_cap(results) -> None:
    res, out = results
    rows = {r["strategy"]: r for r in res["strategies"]}
    assert set(rows) == {"ours", "state-of-practice", "proxy-batch", "oracle"}
    # every method reads the whole profile: the oracle searched every batch size, proxy-batch took the
    # proxy's fewest samples (a budgeted profile of ours alone would leave them one batch size)
    assert res["own_data_relation"]["batch_sizes"] == res["relation"]["batch_sizes"]
    proxy = dict(zip(res["relation"]["batch_sizes"], res["relation"]["samples_to_target"], strict=True))
    assert rows["proxy-batch"]["batch_size"] == min(proxy, key=lambda b: (proxy[b], -b))
    cap = res["config"]["power_cap_w"]
    method = rows["ours"]
    assert method["peak_power_w"] <= cap * 1.05  # measured while training (1 % sensor noise)
    assert method["profiled_peak_power_w"] <= cap
    nano = board_model("jetson-nano")
    assert rows["state-of-practice"]["frequency_hz"] == nano.fixed_frequency_cap(cap)
    assert rows["state-of-practice"]["batch_size"] == 32
    for r in rows.values():
        if r["reached"]:
            assert r["speedup_vs_state_of_practice"] == pytest.approx(
                rows["state-of-practice"]["device_s"] / r["device_s"]
            )
        assert r["curve"][-1]["device_s"] == pytest.approx(r["device_s"], rel=0.2) or not r["reached"]
    saved = json.loads((out / "results.json").read_text())
    assert saved["schema"] == "simulations.demo/3"
    assert (out / "plots" / "strategies.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "profile.json").exists() and (out / "relation.json").exists()
    table = summary_table(res)
    assert all(name in table for name in rows)


def test_bad_flags_are_one_line(capsys) -> None:
    assert main(["demo", "--out", "x", "--power-cap", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--power-cap" in err and "(0, 100000]" in err and err.count("\n") == 1


def test_the_demo_and_a_fleet_client_agree_on_the_oracle(results, monkeypatch) -> None:
    """The same board, cap, task, data and seed through the fleet's ClientApp and the record the fleet's
    ServerApp reads beside the report: the same own-data search, the same fastest configuration, the
    same measured run."""
    from flwr.app import ArrayRecord, ConfigRecord

    from simulations.bench_report import BenchReport
    from simulations.fleet_client import app as client_app
    from strategies import report
    from strategies.fedavg import PowerAwareFedAvg
    from strategies.power_aware import for_method
    from tests.fake_grid import FakeGrid

    res, _ = results
    monkeypatch.setitem(report.BESIDE_REPORT, BenchReport.KEY, BenchReport)  # as simulations.fleet_server
    cfg = DemoConfig(power_cap_w=2.5, run=TINY)
    work = demo_work(cfg, cfg.settings())
    node = {
        "device": cfg.device,
        "power-cap-w": cfg.power_cap_w,
        "data": "synthetic-image",
        "name": DEMO_NODE,
    }
    strategy = PowerAwareFedAvg(instructions=work.instr, node_instructions=for_method("oracle"))
    strategy.start(
        grid=FakeGrid(client_app, {5: node}, cfg.run_config()),
        initial_arrays=ArrayRecord.from_torch_state_dict(work.state),
        num_rounds=1,
        evaluate_config=ConfigRecord({"model": "cnn-tiny", "num-classes": 10, "model-overrides": "{}"}),
    )
    (client,) = strategy.rounds[1].clients
    demo = next(r for r in res["strategies"] if r["strategy"] == "oracle")
    assert (client["batch_size"], client["frequency_hz"]) == (demo["batch_size"], demo["frequency_hz"])
    assert client["samples"] == demo["samples"]
    assert client["device_s"] == pytest.approx(demo["device_s"], rel=1e-9)
    own = res["own_data_relation"]
    assert client["oracle_samples_to_target"] == {
        str(b): s for b, s in zip(own["batch_sizes"], own["samples_to_target"], strict=True)
    }


def test_a_demo_stopped_half_way_leaves_the_last_ones_files_as_they_were(results, tmp_path) -> None:
    """Ctrl-C (KeyboardInterrupt) during the rounds: every file of the previous demo is untouched."""
    _, previous = results
    out = tmp_path / "demo"
    out.mkdir()
    names = ("results.json", "profile.json", "relation.json")
    kept = {name: (previous / name).read_bytes() for name in names}
    for name, data in kept.items():
        (out / name).write_bytes(data)

    def stop_at_the_second_round(line: str) -> None:
        if line == "state-of-practice:":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_demo(DemoConfig(power_cap_w=2.5, run=TINY), out, stop_at_the_second_round)
    assert {p.name for p in out.iterdir()} == set(kept)
    assert all((out / name).read_bytes() == data for name, data in kept.items())
