"""Heat maps of a profile over (batch size, GPU frequency), the cap's boundary and the selected pair marked;
the Pareto front and a cap over time. Agg canvases, no pyplot state: the importer's backend stays."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import matplotlib
import numpy as np
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure, FigureBase
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from powerctl.errors import FileFormatError, InfeasibleCapError
from powerctl.files.jsonfile import write_json
from powerctl.files.outputs import plot_format, replacing
from powerctl.records.pick import Pick
from powerctl.records.profile import Profile, ProfilePoint
from powerctl.records.relation import RelationVector
from powerctl.selection.capsource import parse_power_cap
from powerctl.selection.joint import candidates, common_batch_sizes, select
from powerctl.selection.pareto import Front

SELECTION_GID = "selection"  # the star on the selected pair (tests and callers find it by its gid)
SELECTION_CELL_GID = "selection-cell"
BOUNDARY_GID = "cap-boundary"
_STAR_DX, _STAR_DY = 0.3, 0.22  # the star in the selected cell's upper-right corner (cell units)
_VEIL = 0.6  # the white over a cell over the cap: its value legible, the feasible region standing out
_CHAR_IN = 0.062  # about one character of an 8-point legend label, in inches (to fit legend rows)
_STAR: dict[str, Any] = {"ls": "none", "marker": "*", "markersize": 13, "markerfacecolor": "gold"}
_STAR |= {"markeredgecolor": "black", "markeredgewidth": 0.8, "zorder": 5, "gid": SELECTION_GID}
_MISSING_HATCH = "////"
_MISSING_EDGE = "0.72"
_BOUNDARY_COLOR = "#1565c0"  # blue: stands out on both the red power map and the viridis time maps
_BOUNDARY: dict[str, Any] = {"colors": _BOUNDARY_COLOR, "linewidths": 2.5, "capstyle": "projecting"}
_BOUNDARY["gid"] = BOUNDARY_GID
_CELLS: dict[str, Any] = {"origin": "lower", "aspect": "auto", "interpolation": "nearest"}
COLOURS = {"ours": "#1b9e77", "state-of-practice": "#d95f02", "proxy-batch": "#7570b3", "oracle": "#666666"}
MARKERS = {"ours": "*", "state-of-practice": "s", "proxy-batch": "^", "oracle": "o"}


def colour(method: str) -> str:
    """A method's colour in every plot."""
    return COLOURS.get(method, "#999999")


def new_figure(width: float, height: float, **kwargs: Any) -> Figure:
    """A figure on its own Agg canvas: no pyplot state, its importer's backend untouched."""
    fig = Figure(figsize=(width, height), **kwargs)
    FigureCanvasAgg(fig)
    return fig


@dataclass(frozen=True)
class _Grid:
    batch_sizes: list[int]
    frequencies_hz: list[int]
    points: dict[tuple[int, int], ProfilePoint]

    @classmethod
    def of(cls, profile: Profile) -> _Grid:
        points = {(p.batch_size, p.frequency_hz): p for p in profile.points}
        return cls(profile.batch_sizes(), profile.frequencies(), points)

    def values(self, f: Callable[[ProfilePoint], float]) -> np.ndarray:
        cells = [[self.points.get((b, hz)) for hz in self.frequencies_hz] for b in self.batch_sizes]
        values = [np.nan if p is None else f(p) for row in cells for p in row]
        return np.array(values, dtype=float).reshape(len(self.batch_sizes), len(self.frequencies_hz))


def short_number(v: float) -> str:
    """Three significant digits or so, without an exponent: cell values, bar labels."""
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


@dataclass(frozen=True)
class _Panel:
    """One heat map's title, colour bar label, cell value, colour map, cell text and log scale (over 5×);
    the defaults are a time map's."""

    title: str
    cbar_label: str
    value: Callable[[ProfilePoint], float]
    cmap: str = "viridis_r"
    fmt: Callable[[float], str] = short_number
    log: bool = True


