"""Profile a device: peak power and time per (batch size, GPU frequency) of a caller's training step."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from powerctl.devices.base import Device
from powerctl.devices.torchdev import free_accelerator_memory
from powerctl.errors import ArgumentError, DeviceError, is_out_of_memory
from powerctl.files.mapping import (
    MAX_COUNT,
    MAX_STEPS,
    Choice,
    Flag,
    Integer,
    Number,
    check_arguments,
    check_callable,
    is_integer,
    is_number,
    shown,
)
from powerctl.pinning.safety import restore_on_exit
from powerctl.profiling.fit import ProfileFit, fit_profile, seed_frequencies
from powerctl.profiling.monitor import PowerMonitor
from powerctl.progress import progress_bar
from powerctl.records.profile import Profile, ProfilePoint
from powerctl.records.relation import RelationVector
from powerctl.records.workload import Workload
from powerctl.selection.capsource import POWER_CAP_VALUE

StepFactory = Callable[[int], Callable[[], Any]]
"""batch size → a zero-argument training step on a batch of that size (model, optimizer, data bound)."""

ORDERS = ("grid", "efficient", "fitted")

FITTED_MARGIN = 0.10
"""The fitted order confirms every batch size whose optimistic predicted time to the target is within
this share of the best one's: room for a real board's fit errors (docs/results/profiling_cost.md)."""


def _integers(name: str, values: Any) -> list[int]:
    """`Profiler.run`'s batch sizes or frequencies: a non-empty list of integers ≥ 1, as plain ints."""
    if not (isinstance(values, (list, tuple, range)) and len(values)):
        raise ArgumentError(
            f"Profiler.run: {name!r} must be a non-empty list of integers ≥ 1, got {values!r}"
        )
    return [check_arguments("Profiler.run", **{name: (v, Integer(1))})[name] for v in values]


def _relation_map(relation: Any) -> dict[int, float] | None:
    """`Profiler.run`'s `relation` (a RelationVector or such a mapping) as r_b per batch size."""
    if relation is None:
        return None
    if isinstance(relation, RelationVector):
        return relation.as_map()
    if isinstance(relation, Mapping) and all(
        is_integer(b) and b >= 1 and is_number(r) and r > 0 for b, r in relation.items()
    ):
        return {int(b): float(r) for b, r in relation.items()}
    raise ArgumentError(
        "Profiler.run: 'relation' must be a RelationVector (estimate_relation returns one) or a mapping "
        f"batch size → r_b > 0, got {shown(relation)}"
    )


