"""Learning-rate scaling across batch sizes (docs/design/method.md): Adam/AdamW's per-parameter step
gives lr ∝ sqrt(b), not SGD's linear rule. The relation vector compares batch sizes only when each trains
with its own fairly scaled rate, the same rule on every device."""

from __future__ import annotations

import math

LR_RULES = ("sqrt", "linear", "constant")
"""sqrt: Adam/AdamW (the paper, the default); linear: SGD's rule; constant: the same rate for every size."""


def scaled_lr(lr_max: float, batch_size: int, max_batch_size: int, rule: str = "sqrt") -> float:
    """The rate for `batch_size`, given the largest one's: `lr_max · sqrt(batch_size / max_batch_size)`
    by default (`rule` linear: the ratio itself; constant: `lr_max`)."""
    if isinstance(lr_max, bool) or not isinstance(lr_max, (int, float)) or not math.isfinite(lr_max):
        raise ValueError(f"lr_max must be a finite number, got {lr_max!r}")
    if lr_max <= 0:
        raise ValueError(f"lr_max must be > 0, got {lr_max}")
    for name, value in (("batch_size", batch_size), ("max_batch_size", max_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if batch_size > max_batch_size:
        raise ValueError(f"batch_size {batch_size} is larger than max_batch_size {max_batch_size}")
    ratio = batch_size / max_batch_size
    if rule == "sqrt":
        return float(lr_max) * math.sqrt(ratio)
    if rule == "linear":
        return float(lr_max) * ratio
    if rule == "constant":
        return float(lr_max)
    raise ValueError(f"unknown learning-rate rule {rule!r}; use one of {', '.join(LR_RULES)}")
