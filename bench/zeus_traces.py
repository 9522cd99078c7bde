"""The relation vector and Algorithm 1 on real measurements no one here produced: the Zeus NSDI'23 traces.

Per workload and GPU: epochs to target per run (the train file) and time per epoch and average power per
(batch size, power limit) (a power file); the knob is the power limit. How: docs/results/zeus_traces.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from powerctl.cli.util import power_cap
from powerctl.errors import InfeasibleCapError, PowerctlError
from powerctl.records.profile import Profile, ProfilePoint
from powerctl.records.relation import RELATION_RULES, RelationVector
from powerctl.selection.baselines import oracle
from powerctl.selection.joint import best_frequency_per_batch, select
from simulations.intervals import SEED, interval95, resampled_means

TRAIN_COLUMNS = ("dataset", "network", "batch_size", "optimizer", "run", "target_metric", "target_epoch")
POWER_COLUMNS = (*TRAIN_COLUMNS[:4], "power_limit", "time_per_epoch", "average_power")
OTHER_WORKLOAD = {"squad": "sentiment140", "sentiment140": "squad"}
"""The BERT pair: each is the other's proxy (same network, another data source)."""
DEFAULT_CAPS: tuple[float | None, ...] = (150.0, 200.0, None)


class TraceError(PowerctlError):
    """A trace file that cannot be used (missing columns, bad numbers, no workload in common)."""


@dataclass(frozen=True)
class Workload:
    dataset: str
    network: str
    optimizer: str

    @property
    def name(self) -> str:
        return f"{self.dataset}/{self.network}"


# --- reading ------------------------------------------------------------------------------------------------


def _rows(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in columns if c not in (reader.fieldnames or [])]
            if missing:
                raise TraceError(
                    f"{path}: missing column(s) {', '.join(missing)}; expected {', '.join(columns)}"
                )
            rows = list(reader)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text CSV file") from None
    if not rows:
        raise TraceError(f"{path}: no rows")
    return rows


def _numbers(row: dict[str, str], path: Path, line: int, *columns: str) -> list[float]:
    out = []
    for c in columns:
        try:
            out.append(float(row[c]))
        except ValueError:
            raise TraceError(f"{path}, line {line}: {c} {row[c]!r} is not a number") from None
    return out


def read_train(path: Path) -> dict[Workload, dict[str, dict[int, dict[int, float]]]]:
    """workload → target metric → batch size → run → epochs to that target (nan: not reached)."""
    out: dict[Workload, dict[str, dict[int, dict[int, float]]]] = defaultdict(
        lambda: defaultdict(lambda: defaultdict(dict))
    )
    for i, r in enumerate(_rows(path, TRAIN_COLUMNS), start=2):
        w = Workload(r["dataset"], r["network"], r["optimizer"])
        b, run, epochs = _numbers(r, path, i, "batch_size", "run", "target_epoch")
        out[w][r["target_metric"]][int(b)][int(run)] = epochs
    return out


def read_power(path: Path) -> dict[Workload, dict[tuple[int, float], tuple[float, float]]]:
    """workload → (batch size, power limit W) → (seconds per epoch, average power W)."""
    out: dict[Workload, dict[tuple[int, float], tuple[float, float]]] = defaultdict(dict)
    for i, r in enumerate(_rows(path, POWER_COLUMNS), start=2):
        w = Workload(r["dataset"], r["network"], r["optimizer"])
        b, pl, tpe, watts = _numbers(r, path, i, "batch_size", *POWER_COLUMNS[4:])
        if not (tpe > 0 and watts > 0 and pl > 0) or not all(map(math.isfinite, (tpe, watts, pl))):
            raise TraceError(f"{path}, line {i}: power limit, time per epoch and power must be > 0")
        out[w][(int(b), pl)] = (tpe, watts)
    return out


# --- the pieces ---------------------------------------------------------------------------------------------


def choose_target(per_target: dict[str, dict[int, dict[int, float]]], batch_sizes: list[int]) -> str | None:
    """The most demanding target (most mean epochs) that every batch size reaches in every run."""
    epochs = {
        metric: [e for b in batch_sizes for e in per_b[b].values()]
        for metric, per_b in per_target.items()
        if all(b in per_b for b in batch_sizes)
    }
    reached = [m for m, values in epochs.items() if values and all(map(math.isfinite, values))]
    return max(reached, key=lambda m: statistics.fmean(epochs[m]), default=None)


def profile_of(
    w: Workload, gpu: str, table: dict[tuple[int, float], tuple[float, float]], batch_sizes: list[int]
) -> Profile:
    """The GPU's (b, power limit) table as a profile: N = one epoch, `frequency_hz` carries the limit in W,
    the peak is the limit or the average where that is above it (a peak is never under its mean); the
    epoch's seconds stand in for a step's (nothing here reads them)."""
    points = [
        ProfilePoint(b, int(pl), max(pl, watts), watts, tpe, tpe)
        for (b, pl), (tpe, watts) in sorted(table.items())
        if b in batch_sizes
    ]
    return Profile(device=gpu, model=w.name, input_shape=[], samples=1, points=points)


