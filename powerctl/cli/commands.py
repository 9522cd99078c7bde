"""`powerctl`: devices, power, freq, profile, caps, select, pareto, cap-source, plot (docs/reference/cli.md).

Every user error is one line on stderr and exit status 2; nothing on the device is left changed.
`powerctl profile` runs real training steps, which this package does not have: `main` receives them as
`step_factory` (the installed command, `powerfed.training.powerctl_cli`, passes the training package's).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from powerctl.cli.util import (
    OneLineParser,
    batch_sizes,
    bounded_float,
    bounded_int,
    one_line_errors,
    power_cap,
    power_cap_w,
    say,
    seed,
)
from powerctl.devices import SPEC_HELP, open_device
from powerctl.devices.unpinned import NOT_PINNED
from powerctl.errors import InfeasibleCapError, PowerctlError
from powerctl.files.mapping import MAX_COUNT
from powerctl.files.outputs import output_path
from powerctl.records.relation import DEFAULT_RELATION_RULE, INTERVAL_STANDARD_ERRORS, RELATION_RULES

if TYPE_CHECKING:
    from powerctl.profiling.profiler import StepFactory
    from powerctl.records.workload import Workload

PROG = "powerctl"

# the ranges of the numeric flags (each flag's help names its own)
SAMPLES = bounded_int(1, MAX_COUNT)
"""N of T_N: a billion samples is hundreds of passes over ImageNet; more only overflows the prediction."""
WARMUP_STEPS = bounded_int(0, 1000)
MEASURED_STEPS = bounded_int(1, 1000)
RATE_HZ = bounded_float(0.0, 1000.0)
"""Power sampling rate: the boards' sensors update every few ms (INA3221) to every 20-100 ms (NVML)."""
NUM_CLASSES = bounded_int(2, 100_000)
"""A classifier needs two classes at least; 100000 is five times ImageNet-21k's."""
SPAN_S = bounded_float(0.0, MAX_COUNT)
"""cap-source --until: up to about 31 years (the lines and steps it makes are bounded on their own)."""
STEP_S = bounded_float(0.001, MAX_COUNT, above=False)
"""cap-source --every: a millisecond at least (the live source polls far more slowly)."""
MAX_FREQUENCY_HZ = 100e9


class ModelStepFactory(Protocol):
    """A model's training step for `powerctl profile`: (its workload, batch size → one step)."""

    def __call__(
        self, model_name: str, *, torch_device: str, num_classes: int | None, seed: int
    ) -> tuple[Workload, StepFactory]: ...


def _frequency(text: str) -> int:
    t = text.strip().lower()
    scale = {"ghz": 1e9, "mhz": 1e6, "khz": 1e3, "hz": 1.0}
    for suffix, factor in scale.items():
        if t.endswith(suffix):
            t, mult = t[: -len(suffix)], factor
            break
    else:
        mult = 1.0
    try:
        hz = float(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"frequency must be in Hz (or with MHz/GHz), got {text!r}") from None
    if not math.isfinite(hz) or hz <= 0:
        raise argparse.ArgumentTypeError(f"frequency must be > 0, got {text!r}")
    if hz > MAX_FREQUENCY_HZ:
        raise argparse.ArgumentTypeError(f"frequency must be at most 100 GHz, got {text!r}")
    return round(hz)


def _print_json(data: Any) -> None:
    say(json.dumps(data, indent=2))


def _mhz(hz: int | None) -> str:
    return "-" if hz is None else f"{hz / 1e6:.1f} MHz"


def _pair_mhz(profile: Any, hz: int, width: int = 0) -> str:
    """A selected pair's frequency: its MHz, or "not pinned" where the profile was measured at the clock
    in force (`powerctl.devices.unpinned`): the clock was the governor's, not one the pair sets."""
    text = f"{hz / 1e6:.1f}" if profile.extra.get("pinned", True) else NOT_PINNED
    return f"{text:>{width}}"


