"""Power caps that change over time: where a client reads the cap it must stay under, step by step.

The paper assumes a constant cap; a board on a solar panel, a battery or a shared supply has one that
moves. A `CapSource` answers "what is the cap at t?", with t in seconds since the source started: on a
simulated board t is the device clock (so a schedule replays exactly), on a real board wall time. None
means no cap. Sources: `ConstantCap` and `ScheduleCap` (step-wise ``[[t_s, W], ...]``); traces and live
files build on the same interface.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from powerctl.errors import PowerctlError


class CapSourceError(PowerctlError, ValueError):
    """A cap source that cannot be used (unsorted times, negative watts, unreadable file); one line."""


def _watts(value: object, where: str) -> float | None:
    """A cap value: None = no cap, else a positive finite number of watts."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CapSourceError(f"{where}: a cap must be a number of watts or none, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise CapSourceError(f"{where}: a cap must be a positive, finite number of watts, got {value!r}")
    return float(value)


class CapSource(ABC):
    """A power cap as a function of time since the source started."""

    @abstractmethod
    def cap_at(self, t_s: float) -> float | None:
        """The cap in force at `t_s` seconds (None: no cap)."""

    def lowest_w(self) -> float | None:
        """The lowest cap the source will ever give, when known in advance (None: no cap ever, or
        not knowable, e.g. a live file); what "select once for the minimum cap" selects for."""
        return None

    @property
    def is_constant(self) -> bool:
        return False

    @abstractmethod
    def describe(self) -> str:
        """One line for logs and reports."""


@dataclass(frozen=True)
class ConstantCap(CapSource):
    power_cap_w: float | None

    def __post_init__(self) -> None:
        _watts(self.power_cap_w, "constant cap")

    def cap_at(self, t_s: float) -> float | None:
        return self.power_cap_w

    def lowest_w(self) -> float | None:
        return self.power_cap_w

    @property
    def is_constant(self) -> bool:
        return True

    def describe(self) -> str:
        return "none" if self.power_cap_w is None else f"{self.power_cap_w:g} W"


@dataclass(frozen=True)
class ScheduleCap(CapSource):
    """Step-wise: ``steps[i] = (t_s, W)`` holds from t_s until the next step's time; the last one holds
    for ever. Times start at 0 and increase strictly."""

    steps: tuple[tuple[float, float | None], ...]

    @classmethod
    def from_pairs(cls, pairs: Sequence[Sequence[object]], where: str = "schedule") -> ScheduleCap:
        """``[[t_s, W or None], ...]`` → a schedule, or one CapSourceError line naming the step."""
        if not pairs:
            raise CapSourceError(f"{where}: a schedule needs at least one [t_s, W] step")
        steps: list[tuple[float, float | None]] = []
        for i, pair in enumerate(pairs):
            here = f"{where}[{i}]"
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise CapSourceError(f"{here}: expected a step [t_s, W], got {pair!r}")
            t, w = pair
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
                raise CapSourceError(f"{here}: expected a time t_s ≥ 0 in seconds, got {t!r}")
            if steps and t <= steps[-1][0]:
                raise CapSourceError(f"{here}: times must increase, got {t:g} after {steps[-1][0]:g}")
            if not steps and t != 0:
                raise CapSourceError(f"{here}: a schedule starts at t_s = 0, got {t:g}")
            steps.append((float(t), _watts(w, here)))
        return cls(tuple(steps))

    def cap_at(self, t_s: float) -> float | None:
        current = self.steps[0][1]
        for t, w in self.steps:
            if t > t_s:
                break
            current = w
        return current

    def lowest_w(self) -> float | None:
        caps = [w for _, w in self.steps if w is not None]
        return min(caps) if caps else None

    @property
    def is_constant(self) -> bool:
        return len({w for _, w in self.steps}) == 1

    def describe(self) -> str:
        return (
            "schedule ["
            + ", ".join(f"{t:g}s:{'none' if w is None else f'{w:g}W'}" for t, w in self.steps)
            + "]"
        )
