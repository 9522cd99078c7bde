"""`powerctl` caps, select, pareto, cap-source and plot: what a profile, a relation and a cap select."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from powerctl.cli import PROG
from powerctl.cli.util import add_command, bounded_float, mhz, power_cap, power_cap_w, say, say_json
from powerctl.devices.unpinned import NOT_PINNED
from powerctl.errors import InfeasibleCapError, PowerctlError
from powerctl.files.mapping import MAX_COUNT
from powerctl.files.outputs import check_output_dir, check_output_file, output_path, plot_format
from powerctl.records.relation import DEFAULT_RELATION_RULE, INTERVAL_STANDARD_ERRORS, RELATION_RULES
from powerctl.selection.capsource import MAX_POINTS, CapSourceError, ScheduleCap, TraceCap, parse_cap_source


def cmd_caps(args: argparse.Namespace) -> int:
    """state-of-practice frequency: the highest at which every profile stays under a cap"""
    from powerctl.records.profile import Profile
    from powerctl.selection.caps import frequency_cap, peak_power_by_frequency

    profiles = [Profile.load(p) for p in args.profile]
    hz = frequency_cap(profiles, args.power_cap)
    peak = peak_power_by_frequency(profiles)[hz]
    if args.json:
        found = {"power_cap_w": args.power_cap, "frequency_hz": hz, "peak_power_w": peak}
        say_json(found | {"device": profiles[0].device, "models": sorted({p.model for p in profiles})})
        return 0
    say(
        f"{mhz(hz)}: the highest frequency at which every point of the {len(profiles)} profile(s) stays "
        f"under {args.power_cap:g} W (peak {peak:.2f} W)"
    )
    return 0


def _load_pair(args: argparse.Namespace, command: str) -> tuple[Any, Any]:
    """The profile and the relation vector (none without `--relation`), their pairing's warnings said."""
    from powerctl.records.profile import Profile
    from powerctl.records.relation import RelationVector
    from powerctl.selection.joint import check_pairing

    profile = Profile.load(args.profile)
    relation = RelationVector.load(args.relation) if args.relation else None
    for warning in (
        [] if relation is None else check_pairing(profile, relation, allow_mismatch=args.allow_mismatch)
    ):
        say(f"{PROG} {command}: warning: {warning}", file=sys.stderr)
    return profile, relation


def cmd_select(args: argparse.Namespace) -> int:
    """the (batch size, frequency) with the least predicted time under a cap"""
    from powerctl.selection.joint import select

    profile, relation = _load_pair(args, "select")
    rule, mismatch = args.relation_rule, args.allow_mismatch
    choice = select(profile, relation, args.power_cap, args.objective, rule, allow_mismatch=mismatch)
    energy = args.objective == "energy"
    if args.json:
        say_json(choice.to_json_dict(with_energy=energy))
        return 0
    pinned = profile.extra.get("pinned", True)
    at = mhz(choice.frequency_hz) if pinned else f"the clock in force ({NOT_PINNED})"
    say(
        f"batch size {choice.batch_size} at {at}: "
        f"predicted {choice.predicted_s:.1f} s "
        + (f"and {choice.predicted_energy_j:.1f} J " if energy else "")
        + f"to {relation.target_accuracy:.0%} accuracy, peak {choice.peak_power_w:.2f} W"
        + (f" (cap {args.power_cap:g} W)" if args.power_cap else " (no cap)")
        + ("; the least energy" if energy else "")
    )
    if args.compare:
        from powerctl.selection.baselines import compare

        say(
            f"\n{'strategy':<18} {'b':>5} {'MHz':>8} {'peak W':>7} {'predicted s':>12} {'ours faster by':>17}"
        )
        for row in compare(profile, relation, args.power_cap):
            if "infeasible" in row:
                say(f"{row['name']:<18} infeasible under the cap: {row['infeasible']}")
                continue
            peak = "-" if row["peak_power_w"] is None else f"{row['peak_power_w']:.2f}"
            pred = "-" if row["predicted_s"] is None else f"{row['predicted_s']:.1f}"
            speed = "-" if row["speedup"] is None else f"{row['speedup']:.2f}x"
            at_mhz = f"{row['frequency_hz'] / 1e6:.1f}" if pinned else NOT_PINNED
            say(f"{row['name']:<18} {row['batch_size']:>5} {at_mhz:>8} {peak:>7} {pred:>12} {speed:>17}")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    """heat maps of peak power and time over (batch size, frequency)"""
    from powerctl.cli.plot import plot_profile
    from powerctl.selection.joint import select

    check_output_dir(args.out)
    profile, relation = _load_pair(args, "plot")
    selection = None
    if relation is not None:
        try:
            selection = select(profile, relation, args.power_cap, allow_mismatch=args.allow_mismatch)
        except InfeasibleCapError as exc:
            say(f"{PROG} plot: note: {exc}", file=sys.stderr)
    for p in plot_profile(
        profile, args.out, power_cap_w=args.power_cap, relation=relation, selection=selection
    ):
        say(p)
    return 0