# --- devices / power / freq -------------------------------------------------------------------
def cmd_devices(args: argparse.Namespace) -> int:
    from powerctl.devices.detect import detect_devices

    devices = detect_devices()
    broken = 2 if any("error" in d for d in devices) else 0  # a device there but unusable: not "no knob"
    if args.json:
        _print_json(devices)
        return broken
    for d in devices:
        if "error" in d:
            say(f"{d['spec']:<20} {d.get('board', ''):<18} error: {d['error']}")
            continue
        freqs = d.get("frequencies_hz") or []
        span = (
            f"{len(freqs)} frequencies {_mhz(freqs[0])} … {_mhz(freqs[-1])}" if freqs else "no frequency knob"
        )
        rails = ", ".join(d.get("rails") or []) or "no power sensor"
        say(f"{d['spec']:<20} {d.get('board', ''):<18} {span}; rails: {rails}")
    return broken


def cmd_power(args: argparse.Namespace) -> int:
    with open_device(args.device) as dev:
        total = dev.read_power_w()
        rails = dev.rails()
    if args.json:
        _print_json({"device": args.device, "power_w": total, "rails_w": rails})
    else:
        say(f"{total:.3f} W" + "".join(f"\n  {k}: {v:.3f} W" for k, v in rails.items()))
    return 0


def cmd_freq(args: argparse.Namespace) -> int:
    from powerctl.pinning.pinsession import restore_saved

    with open_device(args.device) as dev:
        if args.set is not None:
            dev.pin_frequency(args.set)
            dev.release_snapshot()  # the pin stays after we exit; its record lets --restore undo it
            message = f"pinned {args.device} at {_mhz(args.set)}"
        elif args.restore:
            state = restore_saved(dev)
            if state is None:
                message = f"nothing to restore for {args.device}: no earlier `powerctl freq --set`"
            else:
                message = f"restored {args.device} to {state}"
        else:
            message = ""
        info = {
            "device": args.device,
            "current_frequency_hz": dev.current_frequency(),
            "frequencies_hz": dev.frequencies(),
        }
    if args.json:
        _print_json(info | ({"message": message} if message else {}))
    else:
        if message:
            say(message)
        say(f"current: {_mhz(info['current_frequency_hz'])}")
        say("available: " + " ".join(f"{f / 1e6:g}" for f in info["frequencies_hz"]) + " MHz")
    return 0


# --- profile ----------------------------------------------------------------------------------
def _predicted_profile(args: argparse.Namespace, step_factory: ModelStepFactory) -> Any:
    """`--predicted`: the simulated board's noise-free profile, no training step run (the model's
    workload only)."""
    from powerctl.devices.simulated import SimulatedBoard, predicted_profile

    if not args.device.startswith("sim:"):
        raise PowerctlError(
            f"--predicted needs a simulated board (sim:NAME); {args.device} is profiled by running it"
        )
    if args.order != "grid":
        raise PowerctlError(f"--predicted writes the whole grid at no cost; drop --order {args.order}")
    with open_device(args.device, seed=args.seed, pin=not args.no_pin) as dev:
        board = getattr(dev, "inner", dev)  # --no-pin: the board behind its clock in force
        assert isinstance(board, SimulatedBoard)
        frequencies, pins = dev.frequencies(), dev.pins  # --no-pin: the one clock in force
    workload, _ = step_factory(args.model, torch_device="cpu", num_classes=args.num_classes, seed=0)
    profile = predicted_profile(board.model, workload, args.batch_sizes, args.samples, frequencies)
    profile.extra["pinned"] = pins
    return profile


def _save_profile(profile: Any, out: Path) -> None:
    """Write the profile, unless it has no point (a file every reader would refuse)."""
    if not profile.points:
        skipped = [s["batch_size"] for s in profile.skipped]
        raise PowerctlError(
            f"no batch size fits in the device's memory (skipped {skipped}): nothing written to {out}; "
            "profile smaller batch sizes"
        )
    profile.save(out)


