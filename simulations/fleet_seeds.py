"""A fleet over seeds (`--seeds N`): every seed's rows and, per method, the summary paired by seed with the
state of practice (`simulations.fleet-seeds/2`, docs/howto/fleets.md#seeds); DEFINITIONS say each figure."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_server.results import cell, profiling_share
from simulations.fleet import FleetSpec
from simulations.fleet_results import (
    cap_cell,
    fleet_block,
    headline,
    processes,
    ratio,
    reference_method,
    some,
    table,
)
from simulations.intervals import DRAWS, SEED, mean_interval95

SEEDS_SCHEMA = "simulations.fleet-seeds/2"
DEFINITIONS = {
    "seeds": "seed K (1..N) runs the fleet with run seed = seeds.run + K - 1 and data seed = seeds.data + "
    "K - 1 (the clients' training, their data and partition, a population's draws); the pre-training, "
    "proxy and relation seeds are the file's, so every seed starts from the same cached weights and "
    "relation vector",
    "board_to_own_target_s": "a board's time to its own target, round 1: its profiling seconds plus its "
    "fine-tuning seconds until its own evaluation crossed the target; a board that did not reach it (or "
    "failed) is counted, not averaged in",
    "fleet_to_target_s": "the fleet's time to the global target: the summed round makespans through the "
    "first round after which the global model reached it (each seed's time_to_target_s)",
    "ratios": "paired by seed with state-of-practice: speed-up = its seconds / the method's (per board and "
    "seed; per seed for the fleet), energy = the method's joules / its (per seed, all rounds); mean: of "
    "one value per seed (per board: the seed's geometric mean over its boards); 95 % interval: "
    f"percentile bootstrap of that mean, seeds resampled with replacement ({DRAWS} draws, seed {SEED}); "
    "geo mean: of every ratio (per board: over boards and seeds); unpaired: pairs without both values",
    "averaged_model": "round 1, the seeds in which every client of the method reached its own target: in "
    "how many the averaged model's evaluation (the round's global model on the clients' test splits) was "
    "still under the target, and the mean batch size the clients chose in those seeds and in the others",
    "failed_seed": "a seed whose run failed (the ServerApp stopped, or its results miss a method) is "
    "reported with its reason and log, and left out of the summary",
}


@dataclass
class SeedRun:
    """One seed of a run over seeds: its seeds, how long it took, and its results or why it failed."""

    seed: int  # K, 1-based: its folder is DIR/seed-K
    run_seed: int
    data_seed: int
    folder: Path
    prepared_cached: bool  # the pre-trained weights and relation vector were cached before it started
    wall_s: float = 0.0
    results: dict[str, Any] | None = None
    error: str | None = None  # the one-line reason it failed (None: it ran)
    pids: list[int] = field(default_factory=list)  # a failed seed's processes (one that ran: in its results)

    @property
    def ok(self) -> bool:
        return self.results is not None

    def row(self) -> dict[str, Any]:
        """Its entry in results.json's `seeds`."""
        head = dict(seed=self.seed, run_seed=self.run_seed, data_seed=self.data_seed, folder=str(self.folder),
                    status="ok" if self.ok else "failed", wall_s=self.wall_s,
                    prepared_cached=self.prepared_cached)  # fmt: skip
        if self.results is None:
            log = str(self.folder / "flwr.log")
            return head | {"reason": self.error, "log": log, "processes": processes(self.pids)}
        return head | {"summary": self.results["summary"], "boards": board_rows(self.results)}


BOARD_FIELDS = ("power_cap_w", "reached_target", "profiling_s", "fine_tuning_s", "to_own_target_s", "failed")
"""A board row's fields after its method, node key and device (`board_rows`)."""