def cmd_pareto(args: argparse.Namespace) -> int:
    """the time–energy front of the feasible (batch size, frequency) pairs"""
    from powerctl.cli.plot import write_front
    from powerctl.selection.pareto import pareto_front

    check_output_dir(args.out)
    profile, relation = _load_pair(args, "pareto")
    front = pareto_front(profile, relation, args.power_cap)
    paths = write_front(front, profile, relation, args.out)
    if args.json:
        say_json(front.to_json_dict(profile, relation))
        return 0
    say(
        f"{len(front.pairs)} feasible pairs, {len(front.front)} on the time–energy front"
        + (f" (cap {args.power_cap:g} W)" if args.power_cap else " (no cap)")
    )
    say(f"{'':2}{'b':>5} {'MHz':>8} {'predicted s':>12} {'predicted J':>12} {'peak W':>7}")
    for s in front.front:
        tags = ((" fastest", front.fastest), (" most frugal", front.most_frugal))
        mark = "".join(tag for tag, best in tags if s == best)
        say(
            f"{'':2}{s.batch_size:>5} {s.frequency_hz / 1e6:>8.1f} {s.predicted_s:>12.1f} "
            f"{s.predicted_energy_j:>12.1f} {s.peak_power_w:>7.2f}{mark}"
        )
    for p in paths:
        say(p)
    return 0


def cmd_cap_source(args: argparse.Namespace) -> int:
    """check a power cap that changes (schedule, trace, live file) and show it over time"""
    plot = None
    if args.plot:
        plot = check_output_file(args.plot, "--plot", in_folder="cap_source.png")
        plot_format(plot, "--plot")  # a suffix matplotlib writes
    if not args.source.strip():  # as --power-cap '': an empty word is not "no cap"
        raise CapSourceError("cap source: empty; give watts, none, a schedule, trace:PATH or live:PATH")
    source = parse_cap_source(args.source, "cap source")
    until = args.until
    if until is None:
        if isinstance(source, TraceCap):
            until = source.period_s if math.isfinite(source.period_s) else source.times_s[-1] + 60
        elif isinstance(source, ScheduleCap):
            until = source.steps[-1][0] * 1.25 or 60.0
        else:
            until = 60.0
    every = args.every or until / 60
    count = math.floor(until / every + 1e-9) + 1
    if count > MAX_POINTS:
        raise PowerctlError(
            f"--until {until:g} s every {every:g} s is {count:,} lines, more than {MAX_POINTS:,}: "
            "raise --every or lower --until (--plot draws every change of the cap whatever --every is)"
        )
    times = [i * every for i in range(count)]
    caps = [source.cap_at(t) for t in times]
    if plot is not None:
        from powerctl.cli.plot import plot_cap_over_time

        plot_cap_over_time(source.steps_until(until), until, source.describe(), plot)
    if args.json:
        points = list(zip(times, caps, strict=True))
        say_json({"source": source.describe(), "lowest_w": source.lowest_w(), "points": points})
        return 0
    lowest = source.lowest_w()
    say(f"{source.describe()}; lowest {'unknown' if lowest is None else f'{lowest:g} W'}")
    for t, w in zip(times, caps, strict=True):
        say(f"{t:>10.1f} s  {'none' if w is None else f'{w:.2f} W'}")
    if plot is not None:
        say(plot)
    return 0


