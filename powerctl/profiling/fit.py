"""A few-parameter model of a profile fitted to a few measured points (docs/design/fitted-profiling.md):
power ``P(b, f) = p0 + u_b · (d1·x + d3·x³)`` and step time ``T(b, f) = g0 + g1·b + (α·b + β·√b) / x``,
``x = f / f_max``, by least squares with coefficients ≥ 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from powerctl.records.profile import ProfilePoint

_ALTERNATIONS = 10  # rounds of alternating least squares (power curve, utilisations): a starting point
_REFINE_STEPS = 100  # Gauss-Newton steps from there (a handful suffice; the bound guards odd inputs)


def _nonneg_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients ≥ 0, exactly: every set of free columns (2^k, k ≤ 4) is solved
    unbounded and the least residual among the all-≥ 0 solutions wins (the optimum is among them)."""
    k = a.shape[1]
    best, best_err = np.zeros(k), float(y @ y)  # no free column: every coefficient 0
    for mask in range(1, 1 << k):
        free = [j for j in range(k) if mask >> j & 1]
        sol, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
        if (sol < 0).any():
            continue
        coef = np.zeros(k)
        coef[free] = sol
        r = a @ coef - y
        err = float(r @ r)
        if err < best_err:
            best, best_err = coef, err
    return best


@dataclass(frozen=True)
class ProfileFit:
    """The fitted coefficients (the module doc); `predict` gives a profile point."""

    f_max_hz: int
    p0_w: float
    d1_w: float
    d3_w: float
    utilisation: dict[int, float]
    g0_s: float
    g1_s: float
    alpha_s: float
    beta_s: float
    mean_to_peak: float  # measured mean over peak power (median): a predicted point's mean is this × peak

    def dynamic_w(self, hz: int) -> float:
        """D(f): dynamic power at utilisation 1 (the reference batch size)."""
        x = hz / self.f_max_hz
        return self.d1_w * x + self.d3_w * x**3

    def peak_power_w(self, batch_size: int, hz: int) -> float:
        return self.p0_w + self.utilisation[batch_size] * self.dynamic_w(hz)

    def seconds_per_batch(self, batch_size: int, hz: int) -> float:
        compute = self.alpha_s * batch_size + self.beta_s * math.sqrt(batch_size)
        return self.g0_s + self.g1_s * batch_size + compute / (hz / self.f_max_hz)

    def predict(self, batch_size: int, hz: int, samples: int) -> ProfilePoint:
        """The point at (b, f) as the fit predicts it (b must be a fitted batch size)."""
        peak = self.peak_power_w(batch_size, hz)
        per_batch = self.seconds_per_batch(batch_size, hz)
        return ProfilePoint(
            batch_size, hz, peak, peak * self.mean_to_peak, per_batch, per_batch * samples / batch_size
        )

    def to_dict(self) -> dict[str, object]:
        return asdict(self) | {"utilisation": {str(b): u for b, u in sorted(self.utilisation.items())}}


def _refine_power(
    coef: np.ndarray, u: np.ndarray, x: np.ndarray, index: np.ndarray, power: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Damped Gauss-Newton on (p0, d1, d3, u_b except the reference's), coefficients ≥ 0."""
    n = len(u) - 1
    theta = np.concatenate([coef, u[:-1]])

    def residual(t: np.ndarray) -> np.ndarray:
        uu = np.append(t[3:], 1.0)[index]
        return t[0] + uu * (t[1] * x + t[2] * x**3) - power

    damping, err = 1e-3, float(np.sum(residual(theta) ** 2))
    for _ in range(_REFINE_STEPS):
        uu = np.append(theta[3:], 1.0)[index]
        curve = theta[1] * x + theta[2] * x**3
        jac = np.zeros((len(x), 3 + n))
        jac[:, 0], jac[:, 1], jac[:, 2] = 1.0, uu * x, uu * x**3
        for i in range(n):
            jac[index == i, 3 + i] = curve[index == i]
        r = residual(theta)
        lhs = jac.T @ jac
        step = np.linalg.solve(lhs + damping * np.diag(np.diag(lhs) + 1e-12), -jac.T @ r)
        trial = np.maximum(theta + step, [0.0, 0.0, 0.0, *([1e-6] * n)])
        trial_err = float(np.sum(residual(trial) ** 2))
        if trial_err < err:
            theta, damping = trial, damping / 10
            if err - trial_err <= 1e-15 * max(err, 1e-30):
                break
            err = trial_err
        else:
            damping *= 10
            if damping > 1e12:
                break
    return theta[:3], np.append(theta[3:], 1.0)


def fit_profile(points: Iterable[ProfilePoint], f_max_hz: int) -> ProfileFit:
    """Fit power and step time to measured points; needs the largest batch at ≥ 2 frequencies (3 for the
    full power curve) and every other batch size at ≥ 1. Raises ValueError when that is not there."""
    pts = list(points)
    sizes = sorted({p.batch_size for p in pts})
    if not sizes or len({p.frequency_hz for p in pts if p.batch_size == sizes[-1]}) < 2:
        raise ValueError("the fit needs the largest batch size measured at 2 or more frequencies")
    b = np.array([p.batch_size for p in pts], dtype=float)
    x = np.array([p.frequency_hz / f_max_hz for p in pts])
    power = np.array([p.peak_power_w for p in pts])
    step = np.array([p.seconds_per_batch for p in pts])
    index = np.array([sizes.index(p.batch_size) for p in pts])

    # power: a start from alternating least squares (the curve given the utilisations, then each u_b given
    # the curve), then Gauss-Newton on all of them at once, which converges where alternation crawls
    u = np.ones(len(sizes))
    coef = np.zeros(3)
    for _ in range(_ALTERNATIONS):
        a = np.column_stack([np.ones_like(x), u[index] * x, u[index] * x**3])
        coef = _nonneg_lstsq(a, power)
        curve = coef[1] * x + coef[2] * x**3
        for i in range(len(sizes) - 1):  # the reference batch keeps u = 1: the curve carries the scale
            mine = index == i
            denom = float(np.sum(curve[mine] ** 2))
            if denom > 0:
                u[i] = max(float(np.sum((power[mine] - coef[0]) * curve[mine])) / denom, 1e-6)
    coef, u = _refine_power(coef, u, x, index, power)
    # time: g0 + g1·b + (α·b + β·√b)/x, relative least squares (step times span decades)
    a = np.column_stack([np.ones_like(b), b, b / x, np.sqrt(b) / x]) / step[:, None]
    g0, g1, alpha, beta = _nonneg_lstsq(a, np.ones_like(step))
    ratios = [p.mean_power_w / p.peak_power_w for p in pts]
    return ProfileFit(
        f_max_hz=f_max_hz,
        p0_w=float(coef[0]),
        d1_w=float(coef[1]),
        d3_w=float(coef[2]),
        utilisation={s: float(u[i]) for i, s in enumerate(sizes)},
        g0_s=float(g0),
        g1_s=float(g1),
        alpha_s=float(alpha),
        beta_s=float(beta),
        mean_to_peak=float(np.median(ratios)),
    )


def seed_frequencies(table: Sequence[int]) -> list[int]:
    """The reference batch's three frequencies: the table's nearest to 1/3, 2/3 and all of the top clock."""
    top = max(table)
    picks = {min(table, key=lambda f: (abs(f - top * share), f)) for share in (1 / 3, 2 / 3, 1.0)}
    return sorted(picks, reverse=True)