def board_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Per method and board of round 1: its time to its own target (None: not reached) or failure."""

    def board(r: dict[str, Any], *values: Any) -> dict[str, Any]:
        who = {"method": r["method"], "node_key": r["node_key"], "device": r["device"]}
        return who | dict(zip(BOARD_FIELDS, values, strict=True))

    rows = []
    for r in (r for r in results["records"] if r["round"] == 1):
        reached, prof, tune = bool(r["reached_target"]), r["profiling_s"], r["device_s"]
        rows.append(board(r, r["power_cap_w"], reached, prof, tune, prof + tune if reached else None, None))
    failed = [f for f in results["failures"] if f["round"] == 1]
    return rows + [board(f, None, False, None, None, None, f"{f['kind']}: {f['reason']}") for f in failed]


def cell_label(row: dict[str, Any]) -> str:
    """A board's cell of the fleet's grid: its device and power cap."""
    return f"{row['device']}@{cap_cell(row['power_cap_w'])}"


def ratio_stats(per_seed: dict[int, list[float]], unpaired: int) -> dict[str, Any]:
    """Ratios by seed: each seed's geometric mean, their mean and its bootstrap 95 % interval, and the
    geometric mean of every ratio."""
    seeds = {k: v for k, v in sorted(per_seed.items()) if v}
    values = [statistics.geometric_mean(v) for v in seeds.values()]
    every = [x for v in seeds.values() for x in v]
    mean = statistics.fmean(values) if values else None
    return {
        "pairs": len(every),
        "unpaired": unpaired,
        "per_seed": [{"seed": k, "ratio": r} for k, r in zip(seeds, values, strict=True)],
        "mean": mean,
        "interval": list(mean_interval95(values)) if values else None,
        "geomean": statistics.geometric_mean(every) if every else None,
    }


def averaged_model(method: str, target: float, runs: list[SeedRun]) -> dict[str, Any]:
    """Where every client reached its own target in round 1: did the averaged model too, and with
    which batch sizes (DEFINITIONS["averaged_model"])?"""
    all_reached, missed, sizes_missed, sizes_met = [], [], [], []
    for run in runs:
        assert run.results is not None
        mine = [r for r in run.results["records"] if r["method"] == method and r["round"] == 1]
        failed = [f for f in run.results["failures"] if f["method"] == method and f["round"] == 1]
        if not mine or failed or not all(r["reached_target"] for r in mine):
            continue
        all_reached.append(run.seed)
        evaluated = run.results.get("evaluations", {}).get(method) or []
        accuracy = next((e.get("accuracy") for e in evaluated if e["round"] == 1), None)
        sizes = [r["batch_size"] for r in mine if r.get("batch_size") is not None]
        if accuracy is not None and accuracy < target:
            missed.append(run.seed)
            sizes_missed += sizes
        else:
            sizes_met += sizes
    return {
        "seeds_all_at_target": len(all_reached),
        "missed": [f"seed {k}" for k in missed],
        "batch_size_missed": statistics.fmean(sizes_missed) if sizes_missed else None,
        "batch_size_met": statistics.fmean(sizes_met) if sizes_met else None,
    }


def board_speedups(
    rows: list[dict[str, Any]],
    method: str,
    reference: str,
    seconds: Callable[[dict[str, Any]], float | None] = lambda r: r["to_own_target_s"],
) -> tuple[list[tuple[dict[str, Any], float]], int]:
    """Each of `method`'s board rows (one seed's) with its speed-up over the same board under
    `reference` (its time to its own target / `seconds(row)`), and how many are unpaired."""
    theirs = {r["node_key"]: r for r in rows if r["method"] == reference}
    mine = [r for r in rows if r["method"] == method]
    paired, unpaired = [], 0
    for r in mine:
        other = theirs.get(r["node_key"])
        x = ratio(other["to_own_target_s"] if other else None, seconds(r), speedup=True)
        if x is None:
            unpaired += 1
        else:
            paired.append((r, x))
    return paired, unpaired + len(set(theirs) - {r["node_key"] for r in mine})


def method_over_seeds(method: str, sop: str | None, runs: list[SeedRun], target: float) -> dict[str, Any]:
    """One method's summary over the seeds that ran, paired with `sop` by seed."""
    boards: list[tuple[int, dict[str, Any]]] = []
    fleet: dict[int, dict[str, Any]] = {}
    ratios: dict[str, dict[int, list[float]]] = {"board": {}, "fleet": {}, "energy": {}}  # by seed
    unpaired = dict.fromkeys(ratios, 0)
    cells: dict[str, dict[int, list[float]]] = {}
    for run in runs:
        assert run.results is not None
        rows = board_rows(run.results)
        mine = [r for r in rows if r["method"] == method]
        boards += [(run.seed, r) for r in mine]
        rows_by = {s["method"]: s for s in run.results["summary"]}
        fleet[run.seed] = rows_by[method]
        if sop is None or method == sop:
            continue
        labels = {r["node_key"]: cell_label(r) for r in rows if r["failed"] is None}
        paired, missing = board_speedups(rows, method, sop)
        unpaired["board"] += missing
        ratios["board"][run.seed] = [x for _, x in paired]
        for r, x in paired:
            cells.setdefault(labels[r["node_key"]], {}).setdefault(run.seed, []).append(x)
        ref = rows_by[sop]
        for key, name, speedup in (("fleet", "time_to_target_s", True), ("energy", "energy_j", False)):
            value = ratio(ref[name], rows_by[method][name], speedup=speedup)
            if value is None:
                unpaired[key] += 1
            else:
                ratios[key][run.seed] = [value]
    at_target = [(k, r) for k, r in boards if r["to_own_target_s"] is not None]
    reached = {k: s["time_to_target_s"] for k, s in fleet.items() if s["time_to_target_s"] is not None}
    compared = sop is not None and method != sop
    stats = {k: ratio_stats(by_seed, unpaired[k]) if compared else None for k, by_seed in ratios.items()}
    return {
        "method": method,
        "seeds": len(runs),
        "board": {
            "runs": len(boards),
            "at_target": len(at_target),
            "not_at_target": [
                f"seed {k} {r['node_key']}" + (f" (failed: {r['failed']})" if r["failed"] else "")
                for k, r in boards
                if r["to_own_target_s"] is None
            ],
            "mean_s": statistics.fmean(r["to_own_target_s"] for _, r in at_target) if at_target else None,
            "speedup": stats["board"],
            "profiling_share": profiling_share([r for _, r in at_target], "fine_tuning_s"),
            "cells": {
                label: ratio_stats(by_seed, len(runs) - len(by_seed))
                | {
                    "profiling_share": profiling_share(
                        [r for _, r in at_target if cell_label(r) == label], "fine_tuning_s"
                    )
                }
                for label, by_seed in sorted(cells.items())
            }
            if compared
            else None,
        },
        "fleet": {
            "reached": len(reached),
            "not_reached": [f"seed {k}" for k in fleet if k not in reached],
            "mean_s": statistics.fmean(reached.values()) if reached else None,
            "speedup": stats["fleet"],
        },
        "energy": {
            "mean_j": statistics.fmean(s["energy_j"] for s in fleet.values()) if fleet else None,
            "ratio": stats["energy"],
        },
        "averaged_model": averaged_model(method, target, runs),
    }


