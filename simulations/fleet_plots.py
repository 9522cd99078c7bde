"""Plots of measured runs (matplotlib on Agg, no pyplot state): the demo's strategies.png; a fleet run's,
from its results dict: time_to_accuracy.png and makespan.png (round 1 per board and cap: summary.png);
over seeds, seed-ratios.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from powerctl.cli.plot import MARKERS, colour, new_figure, save_figure, short_number
from powerctl.selection.methods import method_named


def plot_time_to_accuracy(results: dict[str, Any], path: Path) -> Path:
    """The global model's accuracy against the fleet's cumulative makespan, per method."""
    fig = new_figure(7.5, 4.5)
    ax = fig.add_subplot()
    target = results["fleet"]["target_accuracy"]
    for s in results["summary"]:
        xs = list(np.cumsum(s["makespans_s"]))
        ys = [a if a is not None else np.nan for a in s["accuracy"]]
        label = s["method"] + (
            f" ({s['time_to_target_s']:.1f} s)" if s["time_to_target_s"] else " (not reached)"
        )
        ax.plot(
            [0.0, *xs],
            [np.nan, *ys],
            marker=MARKERS.get(s["method"], "o"),
            color=colour(s["method"]),
            label=label,
        )
    ax.axhline(target, color="black", ls=":", lw=1, label=f"target {target:.0%}")
    ax.set_xlim(left=0)
    ax.set_xlabel("fleet device seconds (summed round makespans, profiling included); a point per round")
    ax.set_ylabel("global model accuracy (clients' test splits)")
    ax.set_title(f"time to accuracy per method — fleet {results['fleet']['name']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def plot_makespans(results: dict[str, Any], path: Path) -> Path:
    """Every round's makespan per method."""
    summaries = results["summary"]
    rounds = max((len(s["makespans_s"]) for s in summaries), default=0)
    fig = new_figure(max(6.0, 1.2 * rounds + 4), 4.2)
    ax = fig.add_subplot()
    x = np.arange(1, rounds + 1)
    width = 0.8 / max(len(summaries), 1)
    for k, s in enumerate(summaries):
        spans = s["makespans_s"] + [np.nan] * (rounds - len(s["makespans_s"]))
        ax.bar(x - 0.4 + width * (k + 0.5), spans, width, color=colour(s["method"]), label=s["method"])
    ax.set_xticks(x)
    ax.set_xlabel("round")
    ax.set_ylabel("makespan: slowest client's device s\n(profiling included)")
    ax.set_title("round makespan per method")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def plot_fleet(results: dict[str, Any], out: Path) -> list[Path]:
    """The fleet run's plots into `out` (its summary.png is `summary_figure.fleet_figure`'s)."""
    return [
        plot_time_to_accuracy(results, out / "time_to_accuracy.png"),
        plot_makespans(results, out / "makespan.png"),
    ]


RATIO_PANELS = [
    ("per board:\nspeed-up to its own target", "board", "speedup"),
    ("fleet:\nspeed-up to the global target", "fleet", "speedup"),
    ("fleet:\nenergy ratio, all rounds", "energy", "ratio"),
]
"""The seed-ratios plot's panels: a title, and where a method's summary keeps its ratio stats."""


def plot_seed_ratios(results: dict[str, Any], path: Path) -> Path:
    """A run over seeds: one panel per ratio (per board speed-up, fleet speed-up, energy), per method a
    point per seed (its ratio to the state of practice), the mean and its 95 % interval."""
    methods = [m for m in results["summary"] if m["method"] != results["reference"]]
    fig = new_figure(max(9.0, 1.3 * len(methods) * len(RATIO_PANELS) + 2), 4.6)
    axes = fig.subplots(1, len(RATIO_PANELS), sharey=False)
    for ax, (title, section, key) in zip(axes, RATIO_PANELS, strict=True):
        for x, m in enumerate(methods):
            stats = m[section][key]
            if not stats or stats["mean"] is None:
                ax.text(x, 1.0, "no pairs", ha="center", va="bottom", fontsize=7)
                continue
            ratios = [s["ratio"] for s in stats["per_seed"]]
            spread = np.linspace(-0.15, 0.15, len(ratios)) if len(ratios) > 1 else [0.0]
            ax.scatter(x + np.asarray(spread), ratios, s=18, color=colour(m["method"]), alpha=0.7, zorder=3)
            lo, hi = stats["interval"]
            ax.errorbar(
                x + 0.3,
                stats["mean"],
                yerr=[[stats["mean"] - lo], [hi - stats["mean"]]],
                fmt=MARKERS.get(m["method"], "o"),
                color=colour(m["method"]),
                capsize=4,
                zorder=3,
            )
        ax.axhline(1.0, color="black", ls=":", lw=1)
        ax.set_xticks(range(len(methods)), [m["method"] for m in methods], fontsize=8)
        ax.set_xlim(-0.6, len(methods) - 0.3)
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("ratio to state-of-practice\n(a point per seed; mean and 95 % interval)")
    fig.suptitle(
        f"fleet {results['fleet']['name']}: {len(results['seeds']) - len(results['failed_seeds'])} seeds "
        "(speed-up > 1: faster; energy < 1: less)",
        fontsize=10,
    )
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)


def plot_strategies(
    rows: list[dict[str, Any]], path: Path, *, title: str, target_accuracy: float | None = None
) -> Path:
    """The demo's: left, measured device seconds to the target per strategy; right, the accuracy curves."""
    fig = new_figure(12, 4.5)
    bars, curves = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.4]})
    names = [r["strategy"] for r in rows]
    secs = [r["device_s"] for r in rows]
    labels = [
        f"{short_number(r['device_s'])} s\nb={r['batch_size']}, {r['frequency_hz'] / 1e6:.0f} MHz"
        + ("" if r["reached"] else "\nnot reached")
        for r in rows
    ]
    bars.bar_label(bars.bar(names, secs, color=[colour(n) for n in names]), labels, padding=2, fontsize=8)
    bars.set_ylabel("device seconds to target accuracy")
    bars.set_ylim(0, max(secs) * 1.3)
    bars.tick_params(axis="x", labelrotation=15)
    bars.set_title("time to accuracy (measured)")
    seen: dict[tuple[int, int], str] = {}
    # the oracle last, dashed on top
    for r in sorted(rows, key=lambda r: method_named(r["strategy"]).searches_own_data):
        pair = (r["batch_size"], r["frequency_hz"])
        same = f", same run as {seen[pair]}" if pair in seen else ""
        seen.setdefault(pair, r["strategy"])
        curves.plot(
            [p["device_s"] for p in r["curve"]],
            [p["accuracy"] for p in r["curve"]],
            label=f"{r['strategy']} (b={r['batch_size']}, {r['frequency_hz'] / 1e6:.0f} MHz{same})",
            color=colour(r["strategy"]),
            lw=1.8,
            ls="--" if same else "-",
            alpha=0.9,
        )
    if target_accuracy:
        curves.axhline(target_accuracy, color="black", ls=":", lw=1, label=f"target {target_accuracy:.0%}")
    curves.set_xlabel("device seconds")
    curves.set_ylabel("test accuracy")
    curves.set_title("accuracy against device time")
    curves.grid(alpha=0.3)
    curves.legend(fontsize=8, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)
