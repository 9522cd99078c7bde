"""Plots of measured runs: time to accuracy per strategy, and accuracy against device seconds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from powerctl.cli.plot import save_figure, short_number
from powerctl.selection.methods import method_named

COLOURS = {"ours": "#1b9e77", "state-of-practice": "#d95f02", "proxy-batch": "#7570b3", "oracle": "#666666"}


def plot_strategies(
    rows: list[dict[str, Any]], path: Path, *, title: str, target_accuracy: float | None = None
) -> Path:
    """Left: measured device seconds to the target per strategy. Right: the accuracy curves."""
    fig = Figure(figsize=(12, 4.5))
    FigureCanvasAgg(fig)
    bars, curves = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.4]})
    names = [r["strategy"] for r in rows]
    secs = [r["device_s"] for r in rows]
    colours = [COLOURS.get(n, "#999999") for n in names]
    drawn = bars.bar(names, secs, color=colours)
    for rect, r in zip(drawn, rows, strict=True):
        label = f"{short_number(r['device_s'])} s\nb={r['batch_size']}, {r['frequency_hz'] / 1e6:.0f} MHz"
        if not r["reached"]:
            label += "\nnot reached"
        bars.annotate(
            label,
            (rect.get_x() + rect.get_width() / 2, rect.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
            xytext=(0, 2),
            textcoords="offset points",
        )
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
        xs = [p["device_s"] for p in r["curve"]]
        ys = [p["accuracy"] for p in r["curve"]]
        curves.plot(
            xs,
            ys,
            label=f"{r['strategy']} (b={r['batch_size']}, {r['frequency_hz'] / 1e6:.0f} MHz{same})",
            color=COLOURS.get(r["strategy"], "#999999"),
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
