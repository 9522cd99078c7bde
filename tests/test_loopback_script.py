"""`deploy/loopback.sh`, the operator's whole deployment on 127.0.0.1, run as an operator runs it.

It must end with the run's results line, leave the fake Nano as it found it, and stop every process it
started (by process group), also when interrupted with Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from powerctl.procs import alive
from tests.deployed_run import check_results, check_table, seeded_task
from tests.fake_boards import default_signals
from tests.flower_deploy import REPO, free_port

pytestmark = pytest.mark.slow
SCRIPT = REPO / "deploy" / "loopback.sh"
NODES = {"nano-01": ("jetson", 4.0), "tx2nx-01": ("sim:jetson-tx2nx", 4.5)}
"""The script's SuperNodes by the names it gives them: device and cap in W (the fake Nano is a
real-board backend)."""


def three_free_ports() -> int:
    """A port P with P+1 and P+2 free too (the SuperLink's and the two SuperNodes')."""
    for _ in range(50):
        port = free_port()
        try:
            for p in (port + 1, port + 2):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise AssertionError("no three consecutive free ports")


def start(work: Path, rounds: int = 1) -> subprocess.Popen:
    """The script as an operator runs it, with this test's environment ($POWERFED_CACHE included)."""
    env = {**os.environ, "PYTHON": sys.executable, "PORT": str(three_free_ports()), "ROUNDS": str(rounds)}
    env.pop("PYTHONPATH", None)
    env.pop("POWERCTL_SYSFS_ROOT", None)  # the script sets its own for the fake Nano only
    return subprocess.Popen(
        ["bash", str(SCRIPT), str(work)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=default_signals,  # Ctrl-C must reach the script as it does from a shell
    )


def started_pids(work: Path) -> list[int]:
    path = work / "pids"
    return [int(line.split()[0]) for line in path.read_text().splitlines()] if path.exists() else []


def test_the_loopback_deployment_runs_and_stops_everything(
    tmp_path: Path, seeded_cache: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    seeded_task(seeded_cache, monkeypatch)  # the deployed-run task (tests/deployed_run.py)
    work = tmp_path / "loopback"
    proc = start(work)
    try:
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            proc.communicate(timeout=120)
    lines = [line for line in out.splitlines() if line.strip()]
    context = "\n".join(lines[-60:])
    assert proc.returncode == 0, context
    assert sum(line.startswith("check: OK") for line in lines) == 3, context  # two boards, one flwr
    results = work / "results" / "results.json"
    assert f"results: {results}" in lines, context
    assert lines[-1].startswith("loopback: stopped every process"), context
    check_table(out, NODES, context)  # both rows, and both reports in full (more rounds: test_restarts)
    check_results(results, context, NODES)
    devfreq = work / "nano-sysfs/sys/devices/gpu.0/devfreq/57000000.gpu"
    assert (devfreq / "min_freq").read_text() == "76800000\n" and (
        devfreq / "max_freq"
    ).read_text() == "921600000\n"
    pids = started_pids(work)
    assert len(pids) == 4, pids  # SuperLink, SuperExec, two SuperNodes
    assert not [p for p in pids if alive(p)], "a process of the deployment outlived the script"


def test_ctrl_c_stops_everything_it_started(tmp_path: Path) -> None:
    work = tmp_path / "loopback"
    proc = start(work)
    deadline = time.monotonic() + 300
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "started supernode-tx2nx" in line or time.monotonic() > deadline:
            break
    time.sleep(2)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the script's terminal sends
    rest, _ = proc.communicate(timeout=180)
    text = "".join(seen) + rest
    assert proc.returncode == 130, text[-3000:]
    assert "loopback: interrupted" in text and "loopback: stopped every process" in text, text[-3000:]
    pids = started_pids(work)
    assert len(pids) == 4, (pids, text[-3000:])
    assert not [p for p in pids if alive(p)], "a process outlived Ctrl-C"
