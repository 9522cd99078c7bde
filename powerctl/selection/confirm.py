"""The predicted way's confirmation by the training's own first steps (docs/design/profiling-budget.md): a
pair measured over the cap, or slower than another now ranks, is dropped and Algorithm 1 runs again on the
merged profile until the choice is a measured pair under the cap; then the power guard watches.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from powerctl.errors import InfeasibleCapError, PowerctlError, is_out_of_memory
from powerctl.records.pick import Pick
from powerctl.records.profile import Profile, ProfilePoint

if TYPE_CHECKING:  # annotations only
    from powerctl.devices.base import Device, PowerSamples
    from powerctl.selection.guard import PowerGuard

log = logging.getLogger(__name__)

Choose = Callable[[Profile], Pick]
"""The method's rule over a profile (Algorithm 1 under the cap): what is pinned next."""


class NothingConfirmed(PowerctlError):
    """Every pair the prediction offered was measured over the cap: training stops rather than exceed it."""


@dataclass(frozen=True)
class Switch:
    """One pair dropped by its measurement: at `device_s` of training, `old` → `new` (b, Hz)."""

    device_s: float
    old: tuple[int, int]
    new: tuple[int, int]
    measured_w: float
    power_cap_w: float


class TrainingConfirmation:
    """Measures the pair in force and re-picks until it is a measured pair under the cap; then `guard`."""

    def __init__(
        self,
        device: Device,
        prediction: Profile,
        choose: Choose,
        power_cap_w: float,
        first: Pick,
        *,
        warmup_steps: int,
        measure_steps: int,
        guard: PowerGuard | None = None,
    ) -> None:
        if measure_steps < 1 or warmup_steps < 0:
            raise ValueError(f"confirmation needs ≥ 1 measured step, got {warmup_steps}+{measure_steps}")
        self.device, self.prediction, self.choose = device, prediction, choose
        self.power_cap_w, self.guard = power_cap_w, guard
        self.warmup_steps, self.measure_steps = warmup_steps, measure_steps
        self.pick = first
        self.measured: dict[tuple[int, int], ProfilePoint] = {}
        self.switches: list[Switch] = []
        self.skipped: list[dict[str, Any]] = []
        """Batch sizes dropped because a step ran out of memory, with why (as a profile's `skipped`)."""
        self.confirmed = False
        self._pending_batch: int | None = None
        self._steps = 0
        self._since = 0.0
        """Training device seconds when the pair in force started its measured steps."""
        self._peaks: list[float] = []
        self._means: list[float] = []

    @property
    def batch_size(self) -> int:
        return self.pick.batch_size

    @property
    def frequency_hz(self) -> int:
        if self.confirmed and self.guard is not None:
            return int(self.guard.frequency_hz)
        return self.pick.frequency_hz

    def merged(self) -> Profile:
        """The prediction with every measured pair standing for itself."""
        points = [self.measured.get((p.batch_size, p.frequency_hz), p) for p in self.prediction.points]
        return replace(self.prediction, points=points)

    def before_step(self, samples: int) -> int | None:
        """The batch size of a pair picked after the last measurement, once (the guard never changes it)."""
        batch, self._pending_batch = self._pending_batch, None
        return batch

    def after_step(self, power: PowerSamples, device_s: float) -> None:
        """Count the step; at the end of the pair's measured steps, measure it and confirm or re-pick."""
        if self.confirmed:
            if self.guard is not None:
                self.guard.after_step(power, device_s)
            return
        self._steps += 1
        if self._steps <= self.warmup_steps:
            self._since = device_s
            return
        if power:
            watts = [w for _, w in power]
            self._peaks.append(max(watts))
            self._means.append(sum(watts) / len(watts))
        if self._steps < self.warmup_steps + self.measure_steps:
            return
        self._measured(device_s)

    def step_failed(self, exc: Exception) -> int | None:
        """Out of memory at the pair being confirmed: its batch size leaves the prediction (as the profiler
        skips it) and the next choice is pinned; its batch size is returned. Any other failure stands."""
        from powerctl.devices.torchdev import free_accelerator_memory

        if self.confirmed or not is_out_of_memory(exc):
            return None
        b = self.batch_size
        self.skipped.append({"batch_size": b, "reason": f"out of memory: {exc}"})
        free_accelerator_memory()
        left = [p for p in self.prediction.points if p.batch_size != b]
        self.prediction = replace(self.prediction, points=left)
        try:
            pick = self.choose(self.merged()) if left else None
        except InfeasibleCapError:
            pick = None
        if pick is None:
            raise NothingConfirmed(
                f"{self.device.spec}: batch size {b} ran out of memory in training and no other pair "
                f"predicted under the {self.power_cap_w:g} W cap remains: {exc}"
            ) from None
        log.warning(
            "%s: batch size %d ran out of memory in training; dropped, as profiling drops it: "
            "b=%d at %.1f MHz",
            self.device.spec,
            b,
            pick.batch_size,
            pick.frequency_hz / 1e6,
        )
        self._repin(pick)
        self._pending_batch = None
        return pick.batch_size

    def _measured(self, device_s: float) -> None:
        b, hz = self.batch_size, self.pick.frequency_hz
        per_batch = (device_s - self._since) / self.measure_steps
        peak = max(self._peaks, default=0.0)
        mean = sum(self._means) / len(self._means) if self._means else 0.0
        self.measured[(b, hz)] = ProfilePoint.measured(b, hz, peak, mean, per_batch, self.prediction.samples)
        try:
            pick = self.choose(self.merged())
        except InfeasibleCapError as exc:
            raise NothingConfirmed(
                f"{self.device.spec}: no pair predicted under the {self.power_cap_w:g} W cap measured under "
                f"it in training (b={b} at {hz / 1e6:.1f} MHz read {peak:.2f} W): {exc}"
            ) from None
        new = (pick.batch_size, pick.frequency_hz)
        if new == (b, hz):  # the guard already watches it (`_repin`, or built at the first pair)
            self.pick, self.confirmed = pick, True  # its peak and time now the measured ones
            return
        self.switches.append(Switch(device_s, (b, hz), new, peak, self.power_cap_w))
        self._repin(pick, device_s)
        self._pending_batch = pick.batch_size if pick.batch_size != b else None

    def _repin(self, pick: Pick, since: float | None = None) -> None:
        """Pin `pick` and measure it afresh (from `since` device seconds; else after its warm-up)."""
        self.device.pin_frequency(pick.frequency_hz)
        self.pick = pick
        self._steps, self._peaks, self._means = 0, [], []
        if since is not None:
            self._since = since
        if self.guard is not None:  # it watches the pair in force once confirmed
            self.guard.retarget(self.power_cap_w, pick.frequency_hz)
        self.confirmed = (pick.batch_size, pick.frequency_hz) in self.measured  # measured under it before

    def resume_state(self) -> dict[str, Any]:
        """Where the confirmation stands (JSON): the pair in force, what was measured, the guard's."""
        return {
            "pick": asdict(self.pick),
            "measured": [p.to_dict() for p in self.measured.values()],
            "switches": [asdict(s) for s in self.switches],
            "skipped": self.skipped,
            "confirmed": self.confirmed,
            "steps": self._steps,
            "since": self._since,
            "peaks": self._peaks,
            "means": self._means,
            "guard": None if self.guard is None else self.guard.resume_state(),
        }

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Continue from `resume_state()`: the board pinned at the pair in force."""
        points = [ProfilePoint(**p) for p in state["measured"]]
        self.measured = {(p.batch_size, p.frequency_hz): p for p in points}
        self.switches = [
            Switch(**s | {"old": tuple(s["old"]), "new": tuple(s["new"])}) for s in state["switches"]
        ]
        self.skipped = list(state.get("skipped", []))  # checkpoints written before it have none
        dropped = {int(s["batch_size"]) for s in self.skipped}
        left = [p for p in self.prediction.points if p.batch_size not in dropped]
        self.prediction = replace(self.prediction, points=left)
        self._repin(Pick(**state["pick"]))  # then where its measurement stood
        self.confirmed = bool(state["confirmed"])
        self._steps, self._since = int(state["steps"]), state["since"]
        self._peaks, self._means = list(state["peaks"]), list(state["means"])
        if self.confirmed and self.guard is not None and state["guard"] is not None:
            self.guard.load_resume_state(state["guard"])  # watching: where it stepped the board
