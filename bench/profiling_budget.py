"""Profiling that pays for itself: time to the target INCLUDING profiling, per way of profiling.

On simulated boards (as modelled and off-model): the efficient and fitted orders, the budgeted client
(`profile_within_budget`) and the state of practice. Columns: docs/results/profiling_budget.md.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from bench_common import ints, names, workload_of
from profiling_cost import (
    BATCH_SIZES,
    CAPS_W,
    MEASURE_STEPS,
    WARMUP_STEPS,
    _noop_step,
    profile_board,
    relation_for,
)

from powerctl.devices.boards import board_model
from powerctl.devices.simulated import SimulatedBoard, predicted_profile
from powerctl.errors import InfeasibleCapError
from powerctl.profiling.budget import ProfilingRequest, confirmed_in_training, profile_within_budget
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.records.workload import Workload
from powerctl.selection.baselines import board_fixed_frequency
from powerctl.selection.confirm import NothingConfirmed, TrainingConfirmation
from powerctl.selection.joint import select
from powerfed.training.finetune import POWER_RATE_HZ, TrainingPower

WAYS = ("efficient", "fitted", "budgeted", "state-of-practice")
VARIANTS = ("as modelled", "off-model")


def _confirmed(
    dev: SimulatedBoard, workload: Workload, cap: float, rel: RelationVector, profile: Profile
) -> tuple[int, int, tuple[float, float]]:
    """The predicted way's confirmation as the client's training runs it: (b, Hz it ends at, (device
    seconds of its steps, the share of the way to the target those steps trained))."""
    first = select(profile, rel, cap)
    r, n = rel.as_map(), profile.samples
    with dev.pinned(first.frequency_hz):
        confirm = TrainingConfirmation(
            dev, profile, lambda p: select(p, rel, cap), cap, first,
            warmup_steps=WARMUP_STEPS, measure_steps=MEASURE_STEPS,
        )  # fmt: skip
        power = TrainingPower(dev, POWER_RATE_HZ)
        power.resume()
        seconds = share = 0.0
        b = first.batch_size
        while not confirm.confirmed:
            b = confirm.before_step(0) or b
            t0 = dev.clock()
            dev.run_step(lambda: None, batch_size=b, workload=workload)
            seconds += dev.clock() - t0
            share += b / (r[b] * n)
            power.after_step([confirm], seconds)
        power.pause()
    return confirm.batch_size, confirm.frequency_hz, (seconds, share)


def _row(
    cell: dict[str, Any], way: str, share: float | None, profiling_s: float, b: int, hz: int, how: str,
    confirmation: tuple[float, float] = (0.0, 0.0),
) -> dict[str, Any]:  # fmt: skip
    """One way's row; `confirmation`: (seconds, share of the way to the target) trained by the steps
    that confirmed the pair in training, the rest trained at (b, hz)."""
    truth: Profile = cell["truth"]
    point = truth.point(b, hz)
    assert point is not None
    cap = cell["cap"]
    confirm_s, trained = confirmation
    return {k: v for k, v in cell.items() if k not in ("truth", "r", "scale")} | {
        "way": way,
        "share": share,
        "profiling_s": profiling_s,
        "train_s": confirm_s + max(0.0, 1.0 - trained) * point.seconds_for_samples * cell["r"][b],
        "over": cap is not None and point.peak_power_w * cell["scale"] > cap,
        "choice": f"{b}@{hz / 1e6:.0f}",
        "how": how,
    }


def _cell_rows(
    cell: dict[str, Any], workload: Workload, rel: RelationVector, shares: list[float], sop_hz: int
) -> list[dict[str, Any]]:
    cap, truth = cell["cap"], cell["truth"]
    fresh = functools.partial(
        SimulatedBoard.open, cell["board"], seed=cell["seed"], power_scale=cell["scale"]
    )
    b_max = max(truth.batch_sizes())
    rows = [_row(cell, "state-of-practice", None, 0.0, b_max, sop_hz, "")]
    order = "efficient" if cap is not None else "grid"
    runs: list[tuple[str, float | None, Profile, str]] = [
        ("efficient", None, profile_board(fresh(), workload, order, cap, rel), ""),
        ("fitted", None, profile_board(fresh(), workload, "fitted", cap, rel), ""),
    ]
    for share in shares:  # a client with `profiling-budget` share, the board model's profile its prediction
        request = ProfilingRequest(
            order=order, order_cap_w=cap, batch_sizes=BATCH_SIZES, samples=round(rel.samples_to_target[-1]),
            power_cap_w=cap, relation=rel, share=share, warmup_steps=WARMUP_STEPS,
            measure_steps=MEASURE_STEPS,
        )  # fmt: skip
        prof, plan = profile_within_budget(
            fresh(), workload, _noop_step, request, prediction=truth, predicted_from="the board model"
        )
        runs.append(("budgeted", share, prof, plan.choice))
    for way, way_share, prof, how in runs:
        try:
            sel = select(prof, rel, cap)
            b, hz, confirmation = sel.batch_size, sel.frequency_hz, (0.0, 0.0)
            if cap is not None and confirmed_in_training(prof):
                b, hz, confirmation = _confirmed(fresh(), workload, cap, rel, prof)
        except (InfeasibleCapError, NothingConfirmed):
            continue
        rows.append(_row(cell, way, way_share, prof.profiling_s or 0.0, b, hz, how, confirmation))
    return rows


def run(
    models: list[str], seeds: list[int], tasks: dict[str, float], shares: list[float], off_model: float
) -> list[dict[str, Any]]:
    rows = []
    for model in models:
        workload = workload_of(model)
        for task, samples in tasks.items():
            rel = relation_for(model, samples)
            n = round(rel.samples_to_target[-1])
            for board in CAPS_W:
                truth = predicted_profile(board, workload, BATCH_SIZES, n)  # noise-free, as modelled
                for cap in (*CAPS_W[board], None):
                    try:
                        sop_hz = board_fixed_frequency(board_model(board), cap)
                    except InfeasibleCapError:
                        continue
                    for variant, scale in zip(VARIANTS, (1.0, off_model), strict=True):
                        for seed in seeds:
                            cell = dict(model=model, task=task, board=board, cap=cap, variant=variant,
                                        seed=seed, truth=truth, r=rel.as_map(), scale=scale)  # fmt: skip
                            rows += _cell_rows(cell, workload, rel, shares, sop_hz)
    for row in rows:
        row["total_s"] = row["profiling_s"] + row["train_s"]
    return rows


CellKey = tuple[str, str, str, float | None, str]
"""(model, task, board, cap, variant): one cell of the tables."""
Ways = dict[str, list[dict[str, Any]]]


def _cells(rows: list[dict[str, Any]], share: float) -> Iterator[tuple[CellKey, Ways, dict[str, float]]]:
    """The cells where all four ways ran (budgeted at `share`): their rows and mean times over seeds."""
    cells: dict[CellKey, Ways] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["way"] != "budgeted" or row["share"] == share:
            cells[row["model"], row["task"], row["board"], row["cap"], row["variant"]][row["way"]].append(row)
    for key, ways in cells.items():
        if len(ways) == len(WAYS):
            yield key, ways, {w: statistics.mean(r["total_s"] for r in rs) for w, rs in ways.items()}


def _outside_spread(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    """Whether two ways' mean times differ by more than twice the standard error of the difference over
    the seeds (a gap that is not the sensor and time noise of the seeds)."""
    ta, tb = [r["total_s"] for r in a], [r["total_s"] for r in b]
    if len(ta) < 2 or len(tb) < 2:
        return True
    se = (statistics.variance(ta) / len(ta) + statistics.variance(tb) / len(tb)) ** 0.5
    return abs(statistics.mean(ta) - statistics.mean(tb)) > 2 * se


def summary(rows: list[dict[str, Any]], share: float) -> dict[str, dict[str, float]]:
    """Over the cells: how often budgeted is the slowest of the four, its time over the best way's
    (means over seeds per cell), and the cells where it is more than 1 % over the best — of those, how
    many by more than the seeds' spread — per task length."""
    out: dict[str, dict[str, float]] = {}
    for task in sorted({r["task"] for r in rows}):
        ratios, slowest, cells, beyond, real = [], 0, 0, 0, 0
        for key, ways, means in _cells(rows, share):
            if key[1] != task:
                continue
            cells += 1
            slowest += means["budgeted"] >= max(means.values()) - 1e-9
            best = min(means, key=lambda w: means[w])
            ratios.append(means["budgeted"] / means[best])
            if ratios[-1] > 1.01:
                beyond += 1
                real += _outside_spread(ways["budgeted"], ways[best])
        out[task] = dict(cells=cells, slowest=slowest, beyond=beyond, real=real)
        out[task] |= {"mean": statistics.mean(ratios), "max": max(ratios)}
    return out


