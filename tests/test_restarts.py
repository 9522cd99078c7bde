"""A deployed run that outlives its faults: its SuperLink killed (SIGKILL) in round 1 and stopped
(SIGTERM) in round 2, a SuperNode lost in round 3; an unregistered SuperNode refused before it starts.

The deployment of docs/deployment.md on 127.0.0.1: TLS, node authentication, the SuperLink's state in a
database file, its SuperExec run apart (`--isolation process`), two registered SuperNodes (a fake-board
Nano pinned through sysfs, a simulated TX2 NX), the run followed by `python -m fl_server.supervise`.
After each restart the run must go on (re-attached, or submitted again and resumed from the results
folder), the SuperNodes must stay up by themselves and rounds 1-2 hold both reports; in round 3 the
TX2 NX's ClientApp hangs (injected) and its SuperNode is stopped (SIGTERM, as a service manager stops
it): the SuperLink answers for it (Flower error 5) and the round ends without it. The fake board must
be back as it was with no crash record left. One deployment for all of it: its start is paid once
(docs/testing.md). About 3 minutes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from powerctl.devices.fakeboard import make_fake_board
from simulations.local_superlink import stop_tree
from tests.deployed_run import run_config_for, seeded_task
from tests.fake_boards import tree_snapshot
from tests.flower_deploy import BIN, REPO, Deployment, Proc, free_port, make_ecdsa_key

pytestmark = pytest.mark.slow

ROUNDS = 3  # killed in round 1, stopped in round 2, a SuperNode lost in round 3
TIMEOUT_S = 900.0
REFUSAL_TIMEOUT_S = 60.0
HANG_SEED = 2
"""inject-failures='hang:0.5' with this seed draws nothing for rounds 1-2 and a hang for partition-1 in
round 3 (fl_client.faults.Faults.draw)."""


def wait_for(path: Path, text: str, timeout_s: float, after: int = 0) -> int:
    """Wait until `text` appears in the file past offset `after`; its offset."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        content = path.read_text(errors="replace") if path.exists() else ""
        at = content.find(text, after)
        if at >= 0:
            return at
        time.sleep(0.5)
    raise AssertionError(
        f"{text!r} not in {path} after {timeout_s} s:\n{path.read_text(errors='replace')[-4000:]}"
    )


