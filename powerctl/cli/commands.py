"""`powerctl` (docs/reference/cli.md): the parser, `main` and the device commands (devices, power, freq,
fake-board); a user error is one line on stderr and exit status 2; nothing on the device is left changed."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from powerctl.cli import PROG
from powerctl.cli.profile_command import ModelStepFactory, add_profile
from powerctl.cli.select_commands import add_select_commands
from powerctl.cli.util import OneLineParser, add_command, mhz, one_line_errors, run_command, say, say_json
from powerctl.devices import SPEC_HELP, open_device
from powerctl.pinning.pinsession import restore_saved


def _frequency(text: str) -> int:
    """`--set HZ`: Hz, or with a kHz, MHz or GHz unit."""
    t = text.strip().lower()
    scale = {"ghz": 1e9, "mhz": 1e6, "khz": 1e3, "hz": 1.0}
    unit = next((u for u in scale if t.endswith(u)), "hz")
    try:
        hz = float(t.removesuffix(unit)) * scale[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"frequency must be in Hz (or with MHz/GHz), got {text!r}") from None
    if not 0 < hz <= 100e9:  # nan and inf too
        raise argparse.ArgumentTypeError(f"frequency must be > 0 and at most 100 GHz, got {text!r}")
    return round(hz)


def cmd_devices(args: argparse.Namespace) -> int:
    """list the devices here, with frequency tables and rails"""
    from powerctl.devices import detect_devices

    devices = detect_devices()
    broken = 2 if any("error" in d for d in devices) else 0  # a device there but unusable: not "no knob"
    if args.json:
        say_json(devices)
        return broken
    for d in devices:
        if "error" in d:
            say(f"{d['spec']:<20} {d.get('board', ''):<18} error: {d['error']}")
            continue
        freqs = d.get("frequencies_hz") or []
        span = (
            f"{len(freqs)} frequencies {mhz(freqs[0])} … {mhz(freqs[-1])}" if freqs else "no frequency knob"
        )
        rails = ", ".join(d.get("rails") or []) or "no power sensor"
        say(f"{d['spec']:<20} {d.get('board', ''):<18} {span}; rails: {rails}")
    return broken


def cmd_power(args: argparse.Namespace) -> int:
    """one reading of the power sensor, in W"""
    with open_device(args.device) as dev:
        total = dev.read_power_w()
        rails = dev.rails()
    if args.json:
        say_json({"device": args.device, "power_w": total, "rails_w": rails})
    else:
        say(f"{total:.3f} W" + "".join(f"\n  {k}: {v:.3f} W" for k, v in rails.items()))
    return 0


def cmd_freq(args: argparse.Namespace) -> int:
    """show, pin or restore the GPU frequency"""
    message = ""
    with open_device(args.device) as dev:
        if args.set is not None:
            dev.pin_frequency(args.set)
            dev.release_snapshot()  # the pin stays after we exit; its record lets --restore undo it
            message = f"pinned {args.device} at {mhz(args.set)}"
        elif args.restore:
            state = restore_saved(dev)
            nothing = f"nothing to restore for {args.device}: no earlier `powerctl freq --set`"
            message = nothing if state is None else f"restored {args.device} to {state}"
        info = {"device": args.device, "current_frequency_hz": dev.current_frequency()}
        info["frequencies_hz"] = dev.frequencies()
    if args.json:
        say_json(info | ({"message": message} if message else {}))
    else:
        if message:
            say(message)
        say(f"current: {mhz(info['current_frequency_hz'])}")
        say("available: " + " ".join(f"{f / 1e6:g}" for f in info["frequencies_hz"]) + " MHz")
    return 0


def cmd_fake_board(args: argparse.Namespace) -> int:
    """write a fake Jetson sysfs tree to rehearse on (for POWERCTL_SYSFS_ROOT)"""
    from powerctl.devices.fakeboard import make_fake_board

    root = make_fake_board(args.folder, args.kind).resolve()
    say(f"fake {args.kind} board written to {root}")
    say(f"use it: export POWERCTL_SYSFS_ROOT={root}; then `powerctl devices` lists it as device 'jetson'")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from powerctl.devices.fakeboard import KINDS

    p = OneLineParser(
        prog=PROG,
        description="Power-aware training on edge GPUs: inspect devices, pin frequencies, profile "
        "(batch size, frequency) pairs, and select the fastest pair under a power cap.",
        epilog="Example: powerctl profile --device sim:jetson-nano --model resnet18-small --out profile.json",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    device_help = f"device spec: {SPEC_HELP}"

    s = add_command(sub, "devices", cmd_devices)
    s.add_argument("--json", action="store_true", help="print JSON")

    s = add_command(sub, "power", cmd_power)
    s.add_argument("--device", required=True, help=device_help)
    s.add_argument("--json", action="store_true", help="print JSON")

    s = add_command(sub, "freq", cmd_freq)
    s.add_argument("--device", required=True, help=device_help)
    g = s.add_mutually_exclusive_group()
    g.add_argument(
        "--set", type=_frequency, metavar="HZ", help="pin the GPU at HZ (e.g. 614400000 or 614.4MHz)"
    )
    g.add_argument("--restore", action="store_true", help="put back what was there before the first --set")
    s.add_argument("--json", action="store_true", help="print JSON")

    add_profile(sub, device_help)
    add_select_commands(sub)

    s = add_command(sub, "fake-board", cmd_fake_board)
    s.add_argument("folder", type=Path, help="a new (or empty) folder for the tree")
    s.add_argument(
        "--kind", choices=sorted(KINDS), default="jetson-nano", help="the board (default jetson-nano)"
    )
    return p


@one_line_errors(PROG)
def main(argv: Sequence[str] | None = None, *, step_factory: ModelStepFactory | None = None) -> int:
    """The command line; `step_factory`: the steps `profile` times (None: `profile` says where they are)."""
    return run_command(build_parser(), argv, step_factory=step_factory)