def build_seed_results(
    spec: FleetSpec, methods: list[str], runs: list[SeedRun], *, wall_s: float
) -> dict[str, Any]:
    """results.json of a run over seeds: every seed's rows, and the summary over those that ran."""
    ran, sop, run = [r for r in runs if r.ok], reference_method(methods), spec.settings
    rule = dict(count=len(runs), run=run.seed, data=run.client_data_seed, pretrain=run.pretrain_seed,
                proxy=run.proxy_seed, relation=list(run.relation_seeds))  # fmt: skip
    return {
        "schema": SEEDS_SCHEMA,
        "fleet": fleet_block(spec),
        "methods": methods,
        "seed_rule": rule,
        "definitions": DEFINITIONS,
        "seeds": [r.row() for r in runs],
        "failed_seeds": [r.seed for r in runs if not r.ok],
        "reference": sop,
        "summary": [method_over_seeds(m, sop, ran, run.target_accuracy) for m in methods] if ran else [],
        "wall_s": wall_s,
    }


STATS_HEAD = f"{'95 % interval':>18}  {'geo mean':>8}  {'unpaired':>8}"


def _stats_cells(stats: dict[str, Any] | None, unit: str) -> str:
    if stats is None or stats["mean"] is None:
        unpaired = "-" if stats is None else str(stats["unpaired"])
        return f"{'-':>9}  {'-':>18}  {'-':>8}  {unpaired:>8}"
    lo, hi = stats["interval"]
    interval = f"[{lo:.2f}{unit}, {hi:.2f}{unit}]"
    geo = f"{stats['geomean']:.2f}{unit}"
    return f"{stats['mean']:>8.2f}{unit}  {interval:>18}  {geo:>8}  {stats['unpaired']:>8}"


def cells_table(summary: list[dict[str, Any]], reference: str | None) -> list[str]:
    """Per method and cell of the grid: the speed-up to each board's own target over the state of
    practice, paired by seed, and the profiling share."""
    head = f"{'cell':<26} {'seeds':>5} {'speed-up':>9}  {STATS_HEAD}  {'prof %':>6}"
    lines: list[str] = []
    for m in summary:
        b = m["board"]
        if not b.get("cells"):
            continue
        title = f"per cell: {m['method']} against {reference}, time to each board's own target, round 1"
        rows = [
            f"{label:<26} {len(stats['per_seed']):>5} {_stats_cells(stats, 'x')}  "
            f"{cell(stats['profiling_share'], '.1%'):>6}"
            for label, stats in b["cells"].items()
        ]
        lines += ["", title, *table(head, rows)]
        if (share := b["profiling_share"]) is not None:
            lines.append(f"{'all cells':<26} profiling {share:.1%} of fine-tuning (summed)")
    return lines