def cmd_profile(args: argparse.Namespace) -> int:
    from powerctl.files.outputs import check_output_file
    from powerctl.profiling.profiler import Profiler

    step_factory: ModelStepFactory | None = args.step_factory
    if step_factory is None:
        raise PowerctlError(
            "profile needs the training package's steps, which `python -m powerctl` does not load: "
            "run the installed `powerctl` command (or python -m powerfed.training.powerctl_cli)"
        )
    check_output_file(args.out)  # before the profile: its result must not be lost at the end
    if args.predicted:
        profile = _predicted_profile(args, step_factory)
        _save_profile(profile, args.out)
        skipped = [s["batch_size"] for s in profile.skipped]
        say(
            f"wrote {args.out}: {len(profile.points)} predicted points (board model, no training run), "
            f"batch sizes {profile.batch_sizes()}"
            + (f", skipped {skipped} (out of memory)" if skipped else "")
        )
        return 0
    if args.order == "efficient" and args.power_cap is None:
        raise PowerctlError("--order efficient needs --power-cap W (it stops each batch size at the cap)")
    if args.relation is not None and args.order != "fitted":
        raise PowerctlError("--relation is for --order fitted (which confirms the choice it predicts)")
    relation = None
    if args.relation is not None:
        from powerctl.records.relation import RelationVector

        relation = RelationVector.load(args.relation)
        if relation.model != args.model:
            raise PowerctlError(
                f"--relation is of model {relation.model!r}, not {args.model!r}: they do not belong together"
            )
    with open_device(args.device, seed=args.seed, pin=not args.no_pin) as dev:
        workload, make_step = step_factory(
            args.model, torch_device=dev.torch_device(), num_classes=args.num_classes, seed=args.seed
        )
        profile = Profiler(
            dev,
            workload,
            make_step,
            samples=args.samples,
            warmup_steps=args.warmup,
            measure_steps=args.steps,
            rate_hz=args.rate,
        ).run(
            args.batch_sizes,
            order=args.order,
            power_cap_w=args.power_cap,
            relation=None if relation is None else relation.as_map(),
            progress=not args.quiet,
        )
    _save_profile(profile, args.out)
    cost = profile.profiling_seconds or 0.0
    predicted = f" measured, {len(profile.predicted)} predicted (fitted)" if args.order == "fitted" else ""
    say(
        f"wrote {args.out}: {len(profile.points)} points{predicted}, batch sizes {profile.batch_sizes()}"
        + (
            f", skipped {[s['batch_size'] for s in profile.skipped]} (out of memory)"
            if profile.skipped
            else ""
        )
        + f"; profiling took {cost:.1f} device seconds"
        + ("" if profile.extra.get("pinned", True) else f" at the clock in force ({NOT_PINNED})")
    )
    return 0


# --- caps ------------------------------------------------------------------------------------
def cmd_caps(args: argparse.Namespace) -> int:
    from powerctl.records.profile import Profile
    from powerctl.selection.caps import frequency_cap, peak_power_by_frequency

    profiles = [Profile.load(p) for p in args.profile]
    hz = frequency_cap(profiles, args.power_cap)
    peak = peak_power_by_frequency(profiles)[hz]
    if args.json:
        _print_json(
            {
                "power_cap_w": args.power_cap,
                "frequency_hz": hz,
                "peak_power_w": peak,
                "device": profiles[0].device,
                "models": sorted({p.model for p in profiles}),
            }
        )
        return 0
    say(
        f"{_mhz(hz)}: the highest frequency at which every point of the {len(profiles)} profile(s) stays "
        f"under {args.power_cap:g} W (peak {peak:.2f} W)"
    )
    return 0