def check_an_unregistered_node_is_refused(d: Deployment) -> None:
    """A SuperNode whose key the SuperLink does not know exits at once, in one line."""
    stranger, _ = make_ecdsa_key(d.root / "keys" / "unregistered")
    refused = d.start_supernode(
        "supernode-unregistered",
        'device="sim:jetson-nano" power-cap-w=3.5 partition-id=0 num-partitions=2',
        stranger,
    )
    started = time.monotonic()
    try:
        rc = refused.popen.wait(timeout=REFUSAL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        rc = None
    assert rc is not None, (
        f"an unregistered SuperNode still runs after {REFUSAL_TIMEOUT_S} s\n{refused.tail()}"
    )
    assert rc != 0, f"an unregistered SuperNode exited 0\n{refused.tail()}"
    # What Flower 1.41 says for an unknown key (not "All SuperNodes must be registered": that is the reply
    # to a SuperNode that asks the Fleet API to register itself): the SuperNode logs "Exit Code: 305" and
    # "[code: 2004] Failed to activate SuperNode" and exits with status 1; the SuperLink answers 412.
    log = refused.log.read_text(errors="replace")
    assert "Exit Code: 305" in log and "Failed to activate SuperNode" in log, refused.tail()
    superlink_log = (d.logs / "superlink.log").read_text(errors="replace")
    assert "No SuperNode found with the given public key" in superlink_log, d.superlink.tail()
    print(f"unregistered SuperNode refused: exit status {rc} after {time.monotonic() - started:.1f} s")


def test_a_run_goes_on_through_superlink_restarts_and_a_lost_supernode(
    tmp_path: Path, seeded_cache: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    seeded_task(seeded_cache, monkeypatch)  # the server's weights and relation vector, as prepared
    d = Deployment(tmp_path / "deploy", mode="auth")
    board = make_fake_board(tmp_path / "nano-sysfs", "jetson-nano")
    board_before = tree_snapshot(board)
    nano_state = tmp_path / "nano-state"
    database = d.root / "state.db"
    supervisor = None
    try:
        d.start_superlink(database=database, own_superexec=True)
        d.start_superexec()
        d.write_connection()
        check_an_unregistered_node_is_refused(d)
        keys = {name: make_ecdsa_key(d.root / "keys" / name)[0] for name in ("nano", "tx2nx")}
        for key in keys.values():
            d.register(key.with_name(key.name + ".pub"))
        fault_log = d.root / "faults.jsonl"  # their ClientApps may be told to fail (POWERFED_FAULT_INJECTION)
        inject = {"POWERFED_FAULT_INJECTION": "1", "POWERFED_FAULT_LOG": str(fault_log)}
        nano = d.start_supernode(
            "supernode-nano",
            'device="jetson" power-cap-w=4.0 partition-id=0 num-partitions=2',
            key=keys["nano"],
            extra_env={"POWERCTL_SYSFS_ROOT": str(board), "POWERCTL_STATE_DIR": str(nano_state), **inject},
        )
        tx2nx = d.start_supernode(
            "supernode-tx2nx",
            'device="sim:jetson-tx2nx" power-cap-w=6.0 partition-id=1 num-partitions=2',
            key=keys["tx2nx"],
            extra_env=inject,
        )
        results = d.root / "results"
        config = run_config_for(results).replace("num-server-rounds=1", f"num-server-rounds={ROUNDS}")
        config = " ".join(part for part in config.split() if not part.startswith("results-dir="))
        config = config.replace("budget-samples=512", "budget-samples=1024") + " checkpoint-every-samples=128"
        config += f" inject-failures='hang:0.5' inject-seed={HANG_SEED} inject-hang-s=900.0"
        config += " rejoin-wait-s=5.0"  # the lost TX2 NX is waited for once before round 3's evaluation
        argv = [sys.executable, "-m", "fl_server.supervise", d.connection, "--app", str(REPO)]
        argv += ["--results-dir", str(results), "--run-config", config, "--wait", "300"]
        supervisor = d.spawn("supervise", argv, cwd=REPO)
        log = supervisor.log

        # round 1: SIGKILL, as a crash or an OOM kill; back at once
        at = wait_for(log, "round 1 train: 0/2", TIMEOUT_S)
        time.sleep(3)
        os.kill(d.superlink.pid, signal.SIGKILL)
        d.superlink.popen.wait(timeout=30)
        d.start_superlink(database=database, own_superexec=True, name="superlink-2")
        at = wait_for(log, "supervise: ", 300, at)

        # round 2: SIGTERM, as a service manager stops it (uvicorn waits for open connections first)
        at = wait_for(log, "round 2 train: 0/2", TIMEOUT_S, at)
        time.sleep(3)
        d.superlink.popen.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        d.superlink.popen.wait(timeout=120)
        print(f"the SuperLink exited {time.monotonic() - stopping:.1f} s after its SIGTERM")
        d.start_superlink(database=database, own_superexec=True, name="superlink-3")

        # round 3: partition-1's ClientApp hangs; its SuperNode is stopped while it does
        at = wait_for(log, "round 3 train: 0/2", TIMEOUT_S, at)
        wait_for(fault_log, '"fault": "hang"', TIMEOUT_S)
        stop_tree(tx2nx.pid)

        rc = supervisor.popen.wait(timeout=TIMEOUT_S)
        out = log.read_text(errors="replace")
        context = f"\n--- supervise (exit {rc}) ---\n{out[-6000:]}\n{d.tails()}"
        assert rc == 0, f"the supervised run failed{context}"
        lines = [line for line in out.splitlines() if line.strip()]
        assert lines[-1] == f"results: {(results / 'results.json').resolve()}", context
        went_on = [line for line in lines if line.startswith("supervise: the SuperLink is back")]
        resubmitted = [line for line in lines if "submitted it again as run" in line]
        print("\n".join(went_on + resubmitted))
        assert len(went_on) + len(resubmitted) >= 2, (
            f"two restarts, each followed by the run going on{context}"
        )
        # the clean stop too: the supervisor let its log stream go when the port closed (else the
        # SuperLink waits for the stream until the run's heartbeat times out, fl_server.supervise._watch)
        lost = [line for line in lines if line.startswith("supervise: lost the SuperLink")]
        assert len(lost) == 2, context
        assert nano.alive(), f"the Nano's SuperNode did not stay up through the restarts{context}"
        faults = [json.loads(line) for line in fault_log.read_text().splitlines()]
        assert [(f["node"], f["round"], f["fault"]) for f in faults] == [("partition-1", 3, "hang")], faults

        data = json.loads((results / "results.json").read_text())
        assert [r["round"] for r in data["rounds"]] == list(range(1, ROUNDS + 1)), context
        for rnd in data["rounds"]:
            lost = rnd["round"] == 3
            failed = [(f["node_key"], f["kind"]) for f in rnd["failed"]]
            assert failed == ([("partition-1", "unavailable")] if lost else []), (
                f"{rnd['round']}: {failed}{context}"
            )
            devices = sorted(c["device"] for c in rnd["clients"])
            assert devices == (["jetson"] if lost else ["jetson", "sim:jetson-tx2nx"]), context
            for c in rnd["clients"]:
                assert c["peak_power_w"] is not None and c["peak_power_w"] <= c["power_cap_w"], c
        assert data["rounds"][2]["evaluation"]["clients"] and (results / "global.safetensors").is_file()
    finally:
        if supervisor is not None and supervisor.alive():
            supervisor.popen.send_signal(signal.SIGINT)
        left = d.stop()
    assert not left, f"processes left: {left}"
    assert tree_snapshot(board) == board_before, "the fake Nano was left pinned"
    assert not list(nano_state.glob("*.json")), f"crash records left: {list(nano_state.glob('*'))}"


def test_a_supernode_restarted_right_after_a_crash_is_accepted(tmp_path: Path) -> None:
    """Flower refuses a key whose SuperNode crashed less than ~60 s ago (305/2004); the wrapper
    releases the stale registration first, so the restarted SuperNode joins at once."""
    d = Deployment(tmp_path / "deploy", mode="auth")
    try:
        d.start_superlink()
        d.write_connection()
        key, pub = make_ecdsa_key(d.root / "keys" / "board1")
        d.register(pub)
        flags = ["--superlink", d.address, "--root-certificates", str(d.ca), "--auth-supernode-private-key"]
        flags += [str(key), "--node-config", 'device="sim:jetson-nano"']
        wrapper = [sys.executable, "-m", "fl_client.supernode"]

        def start(name: str) -> Proc:
            return d.spawn(name, [*wrapper, *flags, "--port", str(free_port())], d._home(name), cwd=REPO)

        first = start("supernode-1")
        wait_for(first.log, "SuperNode ID:", 120)
        os.killpg(first.pid, signal.SIGKILL)  # wrapper and SuperNode at once: no goodbye to the SuperLink
        first.popen.wait(timeout=10)

        plain_argv = [str(BIN / "flower-supernode"), *flags, "--port", str(free_port())]
        plain = d.spawn("supernode-plain", plain_argv, d._home("supernode-plain"))
        assert plain.popen.wait(timeout=120) != 0  # what an operator sees without the wrapper
        assert "Failed to activate SuperNode" in plain.log.read_text(errors="replace"), plain.tail()

        second = start("supernode-2")
        wait_for(second.log, "SuperNode ID:", 60)
        text = second.log.read_text(errors="replace")
        assert "supernode: released node" in text and "Failed to activate" not in text, second.tail()
        assert second.alive(), second.tail()
    finally:
        left = d.stop()
    assert not left, f"processes left: {left}"
