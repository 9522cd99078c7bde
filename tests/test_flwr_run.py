"""`flwr run .` end to end on Flower's simulation engine (Ray), as a user runs it, on private ports.

`flwr run .` leaves its local SuperLink running; the test stops it and everything it started by
process id (simulations.local_superlink), and checks that nothing of that process tree is left.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from fl_server.weights import save_weights
from powerctl.devices.simulated import POWER_NOISE
from powerctl.relation import RelationVector
from powerfed.training.models import build_model
from simulations.launcher import ANSI, INFRA_LINE
from simulations.local_superlink import (
    alive,
    descendants,
    flower_env,
    flwr_run_command,
    free_port,
    pids_listening_on,
    stop_local_superlink,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_flwr_run_simulates_four_boards_and_ends_with_the_results_line(tmp_path: Path) -> None:
    port, control = free_port(), free_port()
    env = flower_env(port, control)
    results = tmp_path / "results"
    run_config = (
        f"model='cnn-tiny' num-server-rounds=1 relation-seeds='0' batch-sizes='8,16' pretrain-samples=256 "
        f"target-accuracy=0.3 budget-samples=96 eval-every-samples=32 eval-max-samples=64 "
        f"profile-samples=512 profile-warmup=0 profile-steps=1 results-dir='{results}'"
    )
    cmd = flwr_run_command(".", "num-supernodes=4", run_config)
    tree: list[int] = []
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
        for pid in pids_listening_on(port):
            tree += [pid, *descendants(pid)]
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
    finally:
        stop_local_superlink(port)
    assert tree, "flwr run should have left its local SuperLink listening"
    assert not [p for p in tree if alive(p)], "processes of the run are still alive"

    # the ServerApp's own lines: Flower's log records and Ray-forwarded actor lines (which may follow
    # the ServerApp's end: an empty INFO record, "Manually terminating ClientAppActor") left out
    plain = [ANSI.sub("", ln) for ln in proc.stdout.splitlines()]
    lines = [ln for ln in plain if ln.strip() and not INFRA_LINE.match(ln)]
    assert lines[-1] == f"results: {results / 'results.json'}", out[-3000:]
    assert [ln for ln in lines if ln.startswith("results: ")] == [lines[-1]]
    assert "[round 1] clients" in out and "sim:jetson-tx2nx" in out
    data = json.loads((results / "results.json").read_text())
    (rnd,) = data["rounds"]
    devices = sorted((c["device"], c["power_cap_w"] or 0.0) for c in rnd["clients"])
    assert len(devices) == 4 and rnd["summary"]["failed"] == []
    assert ("sim:jetson-nano", 0.0) in devices  # the uncapped board
    for c in rnd["clients"]:  # the method's guarantee is on the profile; a run's peak adds sensor noise
        assert c["power_cap_w"] is None or c["profiled_peak_power_w"] <= c["power_cap_w"]
        assert c["power_cap_w"] is None or c["peak_power_w"] <= c["power_cap_w"] * (1 + 5 * POWER_NOISE)
    assert not (ROOT / "pyproject.toml").read_text().count("[tool.flwr.federations")


@pytest.mark.slow
def test_flwr_run_names_a_client_that_raises_and_one_that_hangs_past_the_timeout(tmp_path: Path) -> None:
    """The real simulation path: an exception in a Ray actor and a reply later than `round-timeout`."""
    port, control = free_port(), free_port()
    env = flower_env(port, control, POWERFED_FAULT_INJECTION="1")
    results = tmp_path / "results"
    weights, relation = tmp_path / "weights.safetensors", tmp_path / "relation.json"  # no pre-training
    save_weights(weights, build_model("cnn-tiny", 10, seed=0), model_name="cnn-tiny", num_classes=10)
    RelationVector.from_samples("cnn-tiny", "proxy", 0.3, {8: 300.0, 16: 400.0}).save(relation)
    # seed 59 draws, for round 1: partition-0 nothing, partition-1 raise, partition-2 hang
    run_config = (
        f"model='cnn-tiny' num-server-rounds=1 weights='{weights}' relation='{relation}' batch-sizes='8,16' "
        f"target-accuracy=0.3 budget-samples=96 eval-every-samples=32 eval-max-samples=64 "
        f"profile-samples=512 profile-warmup=0 profile-steps=1 results-dir='{results}' fraction-evaluate=0.0 "
        f"round-timeout=30.0 inject-failures='raise:0.3,hang:0.3' inject-seed=59 inject-hang-s=40.0"
    )
    cmd = flwr_run_command(
        ".", "num-supernodes=3 client-resources-num-cpus=1 init-args-num-cpus=3", run_config
    )
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
    finally:
        stop_local_superlink(port)
    (rnd,) = json.loads((results / "results.json").read_text())["rounds"]
    assert [c["node_key"] for c in rnd["clients"]] == ["partition-0"]
    failed = {f["node_key"]: f for f in rnd["failed"]}
    assert failed["partition-1"]["kind"] == "error" and "injected failure" in failed["partition-1"]["reason"]
    assert failed["partition-2"]["kind"] == "timeout" and len(failed) == 2
    assert "partition-2 (timeout)" in rnd["summary"]["failed"][1]
    assert f"results: {results / 'results.json'}" in out