# --- select / plot ----------------------------------------------------------------------------
def cmd_select(args: argparse.Namespace) -> int:
    from powerctl.records.profile import Profile
    from powerctl.records.relation import RelationVector
    from powerctl.selection.joint import check_pairing, select

    profile = Profile.load(args.profile)
    relation = RelationVector.load(args.relation)
    for warning in check_pairing(profile, relation, allow_mismatch=args.allow_mismatch):
        say(f"{PROG} select: warning: {warning}", file=sys.stderr)
    choice = select(
        profile,
        relation,
        args.power_cap,
        args.objective,
        args.relation_rule,
        allow_mismatch=args.allow_mismatch,
    )
    energy = args.objective == "energy"
    if args.json:
        _print_json(choice.to_json_dict(with_energy=energy))
        return 0
    at = (
        _mhz(choice.frequency_hz)
        if profile.extra.get("pinned", True)
        else f"the clock in force ({NOT_PINNED})"
    )
    say(
        f"batch size {choice.batch_size} at {at}: "
        f"predicted {choice.predicted_seconds:.1f} s "
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
            pred = "-" if row["predicted_seconds"] is None else f"{row['predicted_seconds']:.1f}"
            speed = "-" if row["speedup"] is None else f"{row['speedup']:.2f}x"
            say(
                f"{row['name']:<18} {row['batch_size']:>5} {_pair_mhz(profile, row['frequency_hz'], 8)} "
                f"{peak:>7} {pred:>12} {speed:>17}"
            )
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from powerctl.cli.plot import plot_profile
    from powerctl.files.outputs import check_output_dir
    from powerctl.records.profile import Profile
    from powerctl.records.relation import RelationVector
    from powerctl.selection.joint import check_pairing, select

    check_output_dir(args.out)
    profile = Profile.load(args.profile)
    relation = RelationVector.load(args.relation) if args.relation else None
    selection = None
    if relation is not None:
        for warning in check_pairing(profile, relation, allow_mismatch=args.allow_mismatch):
            say(f"{PROG} plot: warning: {warning}", file=sys.stderr)
        try:
            selection = select(profile, relation, args.power_cap, allow_mismatch=args.allow_mismatch)
        except InfeasibleCapError as exc:
            say(f"{PROG} plot: note: {exc}", file=sys.stderr)
    paths = plot_profile(
        profile, args.out, power_cap_w=args.power_cap, relation=relation, selection=selection
    )
    for p in paths:
        say(p)
    return 0


def cmd_pareto(args: argparse.Namespace) -> int:
    from powerctl.cli.plot import write_front
    from powerctl.files.outputs import check_output_dir
    from powerctl.records.profile import Profile
    from powerctl.records.relation import RelationVector
    from powerctl.selection.joint import check_pairing
    from powerctl.selection.pareto import pareto_front

    check_output_dir(args.out)
    profile = Profile.load(args.profile)
    relation = RelationVector.load(args.relation)
    for warning in check_pairing(profile, relation, allow_mismatch=args.allow_mismatch):
        say(f"{PROG} pareto: warning: {warning}", file=sys.stderr)
    front = pareto_front(profile, relation, args.power_cap)
    paths = write_front(front, profile, relation, args.out)
    if args.json:
        _print_json(front.to_json_dict(profile, relation))
        return 0
    say(
        f"{len(front.pairs)} feasible pairs, {len(front.front)} on the time–energy front"
        + (f" (cap {args.power_cap:g} W)" if args.power_cap else " (no cap)")
    )
    say(f"{'':2}{'b':>5} {'MHz':>8} {'predicted s':>12} {'predicted J':>12} {'peak W':>7}")
    for s in front.front:
        mark = "".join(
            tag
            for tag, best in ((" fastest", front.fastest), (" most frugal", front.most_frugal))
            if s == best
        )
        say(
            f"{'':2}{s.batch_size:>5} {s.frequency_hz / 1e6:>8.1f} {s.predicted_seconds:>12.1f} "
            f"{s.predicted_energy_j:>12.1f} {s.peak_power_w:>7.2f}{mark}"
        )
    for p in paths:
        say(p)
    return 0


def cmd_cap_source(args: argparse.Namespace) -> int:
    from powerctl.selection.capsource import (
        MAX_POINTS,
        CapSourceError,
        ScheduleCap,
        TraceCap,
        parse_cap_source,
    )

    plot = None
    if args.plot:
        from powerctl.files.outputs import check_plot_file

        plot = check_plot_file(args.plot, "--plot", in_folder="cap_source.png")
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
        _print_json(
            {
                "source": source.describe(),
                "lowest_w": source.lowest_w(),
                "points": list(zip(times, caps, strict=True)),
            }
        )
        return 0
    lowest = source.lowest_w()
    say(f"{source.describe()}; lowest {'unknown' if lowest is None else f'{lowest:g} W'}")
    for t, w in zip(times, caps, strict=True):
        say(f"{t:>10.1f} s  {'none' if w is None else f'{w:.2f} W'}")
    if plot is not None:
        say(plot)
    return 0


def cmd_fake_board(args: argparse.Namespace) -> int:
    from powerctl.devices.fakeboard import make_fake_board

    root = make_fake_board(args.folder, args.kind).resolve()
    say(f"fake {args.kind} board written to {root}")
    say(f"use it: export POWERCTL_SYSFS_ROOT={root}; then `powerctl devices` lists it as device 'jetson'")
    return 0


def _add_device_commands(sub: Any, device_help: str) -> None:
    """devices, power, freq: what a board has and its frequency, one reading or one change at a time."""
    s = sub.add_parser("devices", help="list the devices here, with frequency tables and rails")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_devices)

    s = sub.add_parser("power", help="one reading of the power sensor, in W")
    s.add_argument("--device", required=True, help=device_help)
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_power)

    s = sub.add_parser("freq", help="show, pin or restore the GPU frequency")
    s.add_argument("--device", required=True, help=device_help)
    g = s.add_mutually_exclusive_group()
    g.add_argument(
        "--set", type=_frequency, metavar="HZ", help="pin the GPU at HZ (e.g. 614400000 or 614.4MHz)"
    )
    g.add_argument("--restore", action="store_true", help="put back what was there before the first --set")
    s.add_argument("--json", action="store_true", help="print JSON")
    s.set_defaults(func=cmd_freq)