def _heatmap(
    fig: FigureBase, grid: _Grid, panel: _Panel, *, cap: float | None, selection: Pick | None
) -> tuple[Axes, list[Artist]]:
    """One annotated heat map (rows: batch sizes, columns: MHz); its axes and legend handles."""
    ax = fig.add_subplot()
    values = grid.values(panel.value)
    colormap, norm = _colour_scale(fig, ax, values, panel)
    peak = grid.values(lambda p: p.peak_power_w)
    feasible = np.isfinite(peak) & ((peak <= cap) if cap is not None else True)
    infeasible = np.isfinite(peak) & ~feasible
    n_rows, n_cols = values.shape
    for i, j in np.ndindex(n_rows, n_cols):  # each value legible on its colour; missing hatched, over faded
        v = float(values[i, j])
        if not np.isfinite(v):
            _cell(ax, j, i, fill=False, hatch=_MISSING_HATCH, edgecolor=_MISSING_EDGE, lw=0)
            continue
        if infeasible[i, j]:  # faded: the feasible region reads at a glance, the value stays legible
            _cell(ax, j, i, facecolor="white", alpha=_VEIL, lw=0)
            color = "0.35"
        else:
            r, g, b, _ = colormap(norm(v))
            color = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
        ax.text(j, i, panel.fmt(v), ha="center", va="center", fontsize=7, color=color)
    handles: list[Artist] = []
    if np.isnan(values).any():
        handles.append(
            Patch(facecolor="white", hatch=_MISSING_HATCH, edgecolor=_MISSING_EDGE, label="not profiled")
        )
    if cap is not None:
        handles += _cap_boundary(ax, cap, feasible, infeasible)
        if infeasible.any():
            # the swatch is what such a cell looks like: its colour under the same white veil
            typical = colormap(norm(float(np.median(values[infeasible & np.isfinite(values)]))))
            r, g, b = (c * (1 - _VEIL) + _VEIL for c in typical[:3])
            handles.append(
                Patch(facecolor=(r, g, b), edgecolor="0.8", label="peak power over the cap (faded)")
            )
    if selection is not None:
        handles.append(_mark_selection(ax, grid, selection))
    ax.set_xticks(range(n_cols), [f"{hz / 1e6:.0f}" for hz in grid.frequencies_hz])
    ax.set_yticks(range(n_rows), [str(b) for b in grid.batch_sizes])
    ax.set_xlabel("GPU frequency (MHz)")
    ax.set_ylabel("batch size")
    ax.set_xlim(-0.5, n_cols - 0.5)
    ax.set_ylim(-0.5, n_rows - 0.5)
    ax.tick_params(length=0)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_title(panel.title, fontsize=11, loc="left")
    return ax, handles


def _colour_scale(fig: FigureBase, ax: Axes, values: np.ndarray, panel: _Panel) -> tuple[Any, Normalize]:
    """The cells' image and its colour bar; the colour map (missing cells see-through) and its norm."""
    n_rows, n_cols = values.shape
    finite = values[np.isfinite(values)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    if hi <= lo:
        hi = lo + 1.0
    norm = LogNorm(lo, hi) if panel.log and lo > 0 and hi / lo > 5 else Normalize(lo, hi)
    colormap = matplotlib.colormaps[panel.cmap].with_extremes(bad=(0, 0, 0, 0))  # missing cells: see-through
    extent = (-0.5, n_cols - 0.5, -0.5, n_rows - 0.5)
    im = ax.imshow(np.ma.masked_invalid(values), cmap=colormap, norm=norm, extent=extent, **_CELLS)
    cbar = fig.colorbar(im, ax=ax, pad=0.015, fraction=0.05)
    cbar.set_label(panel.cbar_label)
    if isinstance(norm, LogNorm):
        # Plain numbers (150, 200, 1000), not 2×10²: the cells are annotated the same way.
        cbar.ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        cbar.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        cbar.ax.yaxis.set_minor_formatter(NullFormatter())
    return colormap, norm


def _cell(ax: Axes, x: int, y: int, **style: Any) -> None:
    ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, **style))


