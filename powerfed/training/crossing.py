"""Samples to a target accuracy, finer than the evaluation interval (which alone makes close batch sizes
rank by chance): `crossing_samples` interpolates on the isotonic (non-decreasing) curve, `run_dense` runs
again with a denser interval a run that crossed after too few evaluations."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from powerfed.training.finetune_records import CurvePoint

SMOOTHINGS: tuple[str, ...] = ("isotonic", "none")
DEFAULT_MIN_EVALUATIONS = 8
"""Evaluations a run should take before it crosses: the crossing is then known to ≤ 1/8 of itself
before interpolation; fewer makes close batch sizes rank by chance, more changes nothing."""


Curve: TypeAlias = "Sequence[CurvePoint] | Sequence[tuple[float, float]]"


def _pairs(curve: Curve) -> list[tuple[float, float]]:
    """(samples, accuracy) pairs from CurvePoints or pairs, in sample order."""
    out = []
    for p in curve:
        s, a = (p[0], p[1]) if isinstance(p, tuple | list) else (p.samples, p.accuracy)
        out.append((float(s), float(a)))
    if any(b[0] < a[0] for a, b in itertools.pairwise(out)):
        raise ValueError("a curve's sample counts must not decrease")
    return out


def isotonic(values: Sequence[float]) -> list[float]:
    """The least-squares non-decreasing fit (pool-adjacent-violators), equal weights."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out: list[float] = []
    for s, c in blocks:
        out.extend([s / c] * int(c))
    return out


def crossing_samples(curve: Curve, target: float, *, smoothing: str = "isotonic") -> float | None:
    """Samples at which the (smoothed) curve of CurvePoints or (samples, accuracy) pairs first reaches
    `target`, interpolated; the first evaluation's samples when it meets it, None when none does."""
    pts = _pairs(curve)
    if smoothing == "isotonic":
        pts = list(zip((s for s, _ in pts), isotonic([a for _, a in pts]), strict=True))
    elif smoothing != "none":
        raise ValueError(f"unknown smoothing {smoothing!r}; use one of {', '.join(SMOOTHINGS)}")
    for i, (s, a) in enumerate(pts):
        if a >= target:
            if i == 0:
                return s
            s0, a0 = pts[i - 1]
            if a <= a0:  # flat step onto the target (cannot happen below it): the later point
                return s
            return s0 + (target - a0) / (a - a0) * (s - s0)
    return None


def evaluations_before(curve: Curve, target: float) -> int | None:
    """How many evaluations after the start came before the first raw one at or above `target` (that
    one included): 1 means the run was decided at its first evaluation. None: never reached."""
    for i, (_, a) in enumerate(_pairs(curve)):
        if a >= target:
            return i
    return None


def dense_eval_interval(
    batch_size: int, crossing: float, min_evaluations: int = DEFAULT_MIN_EVALUATIONS
) -> int:
    """The interval (samples) that puts ≥ `min_evaluations` evaluations before `crossing`: a whole
    number of steps of `batch_size`, at least one."""
    if batch_size < 1 or min_evaluations < 1:
        raise ValueError("batch_size and min_evaluations must be ≥ 1")
    steps = max(1, math.floor(crossing / min_evaluations / batch_size))
    return steps * batch_size


def run_dense(
    run: Callable[[int], Any],
    *,
    batch_size: int,
    eval_every_samples: int,
    target: float,
    min_evaluations: int = DEFAULT_MIN_EVALUATIONS,
    smoothing: str = "isotonic",
    replay: Callable[[int], Any | None] | None = None,
) -> tuple[Any, float | None, int]:
    """`run(eval_every_samples)` (a result with `.curve`), run again at `dense_eval_interval` (from the
    same weights and seed; by `replay(interval)` where it does not return None) while it crossed
    `target` too early. Returns (result, interpolated crossing or None, the interval used)."""
    result = run(eval_every_samples)
    while True:  # each pass shrinks the interval; it ends at one step at the latest
        evals = evaluations_before(result.curve, target)
        if evals is None or evals == 0 or evals >= min_evaluations:
            break
        first = crossing_samples(result.curve, target, smoothing=smoothing) or _pairs(result.curve)[evals][0]
        denser = dense_eval_interval(batch_size, first, min_evaluations)
        if denser >= eval_every_samples:
            break
        eval_every_samples = denser
        replayed = replay(denser) if replay is not None else None
        result = replayed if replayed is not None else run(denser)
    return result, crossing_samples(result.curve, target, smoothing=smoothing), eval_every_samples
