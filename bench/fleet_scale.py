"""How a fleet run grows with the fleet: wall time and peak memory per round, Flower's dispatch and ours.

The fleet runner in scale mode (predicted profiles, stand-in clients), so the framework is measured, not
training; the growth exponent k fits log(value) = k·log(boards) + c. Results: docs/results/fleets.md.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import ROOT, TreeMemory, ints

from simulations.fleet import load_fleet_spec
from simulations.local_superlink import free_port
from simulations.runner import run_fleet

FLEET = """\
name: scale-{n}
groups:
  - {{device: sim:jetson-nano, power-cap-w: 3.0, count: {a}}}
  - {{device: sim:jetson-nano, power-cap-w: none, count: {b}}}
  - {{device: sim:jetson-tx2nx, power-cap-w: 4.5, count: {c}}}
  - {{device: sim:jetson-tx2nx, power-cap-w: 3.5, count: {d}}}
task: {{model: cnn-tiny, target: "{target}", target-accuracy: 0.7, batch-sizes: [8, 16, 32]}}
rounds: {rounds}
seeds: {{relation: [0, 1, 2]}}
budget: {{samples: 2000}}
scale: {{profiles: predicted, real-share: 0.0}}
population: {{clients-per-round: {per_round}}}
methods: [ours]
"""
ROUND_END = re.compile(r"^round (\d+) evaluation")


def run_size(
    n: int, rounds: int, out: Path, index: bool, per_round: int = 0, target: str = "synthetic-image"
) -> list[dict[str, Any]]:
    """One run of `n` boards (`per_round` of them sampled each round; 0: all); its rows per round."""
    a = n // 4
    fleet = out / f"fleet-{n}-{per_round}.yaml"
    out.mkdir(parents=True, exist_ok=True)
    text = FLEET.format(n=n, a=n - 3 * a, b=a, c=a, d=a, rounds=rounds, per_round=per_round, target=target)
    fleet.write_text(text)
    port = free_port()
    marks: list[tuple[float, str]] = []

    def echo(line: str) -> None:
        marks.append((time.perf_counter(), line))

    sampler = TreeMemory(port, every_s=0.25)
    sampler.start()
    try:
        spec = load_fleet_spec(fleet)
        run = out / f"run-{n}-{per_round}-{'indexed' if index else 'flower'}"
        run_fleet(spec, run, ["ours"], echo=echo, plots=False, port=port, index_messages=index)
    finally:
        sampler.stop.set()
        sampler.join()
    start = next(t for t, line in marks if line.startswith("relation vector r_b"))  # rounds start next
    rows, last = [], start
    for t, line in marks:
        m = ROUND_END.match(line)
        if m:
            window = [s for s in sampler.samples if last <= s[0] <= t]
            tree, largest = (max((s[i] for s in window), default=0) / 2**20 for i in (1, 2))
            rows.append(dict(boards=per_round or n, population=n, dispatch="indexed" if index else "flower",
                             round=int(m.group(1)), wall_s=t - last, peak_tree_mib=tree,
                             peak_process_mib=largest))  # fmt: skip
            last = t
    return rows


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    """k of the least-squares fit log(y) = k·log(x) + c."""
    return float(np.polyfit(np.log(xs), np.log(ys), 1)[0])


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'boards':>7} {'of':>7} {'dispatch':>8} {'round':>5} {'wall s':>8} {'ms/board':>8} "
        f"{'peak tree MiB':>14} {'largest MiB':>12}"
    )
    print("\n" + head)
    for r in rows:
        print(
            f"{r['boards']:>7} {r['population']:>7} {r['dispatch']:>8} {r['round']:>5} {r['wall_s']:>8.1f} "
            f"{1000 * r['wall_s'] / r['boards']:>8.1f} {r['peak_tree_mib']:>14.0f} "
            f"{r['peak_process_mib']:>12.0f}"
        )
    whole: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)  # every board, no population
    for r in rows:
        if r["population"] == r["boards"]:
            whole[r["dispatch"], r["round"]].append(r)
    for (dispatch, rnd), sel in sorted(whole.items()):
        if len(sel) < 2:
            continue
        xs = [r["boards"] for r in sel]
        k_t = fit_exponent(xs, [r["wall_s"] for r in sel])
        k_m = fit_exponent(xs, [r["peak_tree_mib"] for r in sel])
        print(
            f"{dispatch} dispatch, round {rnd}: wall time grows as boards^{k_t:.2f}, peak memory of the "
            f"tree as boards^{k_m:.2f} (1.00 = linear; sizes {', '.join(map(str, xs))})"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=ints, default="100,1000,10000")
    p.add_argument(
        "--before-sizes",
        type=ints,
        help="sizes run with Flower's own dispatch (default: 100 and 1000 where --sizes has them)",
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--target",
        default="synthetic-image",
        help="the clients' data (synthetic-image: 5,000 samples, at most 2,500 boards; beyond, npz:PATH)",
    )
    p.add_argument("--population", type=int, default=0, help="also a population of this many boards ...")
    p.add_argument("--per-round", type=int, default=0, help="... sampling this many a round (indexed)")
    p.add_argument(
        "--population-before", action="store_true", help="run the population with Flower's own dispatch first"
    )
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "fleet-scale")
    args = p.parse_args()
    sizes: list[int] = args.sizes
    before = [n for n in (100, 1000) if n in sizes] if args.before_sizes is None else args.before_sizes
    plan = [
        (n, 0, index, f"{n} boards", " (Ray start included)")
        for n in sorted(set(sizes) | set(before))
        for index in ([False] if n in before else []) + ([True] if n in sizes else [])
    ]
    if args.population:
        population = f"population {args.population}, {args.per_round} a round"
        indexes = ([False] if args.population_before else []) + [True]
        plan += [(args.population, args.per_round, index, population, "") for index in indexes]
    rows: list[dict[str, Any]] = []
    for n, per_round, index, what, note in plan:
        started = time.perf_counter()
        rows += run_size(n, args.rounds, args.out, index, per_round, args.target)
        took = time.perf_counter() - started
        dispatch = "indexed" if index else "flower"
        print(f"{what}, {dispatch} dispatch: {took:.0f} s for the whole run{note}", flush=True)
    print_table(rows)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the run's processes were stopped by the runner on the way out
        print("fleet_scale: interrupted; the run's processes were stopped", file=sys.stderr)
        sys.exit(130)
