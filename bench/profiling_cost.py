"""What profiling costs, and what a cheaper order loses: grid vs efficient vs fitted, on simulated boards.

Each order's choice (Algorithm 1) is scored against the full grid's on the same seed; `grid again` is the
noise floor. What the columns mean: docs/results/profiling_cost.md.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from bench_common import ints, mean_std, names, predicted_s, workload_of

from powerctl.devices.simulated import SimulatedBoard
from powerctl.errors import InfeasibleCapError
from powerctl.profiling.profiler import FITTED_MARGIN, Profiler
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.records.workload import Workload
from powerctl.selection.joint import select

BATCH_SIZES = [4, 8, 16, 32, 64, 128]
NOMINAL_TARGET = 0.5
"""The relation vectors' target accuracy (a RelationVector needs one; only the shape is used)."""
CAPS_W = {"jetson-nano": (3.0, 4.0, 5.0), "jetson-tx2nx": (3.5, 5.0, 6.5)}
"""The paper tables' two caps per board (bench/paper_tables.py) and one higher."""
REMEASURE_SEED = 1000
"""`grid again`: the grid measured once more with other noise (seed + this)."""
ROWS = ("grid", "grid again", "efficient", "fitted")
WARMUP_STEPS, MEASURE_STEPS = 1, 2
"""The run config's `profile-warmup` and `profile-steps` defaults."""
SHAPES = {
    "text": {4: 1.0, 8: 1.205, 16: 1.282, 32: 1.359, 64: 1.615, 128: 2.128},
    "vision": {4: 1.818, 8: 1.455, 16: 1.0, 32: 1.0, 64: 1.409, 128: 2.091},
}
"""Mean samples to the target over 3 (text) / 5 (vision) seeds per batch size, over the fewest:
bench/paper_tables.py's runs on Austen (Emma) and CIFAR-10-C blur+fog."""
MODEL_SHAPE = {"resnet18": "vision", "mobilenetv2": "vision", "chartransformer": "text"}
PAPER = "paper: profiling costs 1.9-6 % of training (real boards)"


def _noop_step(batch_size: int) -> Callable[[], None]:
    return lambda: None


def relation_for(model: str, samples_to_target: float) -> RelationVector:
    """bench/paper_tables.py's shape for the model's task (vision for a model not named), scaled so the
    best batch size needs `samples_to_target` samples."""
    kind = MODEL_SHAPE.get(model, "vision")
    scaled = {b: s * samples_to_target for b, s in SHAPES[kind].items()}
    return RelationVector.from_samples(model, f"paper_tables:{kind}", NOMINAL_TARGET, scaled)


def profile_board(
    dev: SimulatedBoard,
    workload: Workload,
    order: str,
    cap: float | None,
    relation: RelationVector,
    margin: float = FITTED_MARGIN,
) -> Profile:
    """`dev` profiled in `order` with no-op steps (the board charges the model's cost): the cap is the
    order's (none for the grid), the relation and margin the fitted order's."""
    samples = round(relation.samples_to_target[-1])
    profiler = Profiler(
        dev, workload, _noop_step, samples=samples, warmup_steps=WARMUP_STEPS, measure_steps=MEASURE_STEPS
    )
    cap, fit = (cap if order != "grid" else None), (relation.as_map() if order == "fitted" else None)
    return profiler.run(
        BATCH_SIZES, order=order, power_cap_w=cap, relation=fit, margin=margin, progress=False
    )


