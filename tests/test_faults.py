"""Failure injection for soak tests: refused without its switch, repeatable, logged before it acts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fl_client.app import app as client_app
from fl_client.faults import KILL_EXIT_STATUS, FaultConfigError, Faults, InjectedFailure, parse_faults
from fl_server.run_config import RunConfigError, parse_server_config
from strategies.rounds import NoClientReported
from tests.fake_grid import FakeGrid
from tests.fl_helpers import RUN_CONFIG
from tests.test_fl_strategy import _nodes, _run, power_aware

ROOT = Path(__file__).resolve().parents[1]


def test_without_the_switch_a_node_refuses_injected_failures_with_one_line(monkeypatch) -> None:
    monkeypatch.delenv("POWERFED_FAULT_INJECTION", raising=False)
    run_config = {**RUN_CONFIG, "inject-failures": "raise:1.0"}
    grid = FakeGrid(client_app, _nodes(2), run_config)
    strategy = power_aware(fraction_evaluate=0.0)
    with pytest.raises(NoClientReported, match="does not allow fault injection"):  # every node refused
        _run(grid, strategy)
    assert len(strategy.rounds[1].failed) == 2
    assert all(
        "'inject-failures'" in f.reason and "POWERFED_FAULT_INJECTION" in f.reason
        for f in strategy.rounds[1].failed
    )
    with pytest.raises(RunConfigError, match="inject-server-stop-round"):
        parse_server_config({"inject-server-stop-round": 2})


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("raise:2", "'raise:2'"),
        ("boom:0.1", "'boom:0.1'"),
        ("raise:0.7,kill:0.7", "more than 1"),
        ("hang", "'hang'"),
    ],
)
def test_bad_specs_are_one_line(monkeypatch, spec: str, fragment: str) -> None:
    monkeypatch.setenv("POWERFED_FAULT_INJECTION", "1")
    with pytest.raises(FaultConfigError, match=fragment.replace("(", r"\(")):
        parse_faults({"inject-failures": spec})


def test_draws_repeat_per_node_and_round_and_follow_the_probabilities() -> None:
    f = Faults({"raise": 0.2, "kill": 0.1}, seed=3)
    draws = [f.draw(f"partition-{i}", r) for i in range(50) for r in range(1, 21)]
    assert draws == [f.draw(f"partition-{i}", r) for i in range(50) for r in range(1, 21)]
    assert 0.15 < draws.count("raise") / len(draws) < 0.25 and 0.06 < draws.count("kill") / len(draws) < 0.14
    assert draws.count("hang") == 0


def test_an_injected_raise_leaves_the_handler_as_a_bug_would_and_is_logged(
    tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("POWERFED_FAULT_INJECTION", "1")
    monkeypatch.setenv("POWERFED_FAULT_LOG", str(tmp_path / "faults.jsonl"))
    grid = FakeGrid(client_app, _nodes(1), {**RUN_CONFIG, "inject-failures": "raise:1.0"})
    with pytest.raises(InjectedFailure):
        _run(grid, power_aware(fraction_evaluate=0.0))
    (entry,) = [json.loads(x) for x in (tmp_path / "faults.jsonl").read_text().splitlines()]
    assert (entry["node"], entry["round"], entry["fault"]) == ("partition-0", 1, "raise")


def test_a_kill_ends_the_process_after_logging_it_and_only_once_per_work(tmp_path: Path) -> None:
    log = tmp_path / "faults.jsonl"
    script = (
        "from fl_client.faults import kill_after_checkpoint, logged\n"
        "import sys\n"
        "if logged('n1', 4, 'kill'): sys.exit(0)\n"
        "f = kill_after_checkpoint('n1', 4, after_samples=32)\n"
        "f(1, 16); f(2, 32); f(3, 48)\n"
        "sys.exit(1)\n"
    )
    env = {"PYTHONPATH": str(ROOT), "POWERFED_FAULT_LOG": str(log), "PATH": "/usr/bin:/bin"}
    first = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, timeout=60)
    assert first.returncode == KILL_EXIT_STATUS
    assert json.loads(log.read_text())["fault"] == "kill"
    again = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, timeout=60)
    assert again.returncode == 0  # the same work, come back: not killed again
