"""bench/fleet_without_profiling.py: issue 40's bar against a finished run over seeds, with a method's
profiling taken out where asked — the same numbers as the run's own summary when nothing is taken out."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from simulations.fleet_seeds import SEEDS_SCHEMA, ratio_stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import fleet_without_profiling as bench  # noqa: E402


def board(method: str, node: str, cap: float | None, profiling_s: float, tuning_s: float) -> dict[str, Any]:
    return {
        "method": method,
        "node_key": node,
        "device": "sim:jetson-nano",
        "power_cap_w": cap,
        "reached_target": True,
        "profiling_s": profiling_s,
        "fine_tuning_s": tuning_s,
        "to_own_target_s": profiling_s + tuning_s,
        "failed": None,
    }


def run_over_seeds() -> dict[str, Any]:
    """Two seeds of a capped board (ours 1 s profiling + 9 s, the state of practice 12 s) and an
    uncapped one (ours 1 + 10 s, the state of practice 10 s); a third seed failed."""

    def seed(k: int, extra: float) -> dict[str, Any]:
        return {
            "seed": k,
            "status": "ok",
            "boards": [
                board("ours", "p0", 3.0, 1.0, 9.0 + extra),
                board("state-of-practice", "p0", 3.0, 0.0, 12.0 + extra),
                board("ours", "p1", None, 1.0, 10.0 + extra),
                board("state-of-practice", "p1", None, 0.0, 10.0 + extra),
            ],
        }

    failed = {"seed": 3, "status": "failed", "reason": "the ServerApp stopped"}
    return {
        "schema": SEEDS_SCHEMA,
        "methods": ["ours", "state-of-practice"],
        "reference": "state-of-practice",
        "seeds": [seed(1, 0.0), seed(2, 1.0), failed],
    }


def test_as_run_is_the_summary_and_taking_profiling_out_raises_only_the_cells_asked() -> None:
    results = run_over_seeds()
    as_run = bench.speedups(results, "ours", bench.WITHOUT["as run"])
    assert as_run == {1: [12 / 10, 10 / 11], 2: [13 / 11, 11 / 12]}  # the failed seed is left out
    uncapped = bench.speedups(results, "ours", bench.WITHOUT["without profiling uncapped"])
    assert uncapped == {1: [12 / 10, 1.0], 2: [13 / 11, 1.0]}
    anywhere = bench.speedups(results, "ours", bench.WITHOUT["without profiling anywhere"])
    assert anywhere == {1: [12 / 9, 1.0], 2: [13 / 10, 1.0]}
    means = [ratio_stats(s, unpaired=0)["mean"] for s in (as_run, uncapped, anywhere)]
    assert means[0] < means[1] < means[2]


def test_it_prints_one_line_per_case_and_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps(run_over_seeds()))
    assert bench.main([str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[1].strip() for line in lines[1:]] == list(bench.WITHOUT)
    assert all("(4 boards)" in line for line in lines[1:])

    for bad, says in [
        (tmp_path / "missing.json", "no such file"),
        (tmp_path / "seed.json", f"expected {SEEDS_SCHEMA!r}"),
    ]:
        if bad.name == "seed.json":
            bad.write_text(json.dumps({"schema": "simulations.fleet-results/1"}))
        assert bench.main([str(bad)]) == 2
        err = capsys.readouterr().err
        assert says in err and err.count("\n") == 1
    assert bench.main([str(path), "--method", "state-of-practice"]) == 2
    assert "other than its reference" in capsys.readouterr().err
