"""`powerctl profile`: the measured (batch size, frequency) grid, or the part of it an order measures. Its
training steps are not this package's: `main` hands them on as `step_factory`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from powerctl.cli.util import add_command, batch_sizes, bounded_float, bounded_int, power_cap, say, seed
from powerctl.devices import open_device
from powerctl.devices.unpinned import NOT_PINNED
from powerctl.errors import PowerctlError
from powerctl.files.mapping import MAX_COUNT, MAX_STEPS
from powerctl.files.outputs import check_output_file, output_path
from powerctl.records.relation import RelationVector

if TYPE_CHECKING:
    from powerctl.profiling.profiler import StepFactory
    from powerctl.records.workload import Workload

NUM_CLASSES = bounded_int(2, 100_000)  # a classifier needs two at least (the data loader holds to it too)

# a model's training step for `powerctl profile`: (model name, *, torch_device, num_classes, seed) →
# (its workload, batch size → one step)
ModelStepFactory = Callable[..., "tuple[Workload, StepFactory]"]


def _predicted_profile(args: argparse.Namespace, step_factory: ModelStepFactory) -> Any:
    """`--predicted`: the simulated board's noise-free profile, no training step run."""
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


def _save_profile(profile: Any, out: Path) -> str:
    """Write the profile, unless it has no point (a file every reader would refuse); what it skipped."""
    skipped = [s["batch_size"] for s in profile.skipped]
    if not profile.points:
        raise PowerctlError(
            f"no batch size fits in the device's memory (skipped {skipped}): nothing written to {out}; "
            "profile smaller batch sizes"
        )
    profile.save(out)
    return f", skipped {skipped} (out of memory)" if skipped else ""


def cmd_profile(args: argparse.Namespace) -> int:
    """measure peak power and time per (batch size, frequency)"""
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
        skipped = _save_profile(profile, args.out)
        say(
            f"wrote {args.out}: {len(profile.points)} predicted points (board model, no training run), "
            f"batch sizes {profile.batch_sizes()}{skipped}"
        )
        return 0
    if args.order == "efficient" and args.power_cap is None:
        raise PowerctlError("--order efficient needs --power-cap W (it stops each batch size at the cap)")
    if args.relation is not None and args.order != "fitted":
        raise PowerctlError("--relation is for --order fitted (which confirms the choice it predicts)")
    relation = None if args.relation is None else RelationVector.load(args.relation)
    if relation is not None and relation.model != args.model:
        raise PowerctlError(
            f"--relation is of model {relation.model!r}, not {args.model!r}: they do not belong together"
        )
    with open_device(args.device, seed=args.seed, pin=not args.no_pin) as dev:
        workload, make_step = step_factory(
            args.model, torch_device=dev.torch_device(), num_classes=args.num_classes, seed=args.seed
        )
        steps = {"samples": args.samples, "warmup_steps": args.warmup, "measure_steps": args.steps}
        profile = Profiler(dev, workload, make_step, **steps, rate_hz=args.rate).run(
            args.batch_sizes,
            order=args.order,
            power_cap_w=args.power_cap,
            relation=None if relation is None else relation.as_map(),
            progress=not args.quiet,
        )
    skipped = _save_profile(profile, args.out)
    cost = profile.profiling_s or 0.0
    predicted = f" measured, {len(profile.predicted)} predicted (fitted)" if args.order == "fitted" else ""
    say(
        f"wrote {args.out}: {len(profile.points)} points{predicted}, batch sizes {profile.batch_sizes()}"
        + skipped
        + f"; profiling took {cost:.1f} device seconds"
        + ("" if profile.extra.get("pinned", True) else f" at the clock in force ({NOT_PINNED})")
    )
    return 0


def add_profile(sub: Any, device_help: str) -> None:
    """profile: the measured (batch size, frequency) grid, or the part of it an order measures."""
    s = add_command(sub, "profile", cmd_profile)
    s.add_argument("--device", required=True, help=device_help)
    s.add_argument("--model", required=True, help="model name from the training registry, e.g. resnet18")
    s.add_argument("--out", required=True, type=output_path, help="where to write the profile JSON")
    s.add_argument(
        "--batch-sizes", type=batch_sizes, default=[4, 8, 16, 32, 64], help="default: 4,8,16,32,64"
    )
    bounded_int(1, MAX_COUNT).add(s, "--samples", "N of T_N: samples (default 10000)", default=10_000)
    s.add_argument(
        "--order",
        choices=["grid", "efficient", "fitted"],
        default="grid",
        help="grid: every pair; efficient: stop each batch size at the cap (needs --power-cap); fitted: "
        "measure a few pairs, predict the rest, measure the predicted choice and its neighbour over the cap",
    )
    s.add_argument(
        "--power-cap", type=power_cap, metavar="W", help="power cap in W (for --order efficient and fitted)"
    )
    s.add_argument(
        "--relation",
        type=Path,
        metavar="R",
        help="--order fitted: relation vector JSON; only batch sizes that could win are confirmed "
        "(without it: every batch size)",
    )
    bounded_int(0, MAX_STEPS).add(s, "--warmup", "warm-up steps per point (default 2)", default=2)
    bounded_int(1, MAX_STEPS).add(s, "--steps", "measured steps per point (default 5)", default=5)
    rate = bounded_float(0.0, 1000.0)  # sensors update every few ms (INA3221) to every 20-100 ms (NVML)
    rate.add(s, "--rate", "power sampling rate in Hz (default 50)", default=50.0)
    NUM_CLASSES.add(s, "--num-classes", "classes (image models; default 10)")
    seed.add(s, "--seed", "seed of weights, inputs and simulated noise", default=0)
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