def _cap_boundary(ax: Axes, cap: float, feasible: np.ndarray, infeasible: np.ndarray) -> list[Artist]:
    """The line between the cells under the cap and those over it; its legend handle (none: no line)."""
    n_rows, n_cols = feasible.shape
    segments = []
    for i, j in zip(*np.nonzero(feasible), strict=True):
        for di, dj in ((0, 1), (0, -1), (1, 0), (-1, 0)):  # the edge shared with each neighbour over the cap
            if 0 <= i + di < n_rows and 0 <= j + dj < n_cols and infeasible[i + di, j + dj]:
                x, y = j + dj / 2, i + di / 2
                segments.append([(x - abs(di) / 2, y - abs(dj) / 2), (x + abs(di) / 2, y + abs(dj) / 2)])
    if not segments:
        return []
    ax.add_collection(LineCollection(segments, **_BOUNDARY, zorder=4.5))  # over the selected cell's outline
    return [Line2D([], [], color=_BOUNDARY_COLOR, lw=2.5, label=f"cap boundary ({cap:.2f} W)")]


def _mark_selection(ax: Axes, grid: _Grid, selection: Pick) -> Artist:
    """The selected cell outlined, a star in its corner (its value stays readable); the star's handle."""
    key = (selection.batch_size, selection.frequency_hz)
    if key not in grid.points:
        raise FileFormatError(
            f"the selection (batch size {key[0]} at {key[1]} Hz) is not a profiled point of this profile"
        )
    x, y = grid.frequencies_hz.index(key[1]), grid.batch_sizes.index(key[0])
    _cell(ax, x, y, fill=False, edgecolor="black", lw=2.2, zorder=4, gid=SELECTION_CELL_GID)
    label = f"selected: b = {key[0]}, {key[1] / 1e6:.0f} MHz"
    (line,) = ax.plot([x + _STAR_DX], [y + _STAR_DY], **_STAR, label=label)
    return line


def _peak_panel(title: str) -> _Panel:
    return _Panel(title, "peak power (W)", lambda p: p.peak_power_w, "YlOrRd", "{:.1f}".format, log=False)


def _legend(fig: FigureBase, handles: list[Artist], width_in: float) -> None:
    """The legend under the plot, inside the layout: as many columns as fit in `width_in`, the rest wrap."""
    if not handles:
        return
    widths = [0.45 + _CHAR_IN * len(str(h.get_label())) for h in handles]
    room = width_in - 0.3
    fits = (n for n in range(len(handles), 1, -1) if sum(max(widths[c::n]) for c in range(n)) <= room)
    ncol = next(fits, 1)  # the most columns whose widest labels fit
    fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize=8, frameon=False)


