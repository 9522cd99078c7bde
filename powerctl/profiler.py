"""Profile a device: peak power and time per (batch size, GPU frequency) for one training step.

The step is a callable made by the caller (the profiler knows nothing of models), run through
`Device.run_step`, so the same code profiles a real Jetson, an NVML GPU or a simulated board.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tqdm import tqdm

from powerctl.devices.base import Device
from powerctl.errors import DeviceError, DeviceOutOfMemory
from powerctl.monitor import PowerMonitor
from powerctl.profile_table import Profile, ProfilePoint
from powerctl.safety import restore_on_exit
from powerctl.workload import Workload

StepFactory = Callable[[int], Callable[[], Any]]
"""batch size → a zero-argument training step on a batch of that size (model, optimizer, data bound)."""

ORDERS = ("grid", "efficient")


def _is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, DeviceOutOfMemory):
        return True
    return type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()


def _free_accelerator_memory() -> None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


class Profiler:
    """Measures points one at a time; `run` walks a grid or the efficient order of DESIGN §1."""

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
        if not device.frequencies():
            raise DeviceError(
                f"{device.spec} has no GPU frequency knob to profile; "
                "use a Jetson, nvml:INDEX or sim:jetson-nano"
            )
        if not device.has_power_sensor:
            raise DeviceError(f"{device.spec} has no power sensor to profile with")
        if samples < 1 or warmup_steps < 0 or measure_steps < 1:
            raise ValueError("samples and measure_steps must be ≥ 1, warmup_steps ≥ 0")
        self.device, self.workload, self.make_step = device, workload, make_step
        self.samples, self.warmup_steps, self.measure_steps, self.rate_hz = (
            samples,
            warmup_steps,
            measure_steps,
            rate_hz,
        )
        self._steps: dict[int, Callable[[], Any]] = {}
        self.skipped: dict[int, str] = {}

    def _step_for(self, batch_size: int) -> Callable[[], Any] | None:
        """The step of this batch size, or None once it is known not to fit."""
        if batch_size in self.skipped:
            return None
        if batch_size not in self._steps:
            try:
                self._steps = {batch_size: self.make_step(batch_size)}  # keep one batch size alive
            except Exception as exc:
                if not _is_out_of_memory(exc):
                    raise
                self._skip(batch_size, exc)
                return None
        return self._steps[batch_size]

    def _skip(self, batch_size: int, exc: BaseException) -> None:
        self.skipped[batch_size] = f"out of memory: {exc}"
        self._steps.pop(batch_size, None)
        _free_accelerator_memory()

    def measure(self, batch_size: int, hz: int) -> ProfilePoint | None:
        """Pin `hz`, warm up, then time `measure_steps` steps under the power monitor."""
        step = self._step_for(batch_size)
        if step is None:
            return None
        dev = self.device
        dev.pin_frequency(hz)
        try:
            for _ in range(self.warmup_steps):
                dev.run_step(step, batch_size=batch_size, workload=self.workload)
            with PowerMonitor(dev, self.rate_hz) as monitor:
                t0 = dev.clock()
                for _ in range(self.measure_steps):
                    dev.run_step(step, batch_size=batch_size, workload=self.workload)
                t1 = dev.clock()
        except Exception as exc:
            if not _is_out_of_memory(exc):
                raise
            self._skip(batch_size, exc)
            return None
        reading = monitor.reading
        assert reading is not None  # the constructor checked for a sensor
        per_batch = (t1 - t0) / self.measure_steps
        return ProfilePoint(
            batch_size=batch_size,
            frequency_hz=hz,
            peak_power_w=reading.peak_w,
            mean_power_w=min(reading.mean_w, reading.peak_w),
            seconds_per_batch=per_batch,
            seconds_for_samples=per_batch * self.samples / batch_size,
        )

    def run(
        self,
        batch_sizes: Sequence[int],
        *,
        frequencies: Sequence[int] | None = None,
        order: str = "grid",
        power_cap_w: float | None = None,
        progress: bool = True,
    ) -> Profile:
        """Profile and restore the device's frequency afterwards, whatever happens."""
        if order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
        if order == "efficient" and power_cap_w is None:
            raise ValueError("the efficient order needs a power cap (it stops each batch size at the cap)")
        table = sorted(frequencies or self.device.frequencies())
        unknown = set(table) - set(self.device.frequencies())
        if unknown:
            raise DeviceError(f"{sorted(unknown)} Hz not in the frequency table of {self.device.spec}")
        sizes = sorted(set(batch_sizes), reverse=True)
        total = len(sizes) * len(table)
        points: list[ProfilePoint] = []
        start = self.device.clock()
        with (
            restore_on_exit(self.device),
            tqdm(total=total, desc=f"profiling {self.device.spec}", unit="pt", disable=not progress) as bar,
        ):
            if order == "grid":
                for b in sizes:
                    for f in table:
                        if (p := self.measure(b, f)) is not None:
                            points.append(p)
                        bar.update()
            else:
                assert power_cap_w is not None
                points = self._efficient(sizes, table, power_cap_w, bar)
                bar.update(total - bar.n)
        self._steps.clear()
        return Profile(
            device=self.device.board,
            model=self.workload.model,
            input_shape=list(self.workload.input_shape),
            samples=self.samples,
            points=sorted(points, key=lambda p: (p.batch_size, p.frequency_hz)),
            profiling_seconds=self.device.clock() - start,
            skipped=[{"batch_size": b, "reason": why} for b, why in sorted(self.skipped.items())],
            extra={
                "order": order,
                "power_cap_w": power_cap_w,
                "warmup_steps": self.warmup_steps,
                "measure_steps": self.measure_steps,
                "workload": self.workload.to_dict(),
            },
        )

    def _efficient(self, sizes: list[int], table: list[int], cap: float, bar: tqdm) -> list[ProfilePoint]:
        """DESIGN §1: largest batch from the lowest frequency up until the cap is crossed; each
        smaller batch starts at the highest frequency feasible for the previous one."""
        points: list[ProfilePoint] = []
        start = 0
        for b in sizes:
            for i in range(start, len(table)):
                p = self.measure(b, table[i])
                bar.update()
                if p is None:
                    break  # does not fit: next batch size
                points.append(p)
                if p.peak_power_w > cap:
                    break
                start = i
        return points


def profile_device(
    device: Device,
    workload: Workload,
    make_step: StepFactory,
    *,
    batch_sizes: Sequence[int],
    samples: int,
    frequencies: Sequence[int] | None = None,
    order: str = "grid",
    power_cap_w: float | None = None,
    warmup_steps: int = 2,
    measure_steps: int = 5,
    rate_hz: float = 50.0,
    progress: bool = True,
) -> Profile:
    """Profile `device` for `workload` (see `Profiler`); returns the profile table of DESIGN §5."""
    profiler = Profiler(
        device,
        workload,
        make_step,
        samples=samples,
        warmup_steps=warmup_steps,
        measure_steps=measure_steps,
        rate_hz=rate_hz,
    )
    return profiler.run(
        batch_sizes, frequencies=frequencies, order=order, power_cap_w=power_cap_w, progress=progress
    )