def add_select_commands(sub: Any) -> None:
    """caps, select, pareto, cap-source and plot."""
    s = add_command(sub, "caps", cmd_caps)
    s.add_argument(
        "--profile", required=True, action="append", type=Path, help="profile JSON (repeat: all models)"
    )
    s.add_argument("--power-cap", required=True, type=power_cap_w, metavar="W", help="power cap in W")
    s.add_argument("--json", action="store_true", help='print {"power_cap_w", "frequency_hz", ...}')

    s = add_command(sub, "select", cmd_select)
    _pair_flags(s)
    s.add_argument("--compare", action="store_true", help="also print the baselines")
    s.add_argument(
        "--objective",
        choices=("time", "energy"),
        default="time",
        help="minimise the predicted time to the target (default, the paper) or the energy to it",
    )
    s.add_argument(
        "--relation-rule",
        choices=RELATION_RULES,
        default=DEFAULT_RELATION_RULE,
        help="mean: Algorithm 1 on the relation vector; robust: the least mean regret over the seeds' "
        "vectors kept in the file (its samples_per_seed); interval: the mean, the larger batch size "
        "winning among the pairs those seeds cannot tell from the best "
        f"({INTERVAL_STANDARD_ERRORS:g} standard errors of each seed's own ratio) (default: "
        f"{DEFAULT_RELATION_RULE})",
    )
    s.add_argument(
        "--json",
        action="store_true",
        help='print {"batch_size", "frequency_hz", "predicted_s", "peak_power_w"} '
        '(+ "predicted_energy_j" with --objective energy)',
    )

    s = add_command(sub, "pareto", cmd_pareto)
    _pair_flags(s)
    s.add_argument("--out", required=True, type=output_path, help="folder for pareto.json and pareto.png")
    s.add_argument("--json", action="store_true", help="print pareto.json's content")

    s = add_command(sub, "cap-source", cmd_cap_source)
    s.add_argument(
        "source",
        help="a number of watts, none, a schedule '[[t_s, W], ...]', trace:PATH[?end=repeat|clip&scale=X"
        "&timescale=X] or live:PATH[?poll=S]",
    )
    bounded_float(0.0, MAX_COUNT).add(s, "--until", "show up to S seconds (default: one period)", metavar="S")
    every = bounded_float(0.001, MAX_COUNT, above=False)  # a millisecond at least
    every.add(s, "--every", "one line every S seconds (default: 60 lines)", metavar="S")
    s.add_argument(
        "--plot",
        type=output_path,
        metavar="PNG",
        help="also draw every change of the cap over time into PNG (in an existing folder; a folder: "
        "FOLDER/cap_source.png)",
    )
    s.add_argument(
        "--json", action="store_true", help='print {"source", "lowest_w", "points": [[t_s, W], ...]}'
    )

    s = add_command(sub, "plot", cmd_plot)
    s.add_argument("profile", type=Path, help="profile JSON")
    s.add_argument("--out", required=True, type=output_path, help="folder for the PNG files")
    s.add_argument("--power-cap", type=power_cap, metavar="W", help="draw the cap's boundary")
    s.add_argument(
        "--relation", type=Path, help="relation JSON: mark the selected pair, plot time-to-accuracy"
    )
    s.add_argument("--allow-mismatch", action="store_true", help="as for select")


def _pair_flags(s: Any) -> None:
    s.add_argument("--profile", required=True, type=Path, help="profile JSON (powerctl profile)")
    s.add_argument("--relation", required=True, type=Path, help="relation vector JSON (fl-server relation)")
    s.add_argument("--power-cap", type=power_cap, metavar="W", help="power cap in W (omit or none: no cap)")
    s.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="combine a relation vector of another model or input than the profile (a warning, not an error)",
    )
