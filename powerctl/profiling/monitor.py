"""Power monitor: samples the sensor during a block of work and gives peak, mean and energy."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from types import TracebackType

from powerctl.devices.base import Device, PowerSampler, PowerSamples
from powerctl.files.mapping import Flag, Number, check_arguments


@dataclass(frozen=True)
class PowerReading:
    peak_w: float
    mean_w: float  # time-weighted mean over the block
    energy_j: float
    seconds: float
    samples: int


def summarize(samples: PowerSamples) -> PowerReading:
    """Peak, time-weighted mean and energy (trapezoid rule) of timestamped samples."""
    if not samples:
        raise ValueError("no power samples")
    peak = max(w for _, w in samples)
    seconds = samples[-1][0] - samples[0][0]
    if seconds <= 0:
        mean = sum(w for _, w in samples) / len(samples)
        return PowerReading(peak, mean, 0.0, 0.0, len(samples))
    energy = sum((t1 - t0) * (w0 + w1) / 2 for (t0, w0), (t1, w1) in pairwise(samples))
    return PowerReading(peak, energy / seconds, energy, seconds, len(samples))


class PowerMonitor:
    """`with PowerMonitor(device, rate_hz) as m: work()` then `m.reading` (None without a sensor)."""

    def __init__(self, device: Device, rate_hz: float = 50.0) -> None:
        check_arguments("PowerMonitor", rate_hz=(rate_hz, Number(0.0, above=True, unit="Hz")))
        self.device, self.rate_hz = device, rate_hz
        self.reading: PowerReading | None = None
        self._sampler: PowerSampler | None = None
        self._seen = 0

    def start(self) -> None:
        """Begin sampling (a no-op without a sensor or while sampling)."""
        self.reading = None
        if self.device.has_power_sensor and self._sampler is None:
            self._sampler = self.device.power_sampler(self.rate_hz)
            self._sampler.start()
            self._seen = 0

    def new_samples(self) -> PowerSamples:
        """The block's samples since the last call (empty without a sensor or while not sampling)."""
        if self._sampler is None:
            return []
        samples = self._sampler.samples_so_far()
        new, self._seen = samples[self._seen :], len(samples)
        return new

    def stop(self, *, keep: bool = True) -> PowerReading | None:
        """End sampling; `reading` summarises the block (None: no sensor, not sampling, or keep=False)."""
        check_arguments("PowerMonitor.stop", keep=(keep, Flag()))
        if self._sampler is None:
            return None
        samples = self._sampler.stop()
        self._sampler = None
        self.reading = summarize(samples) if keep else None
        return self.reading

    def __enter__(self) -> PowerMonitor:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop(keep=exc_type is None)
