"""`summary.png` beside a run's `results.json`: per board and power cap (round 1), each method's pair on the
board model's peak-power map and its device seconds and energy; a state of practice not run is estimated
(hatched) from ours' measured values. Imported only by the commands that draw, never on a board."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from matplotlib.axes import Axes
from matplotlib.container import BarContainer
from matplotlib.figure import Figure, SubFigure
from matplotlib.patches import Patch

from fl_server.results import RESULTS_SCHEMA
from powerctl.cli.plot import MARKERS, Mark, colour, draw_choices, map_size, new_figure, save_figure
from powerctl.errors import PowerctlError
from powerctl.files.jsonfile import read_json
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.selection.baselines import state_of_practice
from powerctl.selection.joint import predicted_energy_j, predicted_s
from powerctl.selection.methods import run_method_named
from powerctl.selection.names import OURS, STATE_OF_PRACTICE
from strategies.settings import client_setting, key_of

SUMMARY_FIGURE = "summary.png"
"""The figure's name, beside the run's results.json."""
MAX_ROWS = 40
"""Most board-and-cap rows one figure draws (Agg refuses a figure much taller); the title counts the rest."""
_BAR_IN = 1.9
"""Inches of the time and energy panels per method drawn (6.2 at least)."""


@dataclass
class Bar:
    """One method's round on one board and cap: device seconds (profiling apart) and joules."""

    method: str
    seconds: float
    profiling_s: float
    joules: float | None
    estimated: bool = False
    """Not run: ours' measured values times the predicted ratio of the two pairs."""


@dataclass
class Row:
    """One board under one cap: its profile (None: no board model), the marks and the bars."""

    device: str
    cap: float | None
    clients: int
    profile: Profile | None
    marks: list[Mark] = field(default_factory=list)
    bars: list[Bar] = field(default_factory=list)


def _rows(
    records: list[dict[str, Any]], model: str, config: dict[str, Any], relation: RelationVector | None
) -> list[Row]:
    """Rows from flat client records, by device and cap."""
    groups: dict[tuple[str, float | None], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["device"], r["power_cap_w"]), []).append(r)
    profiles: dict[str, Profile | None] = {}
    rows = []
    by_cap = sorted(groups.items(), key=lambda kv: (kv[0][0], math.inf if kv[0][1] is None else kv[0][1]))
    for (device, cap), recs in by_cap:
        board = recs[0].get("board") or device.removeprefix("sim:")
        if board not in profiles:
            try:
                profiles[board] = predicted_board_profile(board, model, config)
            except (PowerctlError, ValueError, KeyError):  # a board without a model: bars only
                profiles[board] = None
        row = Row(device, cap, len({r.get("node_key") for r in recs}), profiles[board])
        for method in dict.fromkeys(r["method"] for r in recs):
            mine = [r for r in recs if r["method"] == method]
            for b, hz in dict.fromkeys((r["batch_size"], r["frequency_hz"]) for r in mine):
                row.marks.append(method_mark(method, b, hz))
            seconds, profiling, joules = (
                [r[k] for r in mine] for k in ("device_s", "profiling_s", "energy_j")
            )
            energy = None if None in joules else fmean(joules)
            row.bars.append(Bar(method, fmean(seconds), fmean(profiling), energy))
        _estimate_state_of_practice(row, relation)
        rows.append(row)
    return rows


def method_mark(method: str, b: int, hz: int, estimated: bool = False) -> Mark:
    """A method's (b, f) on a profile map (`estimated`: the method did not run, its rule on the profile)."""
    label = f"{method} (not run: its rule on this profile)" if estimated else method
    return Mark(b, hz, label, MARKERS.get(method, "o"), colour(method))


def predicted_board_profile(board: str, model: str, config: dict[str, Any]) -> Profile:
    """The board model's noise-free profile of `model` at `config`'s batch sizes and N (results.json's)."""
    from simulations.bench_steps import board_prediction

    sizes = tuple(client_setting(config, "batch_sizes"))
    return board_prediction(board, model, "{}", None, sizes, client_setting(config, "profile_samples"))


def _method_is(name: str, what: str) -> bool:
    """Whether the registry's run method `name` is `what` ("power_aware", "reference"); unknown: neither."""
    try:
        return bool(getattr(run_method_named(name).method, what))
    except PowerctlError:
        return False


