"""Following a power cap that changes while training (docs/design/changing-caps.md): re-select (b, f) with
the method's own rule when it changes, pause at the lowest frequency when nothing fits. The loop meets it as
a step hook.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from powerctl.errors import InfeasibleCapError, PowerctlError
from powerctl.files.mapping import Choice, Maybe, kind_field
from powerctl.records.pick import Pick
from powerctl.selection.capsource import CapSource, cap_text
from powerctl.selection.guard import AMOUNT, COUNT, DEFAULT_TOLERANCE, DEFAULT_WINDOW, PowerGuard, StepDown

if TYPE_CHECKING:  # annotations only: the run settings read this module's defaults without a device
    from powerctl.devices.base import Device, PowerSamples

DEFAULT_POLL_S = 1.0
"""How often a paused fine-tune reads its cap again (device seconds)."""
POLL_S_RANGE = (0.01, 3600.0)
"""The poll intervals `cap-poll-s` takes: a read at most every 10 ms, at least once an hour."""
DEFAULT_PAUSE_TIMEOUT_S = 1800.0
"""The longest a fine-tune waits, paused, for its cap to rise before it gives up."""


class CapPauseTimeout(PowerctlError):
    """No (b, f) fitted under the cap for longer than the pause time-out: training stops."""


Chooser = Callable[[float | None], Pick]
"""The method's rule for a cap (None: no cap); raises InfeasibleCapError when nothing fits."""


@dataclass
class CapEvent:
    """One thing the follower did (start, switch, hold, pause, resume) at `t_s` device seconds."""

    t_s: float = kind_field(AMOUNT)
    kind: str = kind_field(Choice(("start", "switch", "hold", "pause", "resume")))
    power_cap_w: float | None = kind_field(Maybe(AMOUNT))
    old_batch_size: int = kind_field(COUNT)
    old_frequency_hz: int = kind_field(COUNT)
    new_batch_size: int = kind_field(COUNT)
    new_frequency_hz: int = kind_field(COUNT)
    fraction_done: float = kind_field(AMOUNT)
    """Of the way to the target, by the relation vector (0 without one)."""
    predicted_remaining_s: float | None = kind_field(Maybe(AMOUNT))
    in_step_over_cap_s: float = kind_field(AMOUNT, 0.0)
    """Seconds over the cap of the step in progress at the change (not preventable: at most one step)."""
    over_cap_s: float = kind_field(AMOUNT, 0.0)
    """Seconds measured over the cap after that until the next event: what the follower did not prevent."""


