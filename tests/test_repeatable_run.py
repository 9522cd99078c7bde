"""A seeded `make run` prints the same numbers when run again: the default run config (model, task,
target, fleet, budgets) at a reduced size — fewer nodes, rounds, relation seeds and batch sizes, a
smaller pre-training and round budget — prints the round-1 table that docs/howto/flwr-run.md quotes
from an earlier run on this CPU (tests/cpu_quotes.py)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from simulations.local_superlink import free_port
from tests.cpu_quotes import check_against_quotes, quotes
from tests.test_launcher import _make

ROOT = Path(__file__).resolve().parents[1]
QUOTED = ROOT / "docs" / "howto" / "flwr-run.md"
"""The page that quotes this run's round-1 table (the block after `make run NODES=2 RUN_CONFIG=...`)."""

REDUCED = (
    "num-server-rounds=1 relation-seeds=\"0\" batch-sizes='32,64' pretrain-samples=256 "
    "budget-samples=512 eval-max-samples=100"
)
"""Overrides of the defaults for size only: the task and its target are the default run's."""

NUMBERS = (
    "device",
    "power_cap_w",
    "batch_size",
    "frequency_hz",
    "samples",
    "device_seconds",
    "energy_j",
    "peak_power_w",
    "accuracy",
    "profiling_seconds",
    "profiling_choice",
    "predicted_training_seconds",
    "profiling_budget_seconds",
)


def _round_one_table(text: str) -> list[str]:
    """The lines of round 1's client table, from its header to the round's summary line."""
    lines = [line.strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("[round 1] clients"))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith("round 1: makespan"))
    return [line for line in lines[start : end + 1] if line and not line.startswith("(")]  # not Ray's lines


def _run(tmp_path: Path, name: str, cache: Path) -> tuple[dict, str]:
    port = free_port()
    out_dir = tmp_path / name
    with _make(out_dir, port, env={"POWERFED_CACHE": str(cache)}, run_config=REDUCED) as proc:
        try:
            out, err = proc.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            pytest.fail("the reduced default run took over 15 minutes")
    assert proc.returncode == 0, (out + err)[-3000:]
    return json.loads((out_dir / "runs" / "flwr" / "results.json").read_text()), out + err


@pytest.mark.slow
def test_the_default_run_at_a_reduced_size_prints_its_quote(
    tmp_path: Path, seeded_cache: Callable[[str], Path]
) -> None:
    """The run profiles every board afresh (its cache holds the server's weights and relation vector only,
    built once per test run: tests/conftest.py seeded_cache, shared with tests/test_repeatable_fleet.py)
    and prints, to the digit, the round-1 table an earlier run of this code printed on this CPU. Exact
    floats twice from empty caches: tests/test_fl_server.py::test_a_seeded_run_repeats_its_numbers."""
    run, printed = _run(tmp_path, "run", seeded_cache(REDUCED))
    assert run["run"]["config"]["model"] == "resnet18-small"  # the default task, not a smaller one
    clients = run["rounds"][0]["clients"]
    assert clients and all(c[k] is not None for c in clients for k in NUMBERS)
    assert all(c["profiling_choice"] and not c["profile_cached"] for c in clients)
    page = QUOTED.read_text(encoding="utf-8")
    quoted = quotes(page, "make run NODES=2", "[round 1] clients", _round_one_table)
    check_against_quotes(_round_one_table(printed), QUOTED.relative_to(ROOT), quoted)
