"""A chosen (batch size, GPU frequency) and what the choice predicts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Pick:
    """The chosen (b, f) and what it predicts (None: not predicted)."""

    batch_size: int
    frequency_hz: int
    predicted_s: float | None = None  # T_N(b, f) · r_b: predicted seconds to the target accuracy
    peak_power_w: float | None = None  # the profiled peak power at (b, f)
    predicted_energy_j: float | None = None  # E_N(b, f) · r_b: profile mean power × T_N · r_b
    method: str | None = None  # who chose it (`powerctl.selection.methods`); None: no method
    meets_deadline: bool | None = None  # predicted to meet the round's deadline (None: no deadline)

    def to_json_dict(self, *, with_energy: bool = False) -> dict[str, Any]:
        """The `select --json` object (docs/reference/files.md), with `predicted_energy_j` when asked."""
        keys = ["batch_size", "frequency_hz", "predicted_s", "peak_power_w"]
        return {k: getattr(self, k) for k in keys + (["predicted_energy_j"] if with_energy else [])}
