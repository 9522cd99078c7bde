"""Learning-rate scaling across batch sizes: the square-root rule (DESIGN §1).

Adam/AdamW keep a per-parameter step size, so the gradient-noise argument gives lr ∝ sqrt(b) rather
than the linear rule of SGD. The relation vector is only comparable across batch sizes if every batch
size is trained with its own fairly scaled learning rate, and devices must use the same rule.
"""

from __future__ import annotations

import math

__all__ = ["scaled_lr"]


def scaled_lr(lr_max: float, batch_size: int, max_batch_size: int) -> float:
    """`lr_max · sqrt(batch_size / max_batch_size)`: the rate for `batch_size`, given the largest one's."""
    if isinstance(lr_max, bool) or not isinstance(lr_max, (int, float)) or not math.isfinite(lr_max):
        raise ValueError(f"lr_max must be a finite number, got {lr_max!r}")
    if lr_max <= 0:
        raise ValueError(f"lr_max must be > 0, got {lr_max}")
    for name, value in (("batch_size", batch_size), ("max_batch_size", max_batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if batch_size > max_batch_size:
        raise ValueError(f"batch_size {batch_size} is larger than max_batch_size {max_batch_size}")
    return float(lr_max) * math.sqrt(batch_size / max_batch_size)