def report(rows: list[dict[str, Any]], shares: list[float], default_share: float) -> None:
    print(
        f"Per cell (means over seeds; budgeted at profiling-budget {default_share:g}): time to the target "
        "INCLUDING profiling, simulated seconds; (prof %) = profiling / training; × best = the way's time / "
        "the fastest way's; budgeted's ways: eff = the efficient order (grid without a cap), fit = fitted, "
        "pred = the predicted profile's choice confirmed.\n"
    )
    print(
        "| model | task | board | cap | board kind | efficient s (prof %) | fitted s (prof %) "
        "| budgeted s (prof %) | budgeted's ways | state of practice s | budgeted × best | over |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (model, task, board, cap, variant), ways, means in _cells(rows, default_share):

        def fmt(way: str, ways: Ways = ways, means: dict[str, float] = means) -> str:
            share = statistics.mean(r["profiling_s"] / r["train_s"] for r in ways[way])
            return f"{means[way]:.0f} ({100 * share:.1f} %)"

        short = {"efficient": "eff", "grid": "eff", "fitted": "fit", "predicted": "pred"}
        hows = Counter(short[r["how"]] for r in ways["budgeted"])
        over = {w: sum(r["over"] for r in rs) for w, rs in ways.items() if any(r["over"] for r in rs)}
        cap_text = "none" if cap is None else f"{cap:g} W"
        print(
            f"| {model} | {task} | {board.removeprefix('jetson-')} | {cap_text} "
            f"| {variant} | {fmt('efficient')} | {fmt('fitted')} | {fmt('budgeted')} "
            f"| {', '.join(f'{k} {v}' for k, v in sorted(hows.items()))} "
            f"| {means['state-of-practice']:.0f} "
            f"| {means['budgeted'] / min(means.values()):.4f} "
            f"| {', '.join(f'{w} {n}' for w, n in over.items()) or '-'} |"
        )
    print(
        "\nSummary per profiling-budget (cells = model × board × cap × board kind; seeds averaged per cell):"
    )
    for share in shares:
        parts = [
            f"{task}: slowest of the four in {s['slowest']:.0f}/{s['cells']:.0f} cells, × best mean "
            f"{s['mean']:.4f} max {s['max']:.4f}, over 1 % in {s['beyond']:.0f} ({s['real']:.0f} outside "
            "the seeds' spread)"
            for task, s in summary(rows, share).items()
        ]
        print(f"  budget {share:>5.3f}: " + "; ".join(parts))
    print("\nOther ways, × best (mean, max over cells):")
    for way in ("efficient", "fitted", "state-of-practice"):
        parts = []
        for task in sorted({r["task"] for r in rows}):
            ratios = [m[way] / min(m.values()) for key, _, m in _cells(rows, default_share) if key[1] == task]
            parts.append(f"{task} {statistics.mean(ratios):.4f}, {max(ratios):.4f}")
        print(f"  {way:<18} " + "; ".join(parts))


def main(argv: list[str] | None = None) -> int:
    from strategies.settings import SETTINGS

    default_share = float(SETTINGS["profiling-budget"].default)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", type=names, default="resnet18-small,resnet18,mobilenetv2,chartransformer")
    p.add_argument("--seeds", type=ints, default="0,1,2,3,4")
    p.add_argument("--short", type=float, default=5_000.0, help="samples to the target, short task")
    p.add_argument("--long", type=float, default=250_000.0, help="samples to the target, long task")
    p.add_argument("--shares", default="0.003,0.01,0.03,0.1", help="profiling budgets to compare")
    p.add_argument("--budget", type=float, default=default_share, help="the profiling-budget the table shows")
    p.add_argument("--off-model", type=float, default=1.03, help="power drawn over the model's, off-model")
    args = p.parse_args(argv)
    models, seeds = args.models, args.seeds
    shares = sorted({float(s) for s in args.shares.split(",") if s} | {args.budget})
    start = time.perf_counter()
    print(
        f"models {models}, boards {list(CAPS_W)} (caps {dict(CAPS_W)} and none), batch sizes {BATCH_SIZES}, "
        f"seeds {seeds}; the best batch size needs {args.short:g} (short) or {args.long:g} (long) samples "
        f"(relation shapes from bench/paper_tables.py); {WARMUP_STEPS} warm-up + {MEASURE_STEPS} measured "
        f"steps per point; off-model boards draw {args.off_model:g}× their model's power; "
        "simulated seconds.\n"
    )
    rows = run(models, seeds, {"short": args.short, "long": args.long}, shares, args.off_model)
    report(rows, shares, args.budget)
    print(f"\n({time.perf_counter() - start:.0f} s wall)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
