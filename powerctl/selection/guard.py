"""The power guard (docs/design/power-guard.md): while training, a step's highest reading over the cap ×
(1 + tolerance) for `window` steps in a row steps the GPU frequency down one level, never back up; at the
lowest level training stops with one PowerCapExceeded line. The loop meets it as a step hook.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from powerctl.errors import PowerctlError
from powerctl.files.mapping import Integer, Number, kind_field

if TYPE_CHECKING:  # annotations only: the run settings read this module's defaults without a device
    from powerctl.devices.base import Device, PowerSamples

DEFAULT_WINDOW = 3
"""Consecutive over-cap checks (training steps) before a step-down."""
DEFAULT_TOLERANCE = 0.02
"""Relative excess over the cap a reading may show before it counts as over (the sensor's noise band)."""
AMOUNT, COUNT = Number(0.0), Integer(0)  # what a reported step-down or cap event holds


class PowerCapExceeded(PowerctlError):
    """Power stayed over the cap at the lowest frequency: training stops rather than exceed it."""


@dataclass(frozen=True)
class StepDown:
    """One guard action: at `device_s` of training, `old_hz` → `new_hz` after reading `measured_w`."""

    device_s: float = kind_field(AMOUNT)
    old_hz: int = kind_field(COUNT)
    new_hz: int = kind_field(COUNT)
    measured_w: float = kind_field(AMOUNT)
    power_cap_w: float = kind_field(AMOUNT)


class PowerGuard:
    """Steps a pinned device down while its measured power stays over the cap (see the module doc)."""

    def __init__(
        self,
        device: Device,
        power_cap_w: float,
        selected_hz: int,
        *,
        window: int = DEFAULT_WINDOW,
        tolerance: float = DEFAULT_TOLERANCE,
    ) -> None:
        self.device, self.window, self.tolerance = device, window, tolerance
        self.retarget(power_cap_w, selected_hz)
        self.step_downs: list[StepDown] = []

    def retarget(self, power_cap_w: float, frequency_hz: int) -> None:
        """A new cap and frequency: the excess count starts again; past step-downs stay recorded."""
        self.power_cap_w, self.frequency_hz = power_cap_w, frequency_hz
        self._lower = sorted(f for f in self.device.frequencies() if f < frequency_hz)
        self._over = 0

    def before_step(self, samples: int) -> int | None:
        """The guard never changes the batch size."""
        return None

    def after_step(self, power: PowerSamples, device_s: float) -> None:
        """Checks the step's highest reading (none: no sensor, nothing to check)."""
        if not power:
            return
        peak_w = max(w for _, w in power)
        if peak_w <= self.power_cap_w * (1.0 + self.tolerance):
            self._over = 0
            return
        self._over += 1
        if self._over < self.window:
            return
        self._over = 0
        if not self._lower:
            raise PowerCapExceeded(
                f"{self.device.spec}: {peak_w:.2f} W over the {self.power_cap_w:g} W cap for {self.window} "
                f"steps at its lowest frequency ({self.frequency_hz / 1e6:.1f} MHz); training stopped"
            )
        new_hz = self._lower.pop()
        self.device.pin_frequency(new_hz)
        self.step_downs.append(StepDown(device_s, self.frequency_hz, new_hz, peak_w, self.power_cap_w))
        self.frequency_hz = new_hz

    def resume_state(self) -> dict[str, Any]:
        """The cap, the frequency stepped down to, the excess count and the step-downs so far (JSON)."""
        return {
            "power_cap_w": self.power_cap_w,
            "frequency_hz": self.frequency_hz,
            "over": self._over,
            "step_downs": [asdict(e) for e in self.step_downs],
        }

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Continue from `resume_state()`: the board is pinned where the guard had stepped it down."""
        hz = int(state["frequency_hz"])
        if hz != self.frequency_hz:
            self.device.pin_frequency(hz)
        self.retarget(float(state["power_cap_w"]), hz)
        self._over = int(state["over"])
        self.step_downs = [StepDown(**e) for e in state["step_downs"]]