class Profiler:
    """Measures points one at a time; `run` walks the grid, the efficient order (docs/design/method.md) or
    the fitted one (measure a few points, fit, predict, confirm by measuring)."""

    def __init__(
        self,
        device: Device,
        workload: Workload,
        make_step: StepFactory,
        *,
        samples: int,
        warmup_steps: int = 2,
        measure_steps: int = 5,
        rate_hz: float = 50.0,
    ) -> None:
        if not isinstance(device, Device):
            raise ArgumentError(
                f"Profiler: 'device' must be an open Device (open_device('sim:jetson-nano')), got {device!r}"
            )
        if not isinstance(workload, Workload):
            raise ArgumentError(
                f"Profiler: 'workload' must be a Workload (measure_workload(model, x, y)), got {workload!r}"
            )
        if not device.frequencies():
            raise DeviceError(
                f"{device.spec} has no GPU frequency knob to profile"
                + ("" if device.pins else " and no clock in force to read")
                + "; use a Jetson, nvml:INDEX or sim:jetson-nano"
            )
        if not device.has_power_sensor:
            raise DeviceError(f"{device.spec} has no power sensor to profile with")
        checked = check_arguments(  # plain numbers from here on (numpy's converted)
            "Profiler",
            samples=(samples, Integer(1, MAX_COUNT)),
            warmup_steps=(warmup_steps, Integer(0, MAX_STEPS)),  # as `powerctl profile` and the run's
            measure_steps=(measure_steps, Integer(1, MAX_STEPS)),
            rate_hz=(rate_hz, Number(0.0, 10_000.0, above=True, unit="Hz")),
        )
        check_callable("Profiler", "make_step", make_step, "(batch_size), returning the step", 1)
        self.device, self.workload, self.make_step = device, workload, make_step
        self.samples, self.warmup_steps, self.measure_steps, self.rate_hz = checked.values()
        self._steps: dict[int, Callable[[], Any]] = {}
        self.skipped: dict[int, str] = {}

    def measure(self, batch_size: int, hz: int) -> ProfilePoint | None:
        """Pin `hz`, warm up, then time `measure_steps` steps under the power monitor (None: the batch
        size does not fit, now or before). One batch size's step is kept alive at a time."""
        if batch_size in self.skipped:
            return None
        dev = self.device
        try:
            if batch_size not in self._steps:
                self._steps = {batch_size: self.make_step(batch_size)}
                if not callable(self._steps[batch_size]):
                    raise ArgumentError(
                        f"Profiler: make_step({batch_size}) returned {self._steps[batch_size]!r}; it must "
                        "return the step, a callable that runs one training step"
                    )
            step = self._steps[batch_size]
            dev.pin_frequency(hz)
            for _ in range(self.warmup_steps):
                dev.run_step(step, batch_size=batch_size, workload=self.workload)
            with PowerMonitor(dev, self.rate_hz) as monitor:
                t0 = dev.clock()
                for _ in range(self.measure_steps):
                    dev.run_step(step, batch_size=batch_size, workload=self.workload)
                t1 = dev.clock()
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            self.skipped[batch_size] = f"out of memory: {exc}"
            self._steps.pop(batch_size, None)
            free_accelerator_memory()
            return None
        reading = monitor.reading
        assert reading is not None  # the constructor checked for a sensor
        per_batch = (t1 - t0) / self.measure_steps
        return ProfilePoint.measured(batch_size, hz, reading.peak_w, reading.mean_w, per_batch, self.samples)

    def run(
        self,
        batch_sizes: Sequence[int],
        *,
        frequencies: Sequence[int] | None = None,
        order: str = "grid",
        power_cap_w: float | None = None,
        relation: RelationVector | Mapping[int, float] | None = None,
        margin: float = FITTED_MARGIN,
        progress: bool = True,
    ) -> Profile:
        """Profile, restoring the device's frequency whatever happens. `relation` (r_b per batch size) and
        `margin` tell the fitted order which batch sizes are worth confirming (none: all)."""
        where = "Profiler.run"
        checked = check_arguments(
            where, order=(order, Choice(ORDERS)), margin=(margin, Number(0.0)), progress=(progress, Flag())
        )
        order, margin = checked["order"], checked["margin"]
        if order == "efficient" and power_cap_w is None:
            raise ArgumentError(
                f"{where}: 'power_cap_w' must be a number of watts for the efficient order (it stops each "
                "batch size at the power cap), got None"
            )
        batch_sizes = _integers("batch_sizes", batch_sizes)
        if frequencies is not None:  # None: the device's table
            frequencies = _integers("frequencies", frequencies)
        # a number or None: "none" is a command line's word (its reader's, not ours)
        power_cap_w = check_arguments(where, power_cap_w=(power_cap_w, POWER_CAP_VALUE))["power_cap_w"]
        relation = _relation_map(relation)
        table = sorted(frequencies or self.device.frequencies())
        unknown = set(table) - set(self.device.frequencies())
        if unknown:
            raise DeviceError(f"{sorted(unknown)} Hz not in the frequency table of {self.device.spec}")
        sizes = sorted(set(batch_sizes), reverse=True)
        total = len(sizes) * len(table)
        points: list[ProfilePoint] = []
        predicted: list[ProfilePoint] = []
        fit: ProfileFit | None = None
        start = self.device.clock()
        with (
            restore_on_exit(self.device),
            progress_bar(progress, total, f"profiling {self.device.spec}", "pt") as bar,
        ):
            if order == "fitted":
                fitted = _FittedOrder(self, table, power_cap_w, relation, margin, bar)
                points, predicted, fit = fitted.run(sizes)
            else:
                points = self._walk(sizes, table, power_cap_w if order == "efficient" else None, bar)
            bar.update(total - bar.n)  # the pairs an order skipped
        self._steps.clear()
        profile = self.profile(
            sorted(points, key=lambda p: (p.batch_size, p.frequency_hz)),
            {
                "order": order,
                "power_cap_w": power_cap_w,
                # False: measured at the clock in force (powerctl.devices.unpinned), its one frequency
                "pinned": self.device.pins,
                # "instant" or "average" (NVML's smoothed reading: its peaks read low); absent: not said
                **({"power_reading": r} if (r := self.device.power_reading) else {}),
            },
            predicted=sorted(predicted, key=lambda p: (p.batch_size, p.frequency_hz)),
            profiling_s=self.device.clock() - start,
            skipped=[{"batch_size": b, "reason": why} for b, why in sorted(self.skipped.items())],
        )
        if order == "fitted":
            rel = None if relation is None else {str(b): r for b, r in sorted(relation.items())}
            profile.extra |= {"fit": fit.to_dict() if fit else None, "margin": margin, "relation": rel}
        return profile

    def profile(self, points: Sequence[ProfilePoint], extra: dict[str, Any], **fields: Any) -> Profile:
        """A profile of this device and workload: `extra`, then how each point is measured."""
        return Profile(
            device=self.device.board,
            model=self.workload.model,
            input_shape=list(self.workload.input_shape),
            samples=self.samples,
            points=points,
            extra=extra
            | {
                "warmup_steps": self.warmup_steps,
                "measure_steps": self.measure_steps,
                "workload": self.workload.to_dict(),
            },
            **fields,
        )

    def _walk(self, sizes: list[int], table: list[int], cap: float | None, bar: tqdm) -> list[ProfilePoint]:
        """The grid: each batch size, largest first, from the lowest frequency up; with a `cap`, the efficient
        order (docs/design/method.md): each stops past the cap, the next starts at its last feasible one."""
        points: list[ProfilePoint] = []
        start = 0
        for b in sizes:
            for i in range(start, len(table)):
                p = self.measure(b, table[i])
                bar.update()
                if p is None:
                    break  # does not fit: next batch size
                points.append(p)
                if cap is not None:
                    if p.peak_power_w > cap:
                        break
                    start = i
        return points


