"""Bootstrap 95 % intervals over seeds, for the fleet's summary over seeds and the benches. A seed is the
unit resampled: values that share a seed are drawn together, so an interval over them is paired."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DRAWS = 4000
SEED = 0


def paired_resampled_means(
    a: Sequence[float], b: Sequence[float], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Means of `a` and `b` over the SAME resampled seeds (a[i] and b[i] share seed i)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    idx = rng.integers(0, len(x), size=(DRAWS, len(x)))
    return x[idx].mean(axis=1), y[idx].mean(axis=1)


def resampled_means(values: Sequence[float], rng: np.random.Generator) -> np.ndarray:
    """DRAWS means of `values` resampled with replacement (same length)."""
    return paired_resampled_means(values, values, rng)[0]


def interval95(samples: np.ndarray) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles."""
    lo, hi = np.percentile(samples, [2.5, 97.5])
    return float(lo), float(hi)


def mean_interval95(values: Sequence[float]) -> tuple[float, float]:
    """The bootstrap 95 % interval of the mean of `values`, one value per seed, seeds resampled."""
    return interval95(resampled_means(values, np.random.default_rng(SEED)))
