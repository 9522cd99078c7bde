"""A seeded `make run` prints the same numbers when run again: a small run (cnn-tiny on two simulated
boards, one round: tests/test_launcher.py's SMALL_RUN, in Flower's string syntax) prints the round-1
table that docs/howto/flwr-run.md quotes from an earlier run on this CPU (tests/cpu_quotes.py). It is
also the launcher's whole successful `make run`: the results line last, no process left."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from powerctl.procs import alive
from powerctl.records.relation import RelationVector
from simulations.local_superlink import free_port, pids_listening_on
from tests.cpu_quotes import check_against_quotes, quotes
from tests.test_launcher import SMALL_RUN, _make, _watch

ROOT = Path(__file__).resolve().parents[1]
QUOTED = ROOT / "docs" / "howto" / "flwr-run.md"
"""The page that quotes this run's round-1 table (the block after `make run NODES=2 RUN_CONFIG=...`)."""

NUMBERS = (
    "device",
    "power_cap_w",
    "batch_size",
    "frequency_hz",
    "samples",
    "device_s",
    "energy_j",
    "peak_power_w",
    "accuracy",
    "profiling_s",
    "profiling_choice",
    "predicted_training_s",
    "profiling_budget_s",
)


def _round_one_table(text: str) -> list[str]:
    """The lines of round 1's client table, from its header to the round's summary line."""
    lines = [line.strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("[round 1] clients"))
    end = next(i for i, line in enumerate(lines) if i > start and line.startswith("round 1: makespan"))
    return [line for line in lines[start : end + 1] if line and not line.startswith("(")]  # not Ray's lines


def _run(tmp_path: Path, name: str, cache: Path) -> tuple[dict, str]:
    """`make run` as a user types it (Flower's string syntax, both quotes), watched to its end: it must
    end with its results line and leave no process of its run behind."""
    port = free_port()
    out_dir = tmp_path / name
    with _make(out_dir, port, env={"POWERFED_CACHE": str(cache)}, run_config=SMALL_RUN) as proc:
        out, err, seen = _watch(proc, port)
    assert proc.returncode == 0, (out + err)[-3000:]
    results = out_dir / "runs" / "flwr" / "results.json"
    lines = out.strip().splitlines()
    assert lines[-1] == f"results: {results}"
    assert lines[-2] == f"summary figure: {results.parent / 'summary.png'}"  # the picture is checked
    # in tests/test_summary_figure.py; here only that `make run` wrote and named it
    assert (results.parent / "summary.png").stat().st_size > 10_000
    assert len(seen) >= 4, "make, the launcher, flwr and the SuperLink should have been seen"
    assert not [p for p in seen if alive(p)] and not pids_listening_on(port)
    return json.loads(results.read_text()), out + err


@pytest.mark.slow
def test_a_small_run_prints_its_quote(tmp_path: Path, seeded_cache: Callable[[str], Path]) -> None:
    """The run profiles every board afresh (its cache holds the server's weights and relation vector only,
    built once per test run: tests/conftest.py seeded_cache) and prints, to the digit, the round-1 table
    an earlier run of this code printed on this CPU. Exact floats twice from empty caches:
    tests/test_fl_server.py::
    test_the_server_side_runs_rounds_writes_results_after_each_and_a_seeded_run_repeats_its_numbers."""
    run, printed = _run(tmp_path, "run", seeded_cache(SMALL_RUN))
    assert run["run"]["config"]["model"] == "cnn-tiny"
    # the string syntax read as Flower documents it ("0" and '8,16': tests/test_launcher.py's reader tests)
    assert run["run"]["config"]["relation-seeds"] == "0" and run["run"]["config"]["batch-sizes"] == "8,16"
    assert RelationVector.from_dict(run["run"]["relation"]).batch_sizes == (8, 16)
    clients = run["rounds"][0]["clients"]
    assert clients and all(c[k] is not None for c in clients for k in NUMBERS)
    assert all(c["profiling_choice"] and not c["profile_cached"] for c in clients)
    page = QUOTED.read_text(encoding="utf-8")
    quoted = quotes(page, "make run NODES=2", "[round 1] clients", _round_one_table)
    check_against_quotes(_round_one_table(printed), QUOTED.relative_to(ROOT), quoted)