def _cost(point: ProfilePoint, epochs: float, objective: str) -> float:
    seconds = epochs * point.seconds_for_samples
    return seconds * point.mean_power_w if objective == "energy" else seconds


def ratio_interval(
    ours: ProfilePoint, fastest: ProfilePoint, truth: dict[int, list[float]], objective: str
) -> tuple[float, float]:
    """Bootstrap 95 % interval of ours / fastest over the truth seeds (each batch size's runs
    resampled with replacement; one draw per batch size, shared when both pick the same b)."""
    rng = np.random.default_rng(SEED)
    means = {b: resampled_means(truth[b], rng) for b in sorted({ours.batch_size, fastest.batch_size})}
    ours_cost = _cost(ours, 1.0, objective) * means[ours.batch_size]
    return interval95(ours_cost / (_cost(fastest, 1.0, objective) * means[fastest.batch_size]))


def cells_for(
    w: Workload, gpu: str, profile: Profile, proxy: RelationVector, proxy_name: str,
    truth: dict[int, list[float]], caps: tuple[float | None, ...], rule: str,
) -> list[dict[str, Any]]:  # fmt: skip
    truth_rel = RelationVector.from_seeds(w.name, "truth", 1.0, dict(truth))
    mean = truth_rel.samples_map()
    out = []
    for objective in ("time", "energy"):
        for cap in caps:
            cell: dict[str, Any] = {"gpu": gpu, "workload": w.name, "proxy": proxy_name, "cap_w": cap,
                                    "objective": objective, "rule": rule}  # fmt: skip
            try:
                pick = select(profile, proxy, cap, objective, rule)
                best = (
                    oracle(profile, truth_rel, cap)
                    if objective == "time"
                    else select(profile, truth_rel, cap, "energy", "mean")
                )
            except InfeasibleCapError as exc:
                cell["error"] = str(exc)
                out.append(cell)
                continue
            ours_p = profile.point(pick.batch_size, pick.frequency_hz)
            fast_p = profile.point(best.batch_size, best.frequency_hz)
            assert ours_p is not None and fast_p is not None
            ours_v = _cost(ours_p, mean[ours_p.batch_size], objective)
            fast_v = _cost(fast_p, mean[fast_p.batch_size], objective)
            lo, hi = ratio_interval(ours_p, fast_p, truth, objective)
            # the state of practice: the largest batch size at the highest limit under the cap
            sop = best_frequency_per_batch(profile, cap).get(max(profile.batch_sizes()))
            sop_v = None if sop is None else _cost(sop, mean[sop.batch_size], objective)
            cell.update({
                "ours_batch_size": ours_p.batch_size, "ours_power_limit_w": float(ours_p.frequency_hz),
                "ours": ours_v,
                "fastest_batch_size": fast_p.batch_size, "fastest_power_limit_w": float(fast_p.frequency_hz),
                "fastest": fast_v, "ours_over_fastest": ours_v / fast_v, "ci95": [lo, hi],
                "indistinguishable": lo <= 1.0 <= hi,
                "sop_batch_size": None if sop is None else sop.batch_size,
                "sop_power_limit_w": None if sop is None else float(sop.frequency_hz),
                "sop_over_ours": None if sop_v is None else sop_v / ours_v,
            })  # fmt: skip
            out.append(cell)
    return out


def run(
    train_path: Path, power_paths: list[Path], *, proxy_seeds: int = 2,
    caps: tuple[float | None, ...] = DEFAULT_CAPS, rule: str = "mean",
) -> tuple[list[dict[str, Any]], list[str]]:  # fmt: skip
    """Every cell for every power file; and the notes (left-out batch sizes, workloads without a target)."""
    train = read_train(train_path)
    cells: list[dict[str, Any]] = []
    notes: list[str] = []
    for power_path in power_paths:
        power = read_power(power_path)
        gpu = power_path.stem.removeprefix("summary_power_")
        common = [w for w in train if w in power]
        if not common:
            raise TraceError(
                f"{power_path}: no workload (dataset, network, optimizer) in common with {train_path}"
            )
        for w in sorted(common, key=lambda w: w.name):
            per_target = train[w]
            measured = {b for b, _ in power[w]}
            runs_per_b: Counter[int] = Counter()  # per batch size, the most runs of any target (a union)
            for per_b in per_target.values():
                runs_per_b |= Counter({b: len(runs) for b, runs in per_b.items()})
            kept = sorted(b for b in measured if runs_per_b.get(b, 0) >= proxy_seeds + 2)
            dropped = sorted((set(runs_per_b) | measured) - set(kept))
            if dropped:
                notes.append(f"{gpu} {w.name}: batch sizes {dropped} left out (not in both files, or fewer "
                             f"than {proxy_seeds + 2} runs)")  # fmt: skip
            metric = choose_target(per_target, kept)
            if metric is None or len(kept) < 2:
                notes.append(f"{gpu} {w.name}: no target every kept batch size reaches in every run; skipped")
                continue
            profile = profile_of(w, gpu, power[w], kept)
            per_b = per_target[metric]
            held = {b: [per_b[b][r] for r in sorted(per_b[b])[:proxy_seeds]] for b in kept}
            truth = {b: [per_b[b][r] for r in sorted(per_b[b])[proxy_seeds:]] for b in kept}
            held_out = RelationVector.from_seeds(w.name, "held-out seeds", 1.0, dict(held))
            proxies = [(f"held-out seeds (target {metric})", held_out)]
            other = next((o for o in train if o.dataset == OTHER_WORKLOAD.get(w.dataset)), None)
            if other is not None:
                other_kept = [b for b in kept if b in next(iter(train[other].values()))]
                other_metric = choose_target(train[other], other_kept)
                if other_metric is not None and len(other_kept) >= 2:
                    o = train[other][other_metric]
                    proxy = RelationVector.from_seeds(
                        w.name, other.name, 1.0, {b: [o[b][r] for r in sorted(o[b])] for b in other_kept}
                    )
                    proxies.append((f"{other.dataset} (target {other_metric})", proxy))
                else:
                    notes.append(f"{gpu} {w.name}: {other.name} shares too few batch sizes to be its proxy")
            for name, proxy in proxies:
                cells += cells_for(w, gpu, profile, proxy, name, truth, caps, rule)
    return cells, notes