def _add_profile(sub: Any, device_help: str) -> None:
    """profile: the measured (batch size, frequency) grid, or the part of it an order measures."""
    s = sub.add_parser("profile", help="measure peak power and time per (batch size, frequency)")
    s.add_argument("--device", required=True, help=device_help)
    s.add_argument("--model", required=True, help="model name from the training registry, e.g. resnet18")
    s.add_argument("--out", required=True, type=output_path, help="where to write the profile JSON")
    s.add_argument(
        "--batch-sizes", type=batch_sizes, default=[4, 8, 16, 32, 64], help="default: 4,8,16,32,64"
    )
    s.add_argument(
        "--samples", type=SAMPLES, default=10_000, help=SAMPLES.help("N of T_N: samples (default 10000)")
    )
    s.add_argument(
        "--order",
        choices=["grid", "efficient", "fitted"],
        default="grid",
        help="grid: every pair; efficient: stop each batch size at the cap (needs --power-cap); fitted: "
        "measure a few pairs, predict the rest, measure the predicted choice and its neighbour over the cap",
    )
    s.add_argument(
        "--power-cap",
        type=power_cap,
        metavar="W",
        help="power cap in W (for --order efficient and fitted)",
    )
    s.add_argument(
        "--relation",
        type=Path,
        metavar="R",
        help="--order fitted: relation vector JSON; only batch sizes that could win are confirmed "
        "(without it: every batch size)",
    )
    s.add_argument(
        "--warmup",
        type=WARMUP_STEPS,
        default=2,
        help=WARMUP_STEPS.help("warm-up steps per point (default 2)"),
    )
    s.add_argument(
        "--steps",
        type=MEASURED_STEPS,
        default=5,
        help=MEASURED_STEPS.help("measured steps per point (default 5)"),
    )
    s.add_argument(
        "--rate", type=RATE_HZ, default=50.0, help=RATE_HZ.help("power sampling rate in Hz (default 50)")
    )
    s.add_argument(
        "--num-classes", type=NUM_CLASSES, help=NUM_CLASSES.help("classes (image models; default 10)")
    )
    s.add_argument(
        "--seed", type=seed, default=0, help=seed.help("seed of weights, inputs and simulated noise")
    )
    s.add_argument("--quiet", action="store_true", help="no progress bar")
    s.add_argument(
        "--predicted",
        action="store_true",
        help="sim:NAME only: write the board model's noise-free profile without running training steps",
    )
    s.add_argument(
        "--no-pin",
        action="store_true",
        help="never change the GPU frequency (a shared GPU, no root): profile every batch size at the "
        "clock in force; the selection then chooses the batch size alone",
    )
    s.set_defaults(func=cmd_profile)


def _add_caps_and_select(sub: Any) -> None:
    """caps and select: the state of practice's frequency under a cap, and Algorithm 1's pair."""
    s = sub.add_parser(
        "caps", help="state-of-practice frequency: the highest at which every profile stays under a cap"
    )
    s.add_argument(
        "--profile", required=True, action="append", type=Path, help="profile JSON (repeat: all models)"
    )
    s.add_argument("--power-cap", required=True, type=power_cap_w, metavar="W", help="power cap in W")
    s.add_argument("--json", action="store_true", help='print {"power_cap_w", "frequency_hz", ...}')
    s.set_defaults(func=cmd_caps)

    s = sub.add_parser("select", help="the (batch size, frequency) with the least predicted time under a cap")
    s.add_argument("--profile", required=True, type=Path, help="profile JSON (powerctl profile)")
    s.add_argument("--relation", required=True, type=Path, help="relation vector JSON (fl-server relation)")
    s.add_argument("--power-cap", type=power_cap, metavar="W", help="power cap in W (omit or none: no cap)")
    s.add_argument("--compare", action="store_true", help="also print the baselines")
    s.add_argument(
        "--allow-mismatch",
        action="store_true",
        help="combine a relation vector of another model or input than the profile (a warning, not an error)",
    )
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
        help='print {"batch_size", "frequency_hz", "predicted_seconds", "peak_power_w"} '
        '(+ "predicted_energy_j" with --objective energy)',
    )
    s.set_defaults(func=cmd_select)