def _estimate_state_of_practice(row: Row, relation: RelationVector | None) -> None:
    """Where ours ran and the state of practice did not: its mark under the row's cap and, where the
    profile allows, its bar."""
    ours = next((b for b in row.bars if _method_is(b.method, "power_aware")), None)
    ran_sop = any(_method_is(b.method, "reference") for b in row.bars)
    if ours is None or ran_sop or row.profile is None or relation is None:
        return
    try:
        sop = state_of_practice(row.profile, row.cap)
    except PowerctlError:
        return
    row.marks.append(method_mark(STATE_OF_PRACTICE, sop.batch_size, sop.frequency_hz, estimated=True))
    pair = next(m for m in row.marks if m.label == ours.method)
    r = relation.as_map()
    mine = row.profile.point(pair.batch_size, pair.frequency_hz)
    theirs = row.profile.point(sop.batch_size, sop.frequency_hz)
    if mine is None or theirs is None or pair.batch_size not in r or sop.batch_size not in r:
        return
    time_ratio = predicted_s(theirs, r[sop.batch_size]) / predicted_s(mine, r[pair.batch_size])
    energy_ratio = predicted_energy_j(theirs, r[sop.batch_size]) / predicted_energy_j(
        mine, r[pair.batch_size]
    )
    joules = None if ours.joules is None else ours.joules * energy_ratio
    row.bars.append(Bar(STATE_OF_PRACTICE, ours.seconds * time_ratio, 0.0, joules, estimated=True))


def run_figure(results: Path) -> Path:
    """`make run`'s summary.png beside its results.json (several methods: their folder's */results.json)."""
    files = sorted(results.glob("*/results.json")) if results.is_dir() else [results]
    if not files:
        raise PowerctlError(f"{results}: no results.json to draw")
    records: list[dict[str, Any]] = []
    data: dict[str, Any] = {}
    for path in files:
        data = read_json(path, RESULTS_SCHEMA)  # its clients of the first round in which any trained
        clients: list[dict[str, Any]] = next((r["clients"] for r in data["rounds"] if r["clients"]), [])
        records += [{**c, "method": data["run"].get("method") or c.get("method") or OURS} for c in clients]
    if not records:
        raise PowerctlError(f"{results}: no client reported in any round: nothing to draw")
    run = data["run"]
    config = run.get("config") or {}
    model = str(config.get("model", "resnet18-small"))
    relation = RelationVector.from_dict(run["relation"]) if run.get("relation") else None
    rows = _rows(records, model, config, relation)
    target = relation.target_accuracy if relation else config.get(key_of("target_accuracy"))
    title = f"make run · {model}, target accuracy {target}: round 1 on each board"
    out = (results if results.is_dir() else results.parent) / SUMMARY_FIGURE
    return save_figure(summary_figure(rows, title), out, dpi=100)


def fleet_figure(results: dict[str, Any], out: Path) -> Path:
    """`make fleet`'s figure from its results (`simulations.fleet/2`), as out/summary.png."""
    records = [r for r in results["records"] if r["round"] == 1]
    run = results.get("run") or {}
    relation = RelationVector.from_dict(run["relation"]) if run.get("relation") else None
    fleet = results["fleet"]
    rows = _rows(records, fleet["model"], run.get("config") or {}, relation)
    title = (
        f"fleet {fleet['name']} · {fleet['model']}, target accuracy {fleet['target_accuracy']:g}: "
        "round 1 on each board"
    )
    return save_figure(summary_figure(rows, title), out / SUMMARY_FIGURE, dpi=100)


def draw_or_say(draw: Callable[[], Path], say: Callable[[str], None]) -> Path | None:
    """The figure `draw` wrote; or None, and one line saying why not (the results stand)."""
    try:
        return draw()
    except (PowerctlError, OSError, ValueError, KeyError) as exc:
        say(f"summary figure not drawn: {exc}")
        return None