METHOD_TABLES = (
    ("per board: time to its own target, round 1", "at target", "mean s", "speed-up"),
    ("fleet: time to the global target", "reached", "mean s", "speed-up"),
    ("fleet: energy, all rounds", "", "mean J", "energy"),
)
"""The tables of every method in the summary: a title, and the heads of their count, mean and ratio."""


def _method_rows(m: dict[str, Any]) -> list[str]:
    """A method's row in each of METHOD_TABLES: its count, mean and ratio stats."""
    b, f, e = m["board"], m["fleet"], m["energy"]
    columns = [
        (f"{b['at_target']}/{b['runs']}", cell(b["mean_s"], ".2f"), b["speedup"], "x"),
        (f"{f['reached']}/{m['seeds']}", cell(f["mean_s"], ".2f"), f["speedup"], "x"),
        ("", cell(e["mean_j"], ".1f"), e["ratio"], ""),
    ]
    return [
        f"{m['method']:<18} {m['seeds']:>5} {count:>10} {mean:>9} {_stats_cells(stats, unit)}"
        for count, mean, stats, unit in columns
    ]


def seeds_summary_text(results: dict[str, Any]) -> str:
    """The table printed at the end of a run over seeds (DIR/summary.txt)."""
    rule, failed = results["seed_rule"], results["failed_seeds"]
    ran = len(results["seeds"]) - len(failed)
    lines = [
        headline(results["fleet"], f" over {rule['count']} seeds ({ran} ran, {len(failed)} failed)"),
        f"seed K: run seed {rule['run']} + K - 1, data seed {rule['data']} + K - 1; pre-training "
        f"{rule['pretrain']}, proxy {rule['proxy']} and relation {rule['relation']} seeds the file's",
    ]
    for s in results["seeds"]:
        where = f"seed {s['seed']} (run {s['run_seed']}, data {s['data_seed']})"
        if s["status"] == "ok":
            cached = "cached" if s["prepared_cached"] else "prepared by this seed"
            lines.append(
                f"  {where}: ran in {s['wall_s']:.0f} s (weights and relation vector {cached}): {s['folder']}"
            )
        else:
            lines.append(f"  {where}: FAILED, excluded from the summary: {s['reason']} (log: {s['log']})")
    summary = results["summary"]
    if not summary:
        lines.append("no seed ran: nothing to summarise")
        return "\n".join(lines)

    method_rows = [_method_rows(m) for m in summary]
    for k, (title, *heads) in enumerate(METHOD_TABLES):
        head = f"{'method':<18} {'seeds':>5} {heads[0]:>10} {heads[1]:>9} {heads[2]:>9}  {STATS_HEAD}"
        lines += ["", title, *table(head, [rows[k] for rows in method_rows])]
        if k == 0:  # the per-board table, then its cells
            lines += cells_table(summary, results["reference"])
    for m in summary:
        if missed := m["board"]["not_at_target"]:
            lines.append(f"{m['method']}: not at its own target in round 1: {some(missed)}")
        if missed := m["fleet"]["not_reached"]:
            lines.append(f"{m['method']}: the fleet did not reach the global target in {some(missed)}")
    lines += ["", "round 1's averaged model, in the seeds where every client reached its own target:"]
    for m in summary:
        a = m["averaged_model"]
        lines.append(
            f"  {m['method']}: under the target in {len(a['missed'])} of {a['seeds_all_at_target']}"
            + (f" ({some(a['missed'])})" if a["missed"] else "")
            + f"; mean batch size {cell(a['batch_size_missed'])} where it missed, {cell(a['batch_size_met'])}"
            " where it reached it"
        )
    d = results["definitions"]
    ref = results["reference"]
    lines += [
        "",
        f"per board: {d['board_to_own_target_s']}.",
        f"fleet: {d['fleet_to_target_s']}; energy: every client's, all rounds.",
        f"ratios: {d['ratios']}."
        if ref
        else "no state-of-practice among the methods: no ratios (add it to --methods).",
        f"averaged model: {d['averaged_model']}.",
        f"failed seeds: {d['failed_seed']}.",
    ]
    return "\n".join(lines)
