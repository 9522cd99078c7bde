"""What a fleet's per-board verdict would be if a method's profiling cost nothing (against a bar).

Arithmetic on a finished run over seeds (RUN/results.json of `python -m simulations run FLEET --seeds N`):
each board's time to its own target less the method's profiling seconds where chosen, the speed-up over the
reference summarised by the runner's own `ratio_stats`. Exit status 0, or 2 on bad input.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from powerctl.cli.util import OneLineParser
from powerctl.errors import FileFormatError
from powerctl.files.jsonfile import read_json
from simulations.fleet_seeds import SEEDS_SCHEMA, board_speedups, ratio_stats

Board = dict[str, Any]
WITHOUT: dict[str, Callable[[Board], bool]] = {
    "as run": lambda _row: False,
    "without profiling uncapped": lambda row: row["power_cap_w"] is None,
    "without profiling anywhere": lambda _row: True,
}
"""What each line takes the profiling out of."""


def speedups(results: dict[str, Any], method: str, drop: Callable[[Board], bool]) -> dict[int, list[float]]:
    """Per seed that ran, each board's speed-up of `method` over the run's reference method
    (`simulations.fleet_seeds.board_speedups`, as the run's summary pairs them), the method's profiling
    seconds left out where `drop(row)`."""

    def seconds(row: Board) -> float | None:
        total = row["to_own_target_s"]
        return None if total is None else total - (row["profiling_s"] if drop(row) else 0.0)

    return {
        seed["seed"]: [
            ratio for _, ratio in board_speedups(seed["boards"], method, results["reference"], seconds)[0]
        ]
        for seed in results["seeds"]
        if seed["status"] == "ok"
    }


def load(path: Path, method: str) -> dict[str, Any]:
    """A run over seeds' results.json, checked for what the arithmetic reads (FileFormatError: one line)."""
    results = read_json(path, SEEDS_SCHEMA)
    if method not in results["methods"] or not results.get("reference") or method == results["reference"]:
        raise FileFormatError(
            f"{path}: method {method!r} is not one of the run's methods other than its reference "
            f"{results.get('reference')!r} (methods: {', '.join(results['methods'])})"
        )
    return results


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="bench/fleet_without_profiling.py", description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path, help="RUN/results.json of a run over seeds")
    p.add_argument("--method", default="ours", help="whose profiling is taken out (default: ours)")
    args = p.parse_args(argv)
    try:
        results = load(args.results, args.method)
    except FileFormatError as exc:
        print(f"bench/fleet_without_profiling.py: {exc}", file=sys.stderr)
        return 2
    ref = results["reference"]
    print(f"{args.method} against {ref}, per board, round 1 (speed-up = {ref}'s seconds / the method's):")
    for label, drop in WITHOUT.items():
        stats = ratio_stats(speedups(results, args.method, drop), unpaired=0)
        if stats["mean"] is None:
            print(f"  {label:<28} no board has both times")
            continue
        low, high = stats["interval"]
        print(f"  {label:<28} {stats['mean']:.3f}x [{low:.3f}, {high:.3f}]  ({stats['pairs']} boards)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