@dataclass
class _FittedOrder:
    """The fitted order (docs/design/fitted-profiling.md): its points are the measured ones, the predictions
    go to `Profile.predicted`, so a selection on the profile only picks a pair measured under the cap."""

    p: Profiler
    table: list[int]
    cap: float | None
    relation: Mapping[int, float] | None
    margin: float
    bar: tqdm
    measured: dict[tuple[int, int], ProfilePoint] = field(default_factory=dict)

    def _measure(self, b: int, hz: int) -> None:
        if (b, hz) in self.measured or b in self.p.skipped:
            return
        point = self.p.measure(b, hz)
        self.bar.update()
        if point is not None:
            self.measured[b, hz] = point

    def _fit(self) -> ProfileFit | None:
        try:
            return fit_profile(self.measured.values(), max(self.table))
        except ValueError:
            return None

    def _value(self, fit: ProfileFit | None, b: int, hz: int) -> ProfilePoint | None:
        if (b, hz) in self.measured:
            return self.measured[b, hz]
        return None if fit is None or b not in fit.utilisation else fit.predict(b, hz, self.p.samples)

    def _boundary(self, fit: ProfileFit, b: int, utilisation: float) -> int:
        """The highest frequency whose predicted peak at `utilisation` is under the cap (else the lowest)."""
        if self.cap is None:
            return self.table[-1]
        ok = [f for f in self.table if fit.p0_w + utilisation * fit.dynamic_w(f) <= self.cap]
        return ok[-1] if ok else self.table[0]

    def _seed(self, sizes: list[int]) -> list[int]:
        fitted: list[int] = []
        for b in sizes:  # largest first: the first that fits is the reference
            if not fitted:
                for hz in seed_frequencies(self.table):
                    self._measure(b, hz)
            else:
                fit = self._fit()
                hz = self.table[-1] if fit is None else self._boundary(fit, b, fit.utilisation[fitted[-1]])
                self._measure(b, hz)
            if any(key[0] == b for key in self.measured):
                fitted.append(b)
        return fitted

    def _next_to_measure(self, fit: ProfileFit | None, sizes: list[int]) -> tuple[int, int] | None:
        # per batch size: its best feasible pair (predicted seconds to the target, Hz), the neighbour above
        # it (or, with none feasible, the lowest frequency), and an optimistic value: as if that unmeasured
        # neighbour were under the cap
        rows = []
        for b in sizes:
            r_b = 1.0 if self.relation is None else self.relation.get(b)
            if r_b is None:
                continue
            feasible = (
                (point.seconds_for_samples * r_b, hz)
                for hz in self.table
                if (point := self._value(fit, b, hz)) is not None
                and (self.cap is None or point.peak_power_w <= self.cap)
            )
            seconds, hz = min(feasible, default=(math.inf, None))
            i = self.table.index(hz) if hz is not None else -1
            above = self.table[i + 1] if i + 1 < len(self.table) else None
            hopeful = seconds
            point = None if above is None or (b, above) in self.measured else self._value(fit, b, above)
            if point is not None:
                hopeful = min(seconds, point.seconds_for_samples * r_b)
            rows.append((hopeful, seconds, b, hz, above))
        finite = [row for row in rows if math.isfinite(row[0])]
        if not finite:
            return None
        limit = math.inf if self.relation is None else min(row[0] for row in finite) * (1 + self.margin)
        for hopeful, _, b, hz, above in sorted(finite, key=lambda row: (row[1], row[0])):
            if hopeful > limit:
                continue
            if hz is not None and (b, hz) not in self.measured:
                return b, hz
            if above is not None and (b, above) not in self.measured:
                return b, above
        return None

    def run(self, sizes: list[int]) -> tuple[list[ProfilePoint], list[ProfilePoint], ProfileFit | None]:
        fitted = sorted(self._seed(sizes))
        fit = self._fit()
        for _ in range(len(fitted) * len(self.table)):
            todo = self._next_to_measure(fit, fitted)
            if todo is None:
                break
            self._measure(*todo)
            fitted = [b for b in fitted if b not in self.p.skipped]
            fit = self._fit()
        predicted = [
            fit.predict(b, hz, self.p.samples)
            for b in fitted
            for hz in self.table
            if fit is not None and (b, hz) not in self.measured
        ]
        return list(self.measured.values()), predicted, fit