def profile_figures(
    profile: Profile,
    *,
    power_cap_w: float | None = None,
    relation: RelationVector | None = None,
    selection: Pick | None = None,
) -> dict[str, Figure]:
    """The figures by file stem, unsaved; with a relation and no selection, Algorithm 1's (none feasible:
    no star, and the title says so)."""
    cap = parse_power_cap(power_cap_w, text=False)
    if selection is None and relation is not None:
        with contextlib.suppress(InfeasibleCapError):  # cmd_plot checked the pairing
            selection = select(profile, relation, cap, allow_mismatch=True)
    grid = _Grid.of(profile)
    subject = f"{profile.device} · {profile.model} ({'×'.join(str(s) for s in profile.input_shape)})"
    note = "" if cap is None or selection is not None or relation is None else " — no pair is feasible"
    cap_line = ("no power cap" if cap is None else f"power cap {cap:.2f} W") + note
    width, height = map_size(profile, min_height=3.6)
    t_n = f"Time for N = {profile.samples:,} samples $T_N(b, f)$ — {subject}\n{cap_line}"
    time_s = _Panel(t_n, "$T_N$ (s)", lambda p: p.seconds_for_samples)
    maps = [
        ("peak_power", grid, _peak_panel(f"Peak power $P(b, f)$ — {subject}\n{cap_line}"), selection),
        ("time", grid, time_s, selection),
    ]
    if relation is not None:
        r = relation.as_map()
        sub = _Grid(common_batch_sizes(profile, relation), grid.frequencies_hz, grid.points)
        title = (
            f"Predicted time to {relation.target_accuracy:.0%} accuracy $T_N \\cdot r_b$ — {subject}\n"
            f"{cap_line}; $r_b$ from {relation.proxy_dataset}"
        )
        panel = _Panel(title, "$T_N \\cdot r_b$ (s)", lambda p: p.seconds_for_samples * r[p.batch_size])
        marked = selection if selection is not None and selection.batch_size in r else None
        maps.append(("predicted_time_to_target", sub, panel, marked))
    figs: dict[str, Figure] = {}
    for stem, g, panel, marked in maps:
        fig = figs[stem] = new_figure(width, height, dpi=150, layout="constrained")
        _, handles = _heatmap(fig, g, panel, cap=cap, selection=marked)
        _legend(fig, handles, width)
    return figs


def plot_profile(
    profile: Profile,
    out_dir: str | Path,
    *,
    power_cap_w: float | None = None,
    relation: RelationVector | None = None,
    selection: Pick | None = None,
) -> list[Path]:
    """Write peak_power.png, time.png (and, with a relation, predicted_time_to_target.png) into out_dir."""
    figs = profile_figures(profile, power_cap_w=power_cap_w, relation=relation, selection=selection)
    return [save_figure(fig, Path(out_dir) / f"{stem}.png") for stem, fig in figs.items()]


@dataclass(frozen=True)
class Mark:
    """A (batch size, frequency) to mark on a map, by who chose it (drawn as `marker` in `color`)."""

    batch_size: int
    frequency_hz: int
    label: str
    marker: str
    color: str


def map_size(profile: Profile, min_height: float = 3.4) -> tuple[float, float]:
    """Width and height (inches) of one map of `profile`: its cells stay legible."""
    width = max(7.5, 1.6 + 0.62 * len(profile.frequencies()))
    return width, max(min_height, 2.0 + 0.42 * len(profile.batch_sizes()))


def draw_choices(
    sub: FigureBase, profile: Profile, cap: float | None, marks: list[Mark], labels: list[str], title: str
) -> None:
    """One peak-power map of `profile` under `cap` into `sub`, each mark in its label's slot of `labels`."""
    grid = _Grid.of(profile)
    ax, handles = _heatmap(sub, grid, _peak_panel(title), cap=cap, selection=None)
    drawn: dict[str, Artist] = {}
    for m in marks:
        if (m.batch_size, m.frequency_hz) not in grid.points:
            continue
        k, n = labels.index(m.label), len(labels)  # label k of n: its slot in the cell (spanning ±0.5)
        x = grid.frequencies_hz.index(m.frequency_hz) + (0.0 if n == 1 else -0.34 + 0.68 * k / (n - 1))
        y = grid.batch_sizes.index(m.batch_size) + 0.27
        (drawn[m.label],) = ax.plot(
            [x],
            [y],
            ls="none",
            marker=m.marker,
            color=m.color,
            markeredgecolor="black",
            markersize=13 if m.marker == "*" else 9,  # a star fills less of its box
            label=m.label,
            zorder=5,
        )
    _legend(sub, [*handles, *(drawn[lb] for lb in labels if lb in drawn)], map_size(profile)[0])


