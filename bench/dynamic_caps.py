"""Power caps that change while training: following the cap vs selecting once vs the state of practice.

On simulated boards under a solar trace and a step schedule, over seeds; one run of each plotted.
Results: docs/results/dynamic_caps.md.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench_common import ROOT, demo_boards, mean_pm

from fl_client.round import (
    CapRule,
    MethodRule,
    RoundWork,
    fine_tune_step,
    measured_profile_step,
    usable_relation,
)
from powerctl.cli.plot import new_figure, save_figure
from powerctl.devices.base import Device
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.selection.capsource import CapSource, ScheduleCap, TraceCap
from powerctl.selection.joint import select
from powerctl.selection.names import OURS, STATE_OF_PRACTICE
from simulations.bench_steps import PinnedRule

POLICIES = ("follow (ours)", "once for the minimum (ours)", "state of practice, following")


@dataclass
class Outcome:
    reached: bool
    time_to_target_s: float
    energy_j: float
    switches: int
    pauses: int
    over_cap_s: float
    in_step_over_cap_s: float
    timeline: list[tuple[float, float]]
    events: list[dict[str, Any]]


def policies(profile: Profile, relation: RelationVector, caps: CapSource) -> dict[str, CapRule]:
    """The three policies as rules of the cap (the client round's rules); "once": ours selected once, for
    the lowest cap the source will give, and kept whatever the cap."""
    ours = MethodRule(OURS, profile, relation)
    low = ours(caps.lowest_w())
    once = PinnedRule(low.batch_size, low.frequency_hz, profile, relation, OURS)
    sop = MethodRule(STATE_OF_PRACTICE, profile, relation)
    return dict(zip(POLICIES, (ours, once, sop), strict=True))


def run_once(work: RoundWork, caps: CapSource, rule: CapRule, seed: int) -> Outcome:
    """One client fine-tune following `caps` by `rule` (training seed = board noise seed), with the
    board's power recorded over the whole run, pauses included."""
    instr = replace(work.instr, seed=seed, cap_poll_s=0.5)
    timeline: list[tuple[float, float]] = []

    @contextmanager
    def record(dev: Device) -> Iterator[None]:
        sampler = dev.power_sampler(20.0)
        sampler.start()
        try:
            yield
        finally:
            timeline.extend(sampler.stop())

    trained = fine_tune_step(replace(work, instr=instr, caps=caps, device_seed=seed), rule, observe=record)
    r, events = trained.result, trained.cap.cap_events
    t0 = timeline[0][0]
    return Outcome(
        reached=r.reached,
        time_to_target_s=r.device_s + trained.cap.paused_s,
        energy_j=r.energy_j or 0.0,
        switches=sum(e["kind"] == "switch" for e in events),
        pauses=sum(e["kind"] == "pause" for e in events),
        over_cap_s=sum(e["over_cap_s"] for e in events),
        in_step_over_cap_s=max((e["in_step_over_cap_s"] for e in events), default=0.0),
        timeline=[(t - t0, w) for t, w in timeline],
        events=events,
    )


def sources(board: str, profile: Profile, relation: RelationVector) -> dict[str, CapSource]:
    """A solar day over about one run at the trace's middle cap, and a step schedule down and up again."""
    trace = ROOT / "simulations" / "caps" / f"solar-{board}.csv"
    solar = TraceCap.load(trace)
    lo, hi = min(solar.watts), max(solar.watts)
    run_s = select(profile, relation, (lo + hi) / 2).predicted_s
    assert run_s is not None, "Algorithm 1's pick predicts its time"
    day = TraceCap.load(trace, time_scale=run_s / solar.period_s, end="clip")
    steps = ScheduleCap.from_pairs(
        [[0, hi], [0.2 * run_s, (lo + hi) / 2], [0.4 * run_s, lo], [0.7 * run_s, hi]], "step schedule"
    )
    return {"solar day": day, "steps down and up": steps}


def plot_runs(
    board: str, source_name: str, caps: CapSource, outcomes: dict[str, Outcome], path: Path
) -> None:
    fig = new_figure(10, 3.2 * len(outcomes), layout="constrained")
    axes = fig.subplots(len(outcomes), 1, sharex=True)
    end = max(o.timeline[-1][0] for o in outcomes.values())
    grid = [end * i / 800 for i in range(801)]
    for ax, (name, o) in zip(axes, outcomes.items(), strict=True):
        ts, ws = zip(*o.timeline, strict=True)
        ax.plot(ts, ws, lw=0.6, color="tab:orange", label="measured power")
        ax.step(grid, [caps.cap_at(t) for t in grid], where="post", color="tab:blue", lw=1.5, label="cap")
        ax.set_ylabel("W")
        ax.set_title(
            f"{name}: {o.time_to_target_s:.1f} s to target, {o.energy_j:.0f} J, {o.switches} switches, "
            f"{o.over_cap_s:.2f} s over the cap",
            fontsize=9,
        )
        right = ax.twinx()
        ev_t = [e["t_s"] for e in o.events] + [o.timeline[-1][0]]
        mhz = [e["new_frequency_hz"] / 1e6 for e in o.events]
        right.step(ev_t, mhz + mhz[-1:], where="post", color="tab:green", lw=1, label="GPU MHz")
        right.set_ylabel("MHz", color="tab:green")
        shown = None
        for e in o.events:  # label where the batch size changes, and pauses
            label = "pause" if e["kind"] == "pause" else f"b={e['new_batch_size']}"
            if label != shown:
                shown = label
                at = (e["t_s"], e["new_frequency_hz"] / 1e6)
                right.annotate(
                    label, at, fontsize=7, color="tab:green", xytext=(2, 4), textcoords="offset points"
                )
        ax.legend(loc="upper left", fontsize=7)
    axes[-1].set_xlabel("device seconds since the fine-tune started")
    fig.suptitle(f"sim:{board}, {source_name}")
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args, settings, works = demo_boards(__doc__, "dynamic-caps", argv)
    first = next(iter(works.values()))
    relation = usable_relation(first.instr, len(first.split()[0]))
    print(
        f"model {settings.model}, target accuracy {settings.target_accuracy}, batch sizes "
        f"{settings.batch_sizes}, {args.seeds} seeds; relation r_b = "
        + ", ".join(f"{b}:{r:.2f}" for b, r in relation.as_map().items())
    )
    for board, work in works.items():
        profile = measured_profile_step(work, relation).profile
        for source_name, caps in sources(board, profile, relation).items():
            print(f"\nsim:{board}, {source_name}: {caps.describe()}")
            head = (
                f"  {'policy':<30} {'at target':>9} {'time to target s':>17} {'energy J':>15} "
                f"{'switches':>8} {'pauses':>6} {'over cap s':>10} {'step at drop s':>14}"
            )
            print(head + "\n  " + "-" * (len(head) - 2))
            first_runs: dict[str, Outcome] = {}
            for policy, rule in policies(profile, relation, caps).items():
                outs = [run_once(work, caps, rule, seed) for seed in range(args.seeds)]
                first_runs[policy] = outs[0]
                tta, joules, switches, pauses = (
                    mean_pm([getattr(o, k) for o in outs], ".1f")
                    for k in ("time_to_target_s", "energy_j", "switches", "pauses")
                )
                over, in_step = max(o.over_cap_s for o in outs), max(o.in_step_over_cap_s for o in outs)
                print(
                    f"  {policy:<30} {sum(o.reached for o in outs):>5}/{len(outs):<3} {tta:>17} {joules:>15} "
                    f"{switches:>8} {pauses:>6} {over:>10.2f} {in_step:>14.2f}"
                )
            png = args.out / f"{board}-{source_name.replace(' ', '-')}.png"
            plot_runs(board, source_name, caps, first_runs, png)
            print(f"  plot: {png}")
    print(
        "\ntime to target: device seconds of training plus pauses, until the first evaluation at the "
        "target; over cap s: the most, over seeds, measured over the cap in force (× 1.02, the sensor's "
        "noise band) beyond the step in progress at a drop; step at drop s: the longest such step's time "
        "over the new cap."
        f"\n({time.perf_counter() - started:.0f} s wall)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
