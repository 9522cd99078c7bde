"""A device at the clock in force (no root, or `pin = false`): one frequency, a pin at it writes nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from powerctl.devices.base import Device
from powerctl.errors import DeviceError

log = logging.getLogger(__name__)  # a device that profiles at the clock in force, and why (WARNING)

NOT_PINNED = "not pinned"  # the frequency column of a pair measured at the clock in force


class UnpinnedDevice(Device):
    """`inner` at the clock in force, said once in a WARNING line (a command shows it on stderr); `reason`
    says why it is not pinned (kept for the report). It never pins, so Device's `restore`,
    `release_snapshot` and `physical_key` (nothing to lock, record or put back) hold as they are."""

    pins = False

    def __init__(self, inner: Device, reason: str) -> None:
        self.inner, self.reason = inner, reason
        self.spec, self.board, self.recovered = inner.spec, inner.board, inner.recovered
        self.has_power_sensor, self.power_reading = inner.has_power_sensor, inner.power_reading
        hz = inner.clock_in_force()
        self._table = [hz] if hz else []
        line = "%s: frequency %s (%s): profiling and training at the clock in force (%s); the batch size "
        line += "alone is chosen under the cap, nothing is written to the device"
        log.warning(line, self.spec, NOT_PINNED, reason, self._mhz())

    def __getattr__(self, name: str) -> Any:  # what a backend has of its own (a simulated board's model)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def clock_in_force(self) -> int | None:
        return self._table[0] if self._table else None

    def profile_kind(self) -> str:
        """Its own kind per clock in force: a profile at one clock is not valid at another."""
        return f"{type(self.inner).__name__}-not-pinned-{self.clock_in_force()}Hz/{self.board}"

    def pin_frequency(self, hz: int) -> None:
        """Accept the clock in force (what the profile holds) and write nothing; refuse any other."""
        if hz not in self._table:
            raise DeviceError(
                f"{self.spec} is {NOT_PINNED} ({self.reason}): it runs at the clock in force "
                f"({self._mhz()}), not {hz / 1e6:.1f} MHz"
            )

    def _mhz(self) -> str:
        return f"{self._table[0] / 1e6:.1f} MHz" if self._table else "unknown"

    def memory_bytes(self) -> int:
        return self.inner.memory_bytes()

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "frequencies_hz": self.frequencies(), "pinned": False,
                "not_pinned": self.reason}  # fmt: skip


def _forward(name: str) -> Callable[..., Any]:
    def method(self: UnpinnedDevice, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


# Device's defaults that the wrapped device may override: each is the wrapped device's own.
FORWARDED: tuple[str, ...] = ("current_frequency", "read_power_w", "rails", "power_sampler", "clock", "idle")
FORWARDED += ("resume_state", "load_resume_state", "synchronize", "torch_device", "run_step", "close")
for _name in FORWARDED:
    setattr(UnpinnedDevice, _name, _forward(_name))
