"""bench/noise_scale.py: the gradient noise scale estimate and the corrected relation vector."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from noise_scale import corrected, noise_scale, parameter_sets

from powerctl.records.relation import RelationVector, fit_batch_efficiency


@dataclass
class _Data:
    x: torch.Tensor
    y: torch.Tensor


class _Mean(nn.Module):
    """Predicts the same vector w for every sample: with loss ½|w − y|², sample i's gradient is w − y_i,
    so G = w − E[y], tr(Σ) = Σ_j Var(y_j) and B_simple = tr(Σ) / |w − E[y]|², known exactly."""

    def __init__(self, w: list[float]) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor(w))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w.expand(x.shape[0], -1)


def _half_squared_error(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 0.5 * (out - y).pow(2).sum(dim=1).mean()


@pytest.mark.parametrize(("w", "expected"), [(0.5, 4.0), (2.0, 0.25)])
def test_the_estimate_recovers_a_known_noise_scale(w: float, expected: float) -> None:
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(20_000, 4, generator=gen)  # tr(Σ) = 4, E[y] = 0
    model = _Mean([w] * 4)  # |G|² = 4 w²
    # a big batch of only 2 micro-batches: both of the estimator's finite-batch terms then move the
    # answer by 33-100 % if wrong (|G_big|² = |G|² + tr(Σ)/8, not |G|²), more than its ± 10 % noise
    values, used = noise_scale(
        model, _half_squared_error, _Data(torch.zeros(len(y), 1), y), {"all": ["w"]},
        micro=4, count=2, reps=400, seed=1,
    )  # fmt: skip
    assert used == 400 * 8
    assert values["all"] == pytest.approx(expected, rel=0.15)


def test_a_noisier_source_has_the_larger_noise_scale() -> None:
    gen = torch.Generator().manual_seed(0)
    quiet, noisy = torch.randn(5000, 3, generator=gen), 3 * torch.randn(5000, 3, generator=gen)
    scale = {}
    for name, y in (("quiet", quiet), ("noisy", noisy)):
        values, _ = noise_scale(
            _Mean([1.0] * 3), _half_squared_error, _Data(torch.zeros(len(y), 1), y), {"all": ["w"]},
            micro=4, count=8, reps=30, seed=2,
        )  # fmt: skip
        scale[name] = values["all"]
    assert scale["noisy"] / scale["quiet"] == pytest.approx(9.0, rel=0.3)  # Var × 9, same |G|²


def test_the_correction_stretches_the_critical_batch_size_and_keeps_the_rest() -> None:
    batch_sizes = [4, 8, 16, 32, 64, 128]
    samples = {b: 1000 * (1 + b / 64) for b in batch_sizes}  # exactly the model, b_crit 64
    raw = RelationVector.from_samples("m", "proxy", 0.5, samples)
    fit = fit_batch_efficiency(batch_sizes, [[samples[b]] for b in batch_sizes])
    assert fit.b_crit == pytest.approx(64)
    stretched = corrected(raw, fit.b_crit, 1.5, "proxy+target")
    want = [(1 + b / 96) / (1 + 128 / 96) for b in batch_sizes]
    assert stretched.relation == pytest.approx(want)
    assert corrected(raw, fit.b_crit, 1.0, "same").relation == pytest.approx(raw.relation)
    assert corrected(raw, None, 2.0, "flat") is raw  # no measured growth: nothing to stretch


def test_the_pre_trained_set_leaves_out_the_fresh_head() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    assert parameter_sets(model, vision=False) == {"all": ["0.weight", "0.bias", "2.weight", "2.bias"]}
    sets = parameter_sets(model, vision=True)
    assert sets["pre-trained"] == ["0.weight", "0.bias"]
    assert sets["all"] == ["0.weight", "0.bias", "2.weight", "2.bias"]