def plot_cap_over_time(
    steps: list[tuple[float, float | None]], until_s: float, title: str, path: Path
) -> Path:
    """A cap over time as a step line (no cap: a gap) into `path`, an already checked output file."""
    fig = new_figure(7, 3, layout="constrained")
    ax = fig.add_subplot()
    times = [t for t, _ in steps] + [until_s]
    caps = [np.nan if w is None else w for _, w in steps]
    ax.step(times, [*caps, caps[-1]], where="post", color="tab:blue")
    ax.set_xlim(0, until_s)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("power cap (W)")
    ax.set_title(textwrap.fill(title, 88), fontsize=9)  # a trace's path can be long: wrapped, not cut
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def save_figure(fig: Figure, path: Path, **kwargs: Any) -> Path:
    """The one way a figure reaches disk: in its suffix's format, atomically, never over a non-file."""
    fmt = plot_format(path)
    with replacing(path) as tmp:
        fig.savefig(tmp, format=fmt, **kwargs)
    return path


def _predicted(picks: list[Pick]) -> tuple[list[float], list[float]]:
    """The predicted seconds and joules of `candidates`' picks, which carry both."""
    seconds = [cast(float, s.predicted_s) for s in picks]
    joules = [cast(float, s.predicted_energy_j) for s in picks]
    return seconds, joules


def write_front(front: Front, profile: Profile, relation: RelationVector, out_dir: Path) -> list[Path]:
    """`pareto.json` (`powerctl.pareto/2`) and `pareto.png` in `out_dir`: the feasible pairs' front."""
    json_path = out_dir / "pareto.json"
    write_json(json_path, front.to_json_dict(profile, relation))
    fig = new_figure(7, 4.5, layout="constrained")
    ax = fig.add_subplot()
    sizes = sorted({s.batch_size for s in front.pairs})
    cmap = matplotlib.colormaps["viridis"]
    cap = parse_power_cap(front.power_cap_w, text=False)
    every = candidates(profile, relation, None)
    over = [s for s in every if cap is not None and cast(float, s.peak_power_w) > cap]
    if over:  # what the cap rules out, for scale: greyed, behind the feasible pairs
        ax.scatter(*_predicted(over), s=12, color="0.8", label=f"over the cap ({len(over)})", zorder=1)
    for i, b in enumerate(sizes):
        pts = [s for s in front.pairs if s.batch_size == b]
        color = cmap(i / max(1, len(sizes) - 1))
        ax.scatter(*_predicted(pts), s=18, color=color, label=f"b={b}", alpha=0.8, zorder=2)
    xs, ys = _predicted(front.front)
    ax.step(xs, ys, where="post", color="black", lw=1.2, label="Pareto front", zorder=3)
    ax.scatter(xs, ys, s=30, facecolors="none", edgecolors="black", lw=0.9, zorder=4)
    # both labels up and to the right: the front is the plot's lower-left edge, so nothing sits there
    for label, s, dy in (("fastest", front.fastest, 55), ("most frugal", front.most_frugal, 25)):
        ax.annotate(
            f"{label}: b={s.batch_size} @ {s.frequency_hz / 1e6:.0f} MHz",
            (s.predicted_s, s.predicted_energy_j),
            xytext=(30, dy),
            textcoords="offset points",
            fontsize=8,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.6", "lw": 0.5},
            arrowprops={"arrowstyle": "-", "lw": 0.6},
        )
    cap_s = "no cap" if cap is None else f"cap {cap:g} W"
    target = f"{relation.target_accuracy:.0%} ({cap_s})"
    ax.set_title(f"{profile.device}, {profile.model}: predicted time and energy to {target}", fontsize=9)
    ax.set_xscale("log")  # the lowest clocks lie far out; the front sits near the fast corner
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(plain)
    ax.tick_params(which="minor", labelsize=7)
    ax.set_xlabel("predicted time to target (s, log)")
    ax.set_ylabel("predicted energy to target (J, log)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return [json_path, save_figure(fig, out_dir / "pareto.png", dpi=110)]