class CapFollower:
    """Re-selects (b, f) when the cap changes: `start()` once, then `before_step` and `after_step`."""

    def __init__(
        self,
        device: Device,
        caps: CapSource,
        choose: Chooser,
        *,
        samples_to_target: Mapping[int, float] | None = None,
        poll_s: float = DEFAULT_POLL_S,
        pause_timeout_s: float = DEFAULT_PAUSE_TIMEOUT_S,
        guard_window: int = DEFAULT_WINDOW,
        guard_tolerance: float = DEFAULT_TOLERANCE,
    ) -> None:
        self.device, self.caps, self._choose = device, caps, choose
        self._r = dict(samples_to_target or {})
        self.poll_s, self.pause_timeout_s = poll_s, pause_timeout_s
        self._window, self._tolerance = guard_window, guard_tolerance
        self.events: list[CapEvent] = []
        self.paused_s = 0.0
        self.over_cap_s = 0.0
        self._guard: PowerGuard | None = None
        self._t0 = 0.0
        self._cap: float | None = None
        self.batch_size = self.frequency_hz = 0
        self._fraction = 0.0
        self._samples_at_switch = 0
        self._last_sample: tuple[float, float] | None = None
        self._step_over_s = 0.0

    @property
    def guard(self) -> PowerGuard | None:
        """The power guard for the cap in force (None: no cap now, or no sensor)."""
        return self._guard if self._cap is not None else None

    @property
    def step_downs(self) -> list[StepDown]:
        """What its power guard did, over every cap."""
        return [] if self._guard is None else self._guard.step_downs

    def elapsed_s(self) -> float:
        return self.device.clock() - self._t0

    def start(self) -> Pick:
        """Select for the cap at t = 0 and pin it (pausing first if nothing fits yet)."""
        self._t0 = self.device.clock()
        return self._pick_or_pause(self.caps.cap_at(0.0), samples=0, first=True)

    def before_step(self, samples: int) -> int | None:
        """The new batch size when the cap's change changes it, else None (a new frequency is pinned)."""
        cap = self.caps.cap_at(self.elapsed_s())
        if cap == self._cap:
            return None
        old_b = self.batch_size
        self._pick_or_pause(cap, samples)  # the cap in force once a pair is applied (`_apply`)
        return self.batch_size if self.batch_size != old_b else None

    def after_step(self, power: PowerSamples, device_s: float) -> None:
        """The step's power readings: the cap's guard checks them, and time over the cap is counted."""
        if (guard := self.guard) is not None:
            guard.after_step(power, device_s)
            self.frequency_hz = guard.frequency_hz  # (not an earlier cap's guard: it pins nothing now)
        self._count_over_cap(power)

    def _pick_or_pause(self, cap: float | None, samples: int, first: bool = False) -> Pick:
        r_b = self._r.get(self.batch_size)
        if r_b:
            self._fraction = min(1.0, self._fraction + (samples - self._samples_at_switch) / r_b)
        self._samples_at_switch = samples
        old = (self.batch_size, self.frequency_hz)
        try:
            pick = self._choose(cap)
        except InfeasibleCapError:
            return self._pause(cap, old)
        self._apply(pick, cap)
        new = (pick.batch_size, pick.frequency_hz)
        self._event("start" if first else ("switch" if new != old else "hold"), cap, old, pick)
        return pick

    def _pause(self, cap: float | None, old: tuple[int, int]) -> Pick:
        lowest = self.device.frequencies()[0]
        self.device.pin_frequency(lowest)
        self.frequency_hz = lowest
        self._event("pause", cap, old)
        waited = 0.0
        while True:
            if waited >= self.pause_timeout_s:
                raise CapPauseTimeout(
                    f"{self.device.spec}: no (batch size, frequency) pair fits under the cap "
                    f"({cap_text(cap)}) for {waited:g} s, the pause time-out; training stopped "
                    "rather than exceed it (raise the cap or the time-out)"
                )
            t_before = self.device.clock()
            self.device.idle(self.poll_s)
            idle_s = self.device.clock() - t_before
            waited += idle_s
            self.paused_s += idle_s
            cap = self.caps.cap_at(self.elapsed_s())
            try:
                pick = self._choose(cap)
            except InfeasibleCapError:
                continue
            paused_at = (self.batch_size or pick.batch_size, self.frequency_hz)
            self._apply(pick, cap)
            self._event("resume", cap, paused_at, pick)
            return pick

    def _apply(self, pick: Pick, cap: float | None) -> None:
        if pick.frequency_hz != self.frequency_hz or not self.device.is_pinned:
            self.device.pin_frequency(pick.frequency_hz)
        self.batch_size, self.frequency_hz = pick.batch_size, pick.frequency_hz
        self._cap = cap
        if cap is not None and self.device.has_power_sensor:
            if self._guard is None:
                self._guard = self._new_guard(cap, pick.frequency_hz)
            else:
                self._guard.retarget(cap, pick.frequency_hz)

    def _new_guard(self, cap: float, hz: int) -> PowerGuard:
        return PowerGuard(self.device, cap, hz, window=self._window, tolerance=self._tolerance)

    def _event(self, kind: str, cap: float | None, old: tuple[int, int], pick: Pick | None = None) -> None:
        """What the follower did: from `old` to the pair in force now (`pick`'s, but for a pause)."""
        predicted = None if pick is None else pick.predicted_s
        in_step, self._step_over_s = self._step_over_s, 0.0
        if self.events and in_step:  # the step just run was the one in progress at the change
            self.events[-1].over_cap_s -= in_step
        self.events.append(
            CapEvent(
                t_s=self.elapsed_s(),
                kind=kind,
                power_cap_w=cap,
                old_batch_size=old[0],
                old_frequency_hz=old[1],
                new_batch_size=self.batch_size,
                new_frequency_hz=self.frequency_hz,
                fraction_done=self._fraction,
                predicted_remaining_s=None if predicted is None else predicted * (1.0 - self._fraction),
                in_step_over_cap_s=in_step,
            )
        )

    def _count_over_cap(self, samples: PowerSamples) -> None:
        """Seconds over the cap × (1 + tolerance): each reading stands for the interval since the previous
        one, held to the lower of the caps at its two ends (erring towards more time over the cap)."""
        prev = self._last_sample
        self._step_over_s = 0.0
        for t, w in samples:
            if prev is not None and t > prev[0]:
                ends = (self.caps.cap_at(prev[0] - self._t0), self.caps.cap_at(t - self._t0))
                cap = min((c for c in ends if c is not None), default=None)
                if cap is not None and w > cap * (1.0 + self._tolerance):
                    dt = t - prev[0]
                    self.over_cap_s += dt
                    at = next((e for e in reversed(self.events) if e.t_s < t - self._t0), None)
                    if at is not None:
                        at.over_cap_s += dt
                        if at is self.events[-1]:  # not the idle of a pause before a resume
                            self._step_over_s += dt
            prev = (t, w)
        self._last_sample = prev

    def resume_state(self) -> dict[str, Any]:
        """What a resumed fine-tune needs to continue following (JSON-serialisable)."""
        return {
            "elapsed_s": self.elapsed_s(),
            "cap": self._cap,
            "pair": [self.batch_size, self.frequency_hz],
            "fraction": self._fraction,
            "samples_at_switch": self._samples_at_switch,
            "paused_s": self.paused_s,
            "over_cap_s": self.over_cap_s,
            "events": [asdict(e) for e in self.events],
            "guard": None if self._guard is None else self._guard.resume_state(),
        }

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Continue from `resume_state()` (after the device's own resume state is loaded)."""
        self._t0 = self.device.clock() - float(state["elapsed_s"])
        b, hz = (int(v) for v in state["pair"])
        self._fraction, self._samples_at_switch = float(state["fraction"]), int(state["samples_at_switch"])
        self.paused_s, self.over_cap_s = float(state["paused_s"]), float(state["over_cap_s"])
        self.events = [CapEvent(**e) for e in state["events"]]
        self.frequency_hz = 0  # pinned afresh
        self._apply(Pick(b, hz), state["cap"])  # the cap in force, its guard
        if (guard := state.get("guard")) is not None:
            if self._guard is None:  # no cap in force: an earlier cap's guard, kept for its step-downs
                self._guard = self._new_guard(float(guard["power_cap_w"]), int(guard["frequency_hz"]))
            self._guard.load_resume_state(guard)
        self._last_sample = None
