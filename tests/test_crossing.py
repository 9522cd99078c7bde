"""Samples to target read as an interpolated crossing on densely evaluated curves
(powerfed.training.crossing)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from powerfed.training.crossing import (
    crossing_samples,
    dense_eval_interval,
    evaluations_before,
    isotonic,
    run_dense,
)
from powerfed.training.finetune_records import CurvePoint


def test_crossing_is_interpolated_between_the_last_below_and_the_first_at_or_above() -> None:
    curve = [(0, 0.1), (100, 0.3), (200, 0.5)]
    assert crossing_samples(curve, 0.4) == pytest.approx(150.0)  # halfway from 0.3 to 0.5
    assert crossing_samples(curve, 0.5) == pytest.approx(200.0)  # exactly on an evaluation
    assert crossing_samples(curve, 0.35, smoothing="none") == pytest.approx(125.0)


def test_curve_points_and_pairs_read_the_same() -> None:
    points = [CurvePoint(0, 0.0, 0.2), CurvePoint(64, 1.0, 0.3), CurvePoint(128, 2.0, 0.6)]
    assert crossing_samples(points, 0.45) == crossing_samples([(0, 0.2), (64, 0.3), (128, 0.6)], 0.45) == 96.0


def test_met_before_training_is_zero_and_never_met_is_none() -> None:
    assert crossing_samples([(0, 0.7), (100, 0.8)], 0.6) == 0.0
    assert crossing_samples([(0, 0.1), (100, 0.2)], 0.6) is None
    assert evaluations_before([(0, 0.1), (100, 0.2)], 0.6) is None


def test_a_dip_before_the_crossing_is_pooled_by_the_isotonic_fit() -> None:
    # raw: 0.45 at 100, a dip to 0.35 at 200, 0.6 at 300 → the raw crossing of 0.5 is 200 + 0.15/0.25·100
    curve = [(0, 0.1), (100, 0.45), (200, 0.35), (300, 0.6)]
    assert crossing_samples(curve, 0.5, smoothing="none") == pytest.approx(260.0)
    # isotonic pools 0.45 and 0.35 into 0.40: the crossing is 200 + 0.1/0.2·100
    assert isotonic([0.1, 0.45, 0.35, 0.6]) == pytest.approx([0.1, 0.4, 0.4, 0.6])
    assert crossing_samples(curve, 0.5) == pytest.approx(250.0)


def test_evaluations_before_counts_the_deciding_one() -> None:
    assert evaluations_before([(0, 0.1), (50, 0.2), (100, 0.7)], 0.5) == 2
    assert evaluations_before([(0, 0.1), (50, 0.7)], 0.5) == 1


def test_bad_curves_and_settings_fail() -> None:
    with pytest.raises(ValueError, match="must not decrease"):
        crossing_samples([(100, 0.1), (50, 0.2)], 0.5)
    with pytest.raises(ValueError, match="unknown smoothing"):
        crossing_samples([(0, 0.1)], 0.5, smoothing="mean")
    with pytest.raises(ValueError):
        dense_eval_interval(0, 100.0)


def test_dense_interval_is_whole_steps_and_at_least_one() -> None:
    assert dense_eval_interval(4, 800.0, 8) == 100  # 25 steps of 4
    assert dense_eval_interval(32, 800.0, 8) == 96  # 100 samples floor to 3 steps
    assert dense_eval_interval(128, 300.0, 8) == 128  # less than a step: one step


def _linear_run(calls: list[int], slope_per_sample: float = 1 / 1000, stop: float = 0.5):
    """A run whose accuracy is samples · slope, evaluated every `every` samples, stopping at `stop`."""

    def run(every: int) -> SimpleNamespace:
        calls.append(every)
        curve, s = [(0, 0.0)], 0
        while curve[-1][1] < stop:
            s += every
            curve.append((s, s * slope_per_sample))
        return SimpleNamespace(curve=curve)

    return run


def test_a_run_that_crossed_too_early_is_run_again_denser() -> None:
    calls: list[int] = []
    result, crossing, every = run_dense(
        _linear_run(calls), batch_size=10, eval_every_samples=400, target=0.5, min_evaluations=8
    )
    # first at 400: crossed at its 2nd evaluation (800, interpolated 500); again every 500/8 → 6 steps
    # of 10 = 60 samples: it crosses at its 9th evaluation (540)
    assert calls == [400, 60] and every == 60
    assert evaluations_before(result.curve, 0.5) == 9
    assert crossing == pytest.approx(500.0)


def test_a_run_with_enough_evaluations_runs_once() -> None:
    calls: list[int] = []
    _, crossing, every = run_dense(
        _linear_run(calls), batch_size=10, eval_every_samples=50, target=0.5, min_evaluations=8
    )
    assert calls == [50] and every == 50 and crossing == pytest.approx(500.0)


def test_a_fast_early_jump_is_run_again_until_it_has_enough_evaluations() -> None:
    """Accuracy jumps to 0.45 within 20 samples and creeps on: a first curve every 400 samples sees
    a straight line from 0 to 400 and puts the crossing of 0.4 far too late; each re-run looks closer."""
    calls: list[int] = []

    def run(every: int) -> SimpleNamespace:
        calls.append(every)
        curve, s = [(0, 0.0)], 0
        while curve[-1][1] < 0.4:
            s += every
            curve.append((s, min(0.45, s * 0.45 / 20)))
        return SimpleNamespace(curve=curve)

    result, crossing, every = run_dense(run, batch_size=1, eval_every_samples=400, target=0.4)
    assert len(calls) > 2 and calls == sorted(calls, reverse=True)
    assert evaluations_before(result.curve, 0.4) >= 8 or every == 1
    assert crossing == pytest.approx(0.4 / 0.45 * 20, rel=0.15)  # the true crossing: 17.8 samples