def summary_figure(rows: list[Row], title: str) -> Figure:
    """The figure: a row per board and cap (at most MAX_ROWS), map left, time and energy right."""
    more = f" (the first {MAX_ROWS} of {len(rows)} boards and caps)" if len(rows) > MAX_ROWS else ""
    rows = rows[:MAX_ROWS]
    profiles = [r.profile for r in rows if r.profile is not None]
    map_w, map_h = max((map_size(p) for p in profiles), default=(7.5, 3.4))
    bars_w = max(6.2, _BAR_IN * max((len(r.bars) for r in rows), default=2) + 0.4)
    width = map_w + bars_w
    fig = new_figure(width, map_h * len(rows) + 1.0, layout="constrained")
    fig.suptitle(
        f"{title}{more}\n★ the pair each method chose under the board's power cap (left), and what it cost "
        "(right): fewer seconds and joules are better",
        fontsize=12,
        x=0.01,
        ha="left",
    )
    labels = list(dict.fromkeys(m.label for r in rows for m in r.marks))
    for sub, row in zip(fig.subfigures(len(rows), 1, squeeze=False)[:, 0], rows, strict=True):
        left, right = sub.subfigures(1, 2, width_ratios=[map_w, bars_w])
        cap = "no power cap" if row.cap is None else f"power cap {row.cap:g} W"
        boards = f" ({row.clients} boards)" if row.clients > 1 else ""
        head = f"{row.device}{boards}, {cap}"
        cap_w, profile = row.cap, row.profile
        if profile is not None and cap_w is not None and all(p.peak_power_w <= cap_w for p in profile.points):
            head += " (every pair under it)"
        if row.profile is None:
            ax = left.add_subplot()
            ax.axis("off")
            chose = "\n".join(
                f"{m.label}: b = {m.batch_size}, {m.frequency_hz / 1e6:.0f} MHz" for m in row.marks
            )
            ax.text(
                0.5, 0.5, f"{head}\nno board model: no profile to draw\n{chose}", ha="center", va="center"
            )
        else:
            draw_choices(
                left,
                row.profile,
                row.cap,
                row.marks,
                labels,
                f"{head}: peak power P(b, f), the board model's",
            )
        _cost_bars(right, row)
    return fig


def _cost_bars(sub: SubFigure, row: Row) -> None:
    """Seconds and joules per method; an estimated bar hatched, the ratio to ours' written."""
    t_ax, e_ax = sub.subplots(1, 2)
    names = [b.method for b in row.bars]
    colours = [colour(n) for n in names]
    hatches = ["//" if b.estimated else "" for b in row.bars]
    x = range(len(row.bars))
    seconds = [b.seconds for b in row.bars]
    t_ax.bar(x, seconds, color=colours, hatch=hatches, edgecolor="white")
    profiling = [b.profiling_s for b in row.bars]
    on_top = t_ax.bar(x, profiling, bottom=seconds, color=colours, alpha=0.4, edgecolor="white")
    joules = [math.nan if b.joules is None else b.joules for b in row.bars]
    energy = e_ax.bar(x, joules, color=colours, hatch=hatches, edgecolor="white")
    ours = next((b for b in row.bars if _method_is(b.method, "power_aware")), None)
    for ax, drawn, value, unit in (
        (t_ax, on_top, lambda b: b.seconds + b.profiling_s, "s"),
        (e_ax, energy, lambda b: b.joules, "J"),
    ):
        top = _label_bars(ax, drawn, row.bars, value, unit, ours)
        ax.set_xticks(list(x), [n.replace("-", "-\n", 1) if len(n) > 10 else n for n in names], fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.set_ylim(0, 1.4 * top if top > 0 else 1.0)  # room for the labels above the bars
    t_ax.set_ylabel("device seconds (s)")
    t_ax.set_title("time on the board, round 1", fontsize=10)
    e_ax.set_ylabel("energy (J)")
    e_ax.set_title("energy, round 1", fontsize=10)
    handles = []
    if any(b.profiling_s > 0 for b in row.bars):
        handles.append(Patch(facecolor="0.6", alpha=0.4, label="profiling (paler, stacked)"))
    if any(b.estimated for b in row.bars):
        handles.append(
            Patch(
                facecolor="white",
                edgecolor="0.3",
                hatch="//",
                label="not run: ours' measured × the profile's predicted ratio",
            )
        )
    if handles:
        sub.legend(handles=handles, loc="outside lower center", ncol=len(handles), fontsize=8, frameon=False)


def _label_bars(
    ax: Axes, drawn: BarContainer, bars: list[Bar], value: Any, unit: str, ours: Bar | None
) -> float:
    """Each bar's value, and how many times ours' it is (> 1: ours is better); the highest value."""
    ours_v = None if ours is None else value(ours)
    labels: list[str] = []
    top = 0.0
    for k, b in enumerate(bars):
        v = value(b)
        if v is None:
            ax.text(k, 0, "no sensor", ha="center", va="bottom", fontsize=8)
            labels.append("")
            continue
        top = max(top, v)
        labels.append(f"{v:.3g} {unit}" + (f"\n{v / ours_v:.2f}× ours" if b is not ours and ours_v else ""))
    ax.bar_label(drawn, labels, padding=2, fontsize=8 if len(bars) <= 2 else 7)
    return top