def run(
    models: list[str], seeds: list[int], samples_to_target: float, margin: float, noise: bool = True
) -> list[dict[str, Any]]:
    rows = []
    for model in models:
        workload = workload_of(model)
        relation = relation_for(model, samples_to_target)
        r = relation.as_map()
        for board in CAPS_W:
            opened = functools.partial(SimulatedBoard.open, board, noise=noise)
            grids = {
                s: profile_board(opened(seed=s), workload, "grid", None, relation, margin) for s in seeds
            }
            for cap in CAPS_W[board]:
                for seed in seeds:
                    grid = grids[seed]
                    try:
                        best = select(grid, relation, cap)
                    except InfeasibleCapError:
                        continue
                    for order in ROWS:
                        prof = grid
                        if order != "grid":  # "grid again": the grid once more, with other noise
                            dev = opened(seed=seed + (REMEASURE_SEED if order == "grid again" else 0))
                            kind = order.removesuffix(" again")
                            prof = profile_board(dev, workload, kind, cap, relation, margin)
                        choice = select(prof, relation, cap)
                        on_grid = grid.point(choice.batch_size, choice.frequency_hz)
                        assert on_grid is not None
                        train_s = on_grid.seconds_for_samples * r[choice.batch_size]
                        device_s, over = prof.profiling_s or 0.0, on_grid.peak_power_w > cap
                        rows.append(
                            dict(model=model, board=board, cap=cap, seed=seed, order=order,
                                 points=len(prof.points), device_s=device_s, train_s=train_s,
                                 share=device_s / train_s, regret=train_s / predicted_s(best), over=over,
                                 choice=f"{choice.batch_size}@{choice.frequency_hz / 1e6:.1f}")
                        )  # fmt: skip
    return rows


def report(rows: list[dict[str, Any]]) -> None:
    groups: dict[tuple[str, str, float, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["model"], row["board"], row["cap"], row["order"]].append(row)
    print(
        "| model | board | cap | order | points | device s | train s | share | regret mean (max) | choices |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (model, board, cap, order), rs in groups.items():
        regrets = [r["regret"] for r in rs]
        choices = sorted({r["choice"] for r in rs})
        over = sum(r["over"] for r in rs)
        device_s = " ± ".join(format(v, ".0f") for v in mean_std([r["device_s"] for r in rs]))
        print(
            f"| {model} | {board.removeprefix('jetson-')} | {cap:g} W | {order} "
            f"| {statistics.mean(r['points'] for r in rs):.1f} | {device_s} "
            f"| {statistics.mean(r['train_s'] for r in rs):.0f} "
            f"| {100 * statistics.mean(r['share'] for r in rs):.2f} % "
            f"| {statistics.mean(regrets):.3f} ({max(regrets):.3f}) "
            f"| {', '.join(choices)}{f' ({over} over the cap on the grid)' if over else ''} |"
        )
    print("\nsummary over every model, board and cap (mean over cells; worst cell):")
    for order in ROWS:
        rs = [r for r in rows if r["order"] == order]
        if not rs:
            continue
        exact = sum(r["regret"] <= 1.0 + 1e-12 for r in rs)
        regrets = [r["regret"] for r in rs]
        print(
            f"  {order:<10} points {statistics.mean(r['points'] for r in rs):5.1f}  "
            f"share {100 * statistics.mean(r['share'] for r in rs):5.2f} % "
            f"(max {100 * max(r['share'] for r in rs):5.2f} %)  "
            f"regret mean {statistics.mean(regrets):.4f} max {max(regrets):.3f}  "
            f"zero regret in {exact}/{len(rs)} runs"
        )
    print(f"  ({PAPER}; target of the fitted order: ≤ 1 % at zero regret)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=names, default="resnet18,mobilenetv2,chartransformer")
    p.add_argument("--seeds", type=ints, default="0,1,2,3,4")
    p.add_argument("--samples-to-target", type=float, default=250_000.0)
    p.add_argument("--margin", type=float, default=FITTED_MARGIN, help="the fitted order's confirm margin")
    p.add_argument(
        "--no-noise", action="store_true", help="noise-free boards: what the fit and confirm step lose alone"
    )
    args = p.parse_args(argv)
    models, seeds = args.models, args.seeds
    start = time.perf_counter()
    print(
        f"models {models}, boards {list(CAPS_W)}, batch sizes {BATCH_SIZES}, seeds {seeds}; "
        f"{WARMUP_STEPS} warm-up + {MEASURE_STEPS} measured steps per point; no-op step on the simulated "
        f"board (it charges the full model's cost); best batch size needs {args.samples_to_target:g} samples "
        f"to the target (relation shapes from bench/paper_tables.py); fitted margin {args.margin:g}\n"
    )
    if args.no_noise:
        seeds = seeds[:1]  # every seed measures the same
        print("noise-free boards (--no-noise): one seed\n")
    report(run(models, seeds, args.samples_to_target, args.margin, noise=not args.no_noise))
    print(f"\n({time.perf_counter() - start:.0f} s wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