# --- output -------------------------------------------------------------------------------------------------


def _cap(cap: float | None) -> str:
    return "none" if cap is None else f"{cap:g} W"


def print_cells(cells: list[dict[str, Any]], notes: list[str]) -> None:
    for objective in ("time", "energy"):
        unit = "s" if objective == "time" else "J"
        power = " x average power" if objective == "energy" else ""
        print(f"\n{objective} to the target (measured: epochs x time per epoch{power})")
        print(f"{'gpu':<5} {'workload':<31} {'proxy':<34} {'cap':>6}  {'ours b@W':>10} {'fastest b@W':>11} "
              f"{'ours/fastest [95 %]':>24}  {'sop/ours':>8}")  # fmt: skip
        for c in cells:
            if c["objective"] != objective:
                continue
            head = f"{c['gpu']:<5} {c['workload']:<31} {c['proxy'][:34]:<34} {_cap(c['cap_w']):>6}"
            if "error" in c:
                print(f"{head}  infeasible: {c['error']}")
                continue
            lo, hi = c["ci95"]
            mark = "" if c["indistinguishable"] else " *"
            sop = "-" if c["sop_over_ours"] is None else f"{c['sop_over_ours']:.2f}x"
            print(
                f"{head}  {c['ours_batch_size']:>5}@{c['ours_power_limit_w']:<4.0f} "
                f"{c['fastest_batch_size']:>6}@{c['fastest_power_limit_w']:<4.0f} "
                f"{c['ours_over_fastest']:>7.3f}x [{lo:.3f}, {hi:.3f}]{mark:<2} {sop:>8}"
                f"   ({c['ours']:.0f} vs {c['fastest']:.0f} {unit})"
            )
    done = [c for c in cells if "error" not in c]
    for objective in ("time", "energy"):
        these = [c for c in done if c["objective"] == objective]
        if these:
            worst = max(these, key=lambda c: c["ours_over_fastest"])
            print(
                f"\n{objective}: {len(these)} cells; ours = fastest's batch size in "
                f"{sum(c['ours_batch_size'] == c['fastest_batch_size'] for c in these)}, within 1.05x in "
                f"{sum(c['ours_over_fastest'] <= 1.05 for c in these)}, interval includes 1.0 in "
                f"{sum(c['indistinguishable'] for c in these)}; worst {worst['ours_over_fastest']:.3f}x "
                f"({worst['gpu']} {worst['workload']}, {worst['proxy']}, cap {_cap(worst['cap_w'])})"
            )
    print("(* = the interval excludes 1.0: ours is measurably slower than the fastest)")
    for note in notes:
        print(f"note: {note}")


def _caps(text: str) -> tuple[float | None, ...]:
    return tuple(power_cap(part) for part in text.split(","))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", type=Path, required=True, help="summary_train.csv (epochs to target per run)")
    p.add_argument("--power", type=Path, nargs="+", action="extend", required=True,
                   help="summary_power_GPU.csv files (one per GPU): list them or repeat --power")  # fmt: skip
    p.add_argument("--json", type=Path, help="write the cells as a JSON list here")
    p.add_argument("--proxy-seeds", type=int, default=2, help="runs per batch size held apart as the proxy")
    p.add_argument("--caps", type=_caps, default=DEFAULT_CAPS, help="watts, comma-separated; 'none' = no cap")
    p.add_argument(
        "--relation-rule", choices=RELATION_RULES, default="mean", help="selection rule (powerctl)"
    )
    args = p.parse_args(argv)
    if args.proxy_seeds < 1:
        p.error("--proxy-seeds must be ≥ 1")
    try:
        cells, notes = run(args.train, args.power, proxy_seeds=args.proxy_seeds, caps=args.caps,
                           rule=args.relation_rule)  # fmt: skip
    except PowerctlError as exc:
        print(f"zeus_traces: error: {exc}", file=sys.stderr)
        return 1
    print_cells(cells, notes)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(cells, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
