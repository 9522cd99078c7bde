"""The time–energy front: which feasible (b, f) pairs are worth choosing when energy counts too.

Each feasible pair predicts a time to the target, T_N · r_b, and an energy to it, E_N · r_b (E_N = the
profile's mean power × T_N). A pair is on the Pareto front when no other pair is at least as fast and at
least as frugal, and strictly better in one. The fastest pair (Algorithm 1) and the most frugal one are
its two ends: a lower frequency can finish later yet use less energy, which is what the front shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powerctl.jsonfile import write_json
from powerctl.pick import Pick
from powerctl.profile_table import Profile
from powerctl.relation import RelationVector
from powerctl.selection import candidates, check_power_cap, rank, select

PARETO_SCHEMA = "powerctl.pareto/1"


@dataclass(frozen=True)
class Front:
    """Every feasible pair, the non-dominated ones (fastest first) and the two optima."""

    pairs: list[Pick]
    front: list[Pick]
    fastest: Pick
    most_frugal: Pick
    power_cap_w: float | None

    def to_json_dict(self, profile: Profile, relation: RelationVector) -> dict[str, Any]:
        def point(s: Pick) -> dict[str, Any]:
            return {**s.to_json_dict(with_energy=True)}

        return {
            "schema": PARETO_SCHEMA,
            "device": profile.device,
            "model": profile.model,
            "input_shape": list(profile.input_shape),
            "profile_samples": profile.samples,
            "proxy_dataset": relation.proxy_dataset,
            "target_accuracy": relation.target_accuracy,
            "power_cap_w": self.power_cap_w,
            "feasible_pairs": len(self.pairs),
            "front": [point(s) for s in self.front],
            "time_optimal": point(self.fastest),
            "energy_optimal": point(self.most_frugal),
        }


def pareto_front(profile: Profile, relation: RelationVector, power_cap_w: float | None) -> Front:
    """The front of the feasible pairs (none feasible: the selection's one InfeasibleCapError line)."""
    if not rank(profile, relation, power_cap_w, "time"):
        select(profile, relation, power_cap_w)  # raises the one-line error naming the least power
    pairs = candidates(profile, relation, power_cap_w)
    # a sweep by time (ties: the lower energy first, then the selection's tie rule): a pair is on the
    # front when it uses strictly less energy than every faster one (of pairs predicting exactly the
    # same time and energy, the one the tie rule prefers stands for all)
    ordered = sorted(
        pairs, key=lambda s: (s.predicted_seconds, s.predicted_energy_j, -s.batch_size, s.frequency_hz)
    )
    front: list[Pick] = []
    for s in ordered:
        if not front or s.predicted_energy_j < front[-1].predicted_energy_j:
            front.append(s)
    # the time-optimal end is the front's first pair: among pairs tied at the least time, the one with
    # the least energy (Algorithm 1's own tie rule — the larger batch — may pick a dearer one of them)
    return Front(pairs, front, front[0], rank(profile, relation, power_cap_w, "energy")[0], power_cap_w)


def write_front(front: Front, profile: Profile, relation: RelationVector, out_dir: Path) -> list[Path]:
    """`out_dir/pareto.json` and `out_dir/pareto.png`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "pareto.json"
    write_json(json_path, front.to_json_dict(profile, relation))
    png = out_dir / "pareto.png"
    _plot(front, profile, relation, png)
    return [json_path, png]


def _plot(front: Front, profile: Profile, relation: RelationVector, path: Path) -> None:
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    from powerctl.plot import save_figure

    fig = Figure(figsize=(7, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    sizes = sorted({s.batch_size for s in front.pairs})
    cmap = matplotlib.colormaps["viridis"]
    cap = check_power_cap(front.power_cap_w)
    over = [s for s in candidates(profile, relation, None) if cap is not None and s.peak_power_w > cap]
    if over:  # what the cap rules out, for scale: greyed, behind the feasible pairs
        ax.scatter(
            [s.predicted_seconds for s in over],
            [s.predicted_energy_j for s in over],
            s=12,
            color="0.8",
            label=f"over the cap ({len(over)})",
            zorder=1,
        )
    for i, b in enumerate(sizes):
        pts = [s for s in front.pairs if s.batch_size == b]
        ax.scatter(
            [s.predicted_seconds for s in pts],
            [s.predicted_energy_j for s in pts],
            s=18,
            color=cmap(i / max(1, len(sizes) - 1)),
            label=f"b={b}",
            alpha=0.8,
            zorder=2,
        )
    xs = [s.predicted_seconds for s in front.front]
    ys = [s.predicted_energy_j for s in front.front]
    ax.step(xs, ys, where="post", color="black", lw=1.2, label="Pareto front", zorder=3)
    ax.scatter(xs, ys, s=30, facecolors="none", edgecolors="black", lw=0.9, zorder=4)
    # both labels up and to the right: the front is the plot's lower-left edge, so nothing sits there
    for label, s, dy in (("fastest", front.fastest, 55), ("most frugal", front.most_frugal, 25)):
        ax.annotate(
            f"{label}: b={s.batch_size} @ {s.frequency_hz / 1e6:.0f} MHz",
            (s.predicted_seconds, s.predicted_energy_j),
            xytext=(30, dy),
            textcoords="offset points",
            fontsize=8,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.6", "lw": 0.5},
            arrowprops={"arrowstyle": "-", "lw": 0.6},
        )
    cap_s = "no cap" if cap is None else f"cap {cap:g} W"
    ax.set_title(
        f"{profile.device}, {profile.model}: predicted time and energy to "
        f"{relation.target_accuracy:.0%} ({cap_s})",
        fontsize=9,
    )
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
    save_figure(fig, path, dpi=110)
