"""A chosen (batch size, GPU frequency) and what the choice predicts: the one type every method returns.

Algorithm 1 (`powerctl.selection.joint`), the baselines (`powerctl.selection.baselines`), a method of
the registry (`powerctl.selection.methods`), a cap follower's rule (`powerctl.selection.follow`) and a
client's round all hand a `Pick` on; the wire keeps its own messages (`strategies.protocol`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pick:
    """The chosen (b, f): what the client pins, and what the choice predicts (None: not predicted, e.g.
    the pair was not profiled or the relation lacks its batch size)."""

    batch_size: int
    frequency_hz: int
    predicted_seconds: float | None = None
    """T_N(b, f) · r_b: predicted seconds to the target accuracy, in units of the profile's N samples."""
    peak_power_w: float | None = None
    """The profiled peak power at (b, f)."""
    predicted_energy_j: float | None = None
    """E_N(b, f) · r_b: predicted joules to the target (profile mean power × T_N · r_b)."""
    method: str | None = None
    """Who chose it (a method's name, `powerctl.selection.methods`); None: no method (a fixed pair, a
    selection)."""
    meets_deadline: bool | None = None
    """Energy-under-deadline rounds: whether the pair is predicted to meet the round's deadline (None:
    no deadline)."""

    def to_json_dict(self, *, with_energy: bool = False) -> dict[str, Any]:
        """The `select --json` object (docs/reference/files.md): exactly four keys, plus `predicted_energy_j`
        when asked (the energy objective)."""
        d = {
            "batch_size": self.batch_size,
            "frequency_hz": self.frequency_hz,
            "predicted_seconds": self.predicted_seconds,
            "peak_power_w": self.peak_power_w,
        }
        if with_energy:
            d["predicted_energy_j"] = self.predicted_energy_j
        return d
