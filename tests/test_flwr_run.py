"""`flwr run APP` end to end on Flower's simulation engine (Ray), as a user runs it, on private ports.

APP is this checkout staged as the launcher stages it (`fl_server.fab.staged_app`: the folders the FAB
can hold; tests/test_warm_start.py proves it packs to the same FAB as `flwr run .`), so that Flower does
not walk the three virtual environments in the checkout (75,000 files in CI, ~14 CPU-s).

`flwr run .` leaves its local SuperLink running; the test stops it and everything it started by
process id (simulations.local_superlink), and checks that nothing of that process tree is left.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fl_server.fab import staged_app
from powerctl.devices.simulated import POWER_NOISE
from powerctl.procs import alive
from simulations.launcher import ANSI, INFRA_LINE
from simulations.local_superlink import (
    descendants,
    flower_env,
    flwr_run_command,
    free_port,
    pids_listening_on,
    stop_local_superlink,
)
from tests.test_launcher import SMALL_RUN

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_flwr_run_simulates_four_boards_names_a_client_that_raises_and_one_that_hangs(
    tmp_path: Path, seeded_cache: Callable[[str], Path]
) -> None:
    """The whole app on four simulated boards, its task's weights and relation vector from the cache
    (preparing from an empty one inside `flwr run` is test_fleet_run's), one start-up for two behaviours
    of the real simulation path: two boards fine-tune under their caps, and an exception in a Ray actor
    and a reply later than `round-timeout` are each named while the round ends without them."""
    port, control = free_port(), free_port()
    cache = seeded_cache(SMALL_RUN)  # this run's task is SMALL_RUN's
    env = flower_env(port, control, POWERFED_FAULT_INJECTION="1", POWERFED_CACHE=str(cache))
    results = tmp_path / "results"
    # seed 5 draws, for round 1: partition-0 and -2 (the uncapped Nano) nothing, -1 raise, -3 hang
    run_config = (
        f"{SMALL_RUN} results-dir='{results}' fraction-evaluate=0.0 "
        f"round-timeout=30.0 inject-failures='raise:0.3,hang:0.3' inject-seed=5 inject-hang-s=40.0"
    )
    cmd = flwr_run_command(
        staged_app(ROOT, tmp_path / "app"),
        "num-supernodes=4 client-resources-num-cpus=1 init-args-num-cpus=4",
        run_config,
    )
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
    assert "[round 1] clients" in out and "pre-training" not in out  # the cached weights were used
    data = json.loads((results / "results.json").read_text())
    nodes = sorted((n["key"], n["device"]) for n in data["nodes"])
    assert [d for _, d in nodes] == ["sim:jetson-nano", "sim:jetson-tx2nx"] * 2, nodes
    (rnd,) = data["rounds"]
    devices = sorted((c["device"], c["power_cap_w"] or 0.0) for c in rnd["clients"])
    assert devices == [("sim:jetson-nano", 0.0), ("sim:jetson-nano", 3.0)]  # the uncapped board too
    for c in rnd["clients"]:  # the method's guarantee is on the profile; a run's peak adds sensor noise
        assert c["power_cap_w"] is None or c["profiled_peak_power_w"] <= c["power_cap_w"]
        assert c["power_cap_w"] is None or c["peak_power_w"] <= c["power_cap_w"] * (1 + 5 * POWER_NOISE)
    failed = {f["node_key"]: f for f in rnd["failed"]}
    assert failed["partition-1"]["kind"] == "error" and "injected failure" in failed["partition-1"]["reason"]
    assert failed["partition-3"]["kind"] == "timeout" and len(failed) == 2
    assert "partition-3 (timeout)" in rnd["summary"]["failed"][1]
    assert not (ROOT / "pyproject.toml").read_text().count("[tool.flwr.federations")