def _add_pareto_and_cap_source(sub: Any) -> None:
    """pareto and cap-source: the time–energy front, and a cap that changes over time."""
    s = sub.add_parser("pareto", help="the time–energy front of the feasible (batch size, frequency) pairs")
    s.add_argument("--profile", required=True, type=Path, help="profile JSON (powerctl profile)")
    s.add_argument("--relation", required=True, type=Path, help="relation vector JSON (fl-server relation)")
    s.add_argument("--power-cap", type=power_cap, metavar="W", help="power cap in W (omit or none: no cap)")
    s.add_argument("--out", required=True, type=output_path, help="folder for pareto.json and pareto.png")
    s.add_argument("--allow-mismatch", action="store_true", help="as for select")
    s.add_argument("--json", action="store_true", help="print pareto.json's content")
    s.set_defaults(func=cmd_pareto)

    s = sub.add_parser(
        "cap-source", help="check a power cap that changes (schedule, trace, live file) and show it over time"
    )
    s.add_argument(
        "source",
        help="a number of watts, none, a schedule '[[t_s, W], ...]', trace:PATH[?end=repeat|clip&scale=X"
        "&timescale=X] or live:PATH[?poll=S]",
    )
    s.add_argument(
        "--until", type=SPAN_S, metavar="S", help=SPAN_S.help("show up to S seconds (default: one period)")
    )
    s.add_argument(
        "--every", type=STEP_S, metavar="S", help=STEP_S.help("one line every S seconds (default: 60 lines)")
    )
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
    s.set_defaults(func=cmd_cap_source)


def _add_plot_and_fake_board(sub: Any) -> None:
    """plot and fake-board: heat maps of a profile, and a fake Jetson tree to rehearse on."""
    s = sub.add_parser("plot", help="heat maps of peak power and time over (batch size, frequency)")
    s.add_argument("profile", type=Path, help="profile JSON")
    s.add_argument("--out", required=True, type=output_path, help="folder for the PNG files")
    s.add_argument("--power-cap", type=power_cap, metavar="W", help="draw the cap's boundary")
    s.add_argument(
        "--relation", type=Path, help="relation JSON: mark the selected pair, plot time-to-accuracy"
    )
    s.add_argument("--allow-mismatch", action="store_true", help="as for select")
    s.set_defaults(func=cmd_plot)

    from powerctl.devices.fakeboard import KINDS

    s = sub.add_parser(
        "fake-board", help="write a fake Jetson sysfs tree to rehearse on (for POWERCTL_SYSFS_ROOT)"
    )
    s.add_argument("folder", type=Path, help="a new (or empty) folder for the tree")
    s.add_argument(
        "--kind", choices=sorted(KINDS), default="jetson-nano", help="the board (default jetson-nano)"
    )
    s.set_defaults(func=cmd_fake_board)


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Power-aware training on edge GPUs: inspect devices, pin frequencies, profile "
        "(batch size, frequency) pairs, and select the fastest pair under a power cap.",
        epilog="Example: powerctl profile --device sim:jetson-nano --model resnet18-small --out profile.json",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    device_help = f"device spec: {SPEC_HELP}"

    _add_device_commands(sub, device_help)
    _add_profile(sub, device_help)
    _add_caps_and_select(sub)
    _add_pareto_and_cap_source(sub)
    _add_plot_and_fake_board(sub)
    return p


@one_line_errors(PROG)
def main(argv: Sequence[str] | None = None, *, step_factory: ModelStepFactory | None = None) -> int:
    """The command line; `step_factory` is the training step `powerctl profile` measures (None: every
    other command works, `profile` says where to find it)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # --help, or a bad flag (already reported in one line)
        return int(done.code or 0)
    args.step_factory = step_factory
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
