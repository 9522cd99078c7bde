"""The predicted way's confirmation made by the training's first steps (`powerctl.selection.confirm`):
a pair measured over the cap runs only the steps that measured it, the walk ends at the pair the board's
true profile would choose, those steps train, and a board no pair of which fits stops with one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from powerctl.devices.boards import board_model
from powerctl.devices.simulated import SimulatedBoard, predicted_profile
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.selection.confirm import NothingConfirmed, TrainingConfirmation
from powerctl.selection.guard import PowerGuard
from powerctl.selection.joint import select
from powerfed.training.data import load_dataset, train_test_split
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import FineTuneCallbacks, FineTuneConfig
from powerfed.training.models import build_model, model_workload

NANO = board_model("jetson-nano")
SIZES = [8, 16, 32, 64]
CAP_W = 3.0
WARMUP, MEASURE = 1, 2
# the board charges ResNet18-small's step (levels that straddle 3 W); the step that runs is cnn-tiny's
WORKLOAD = model_workload("resnet18-small", build_model("resnet18-small", 10, seed=0))
RELATION = RelationVector.from_samples(
    "resnet18-small", "synthetic-image", 0.7, {8: 1500.0, 16: 1700.0, 32: 2000.0, 64: 2600.0}
)
PREDICTION = predicted_profile(NANO, WORKLOAD, SIZES, 2600)


def _choose(profile: Profile):
    return select(profile, RELATION, CAP_W)


def _run(scale: float, *, max_steps: int = 120, board: SimulatedBoard | None = None):
    """Fine-tune cnn-tiny on a noise-free Nano drawing `scale` × its model's power, the prediction's
    choice pinned and confirmed by the first steps; (result, confirmation, board timeline)."""
    board = board or SimulatedBoard(NANO, noise=False, power_scale=scale)
    train, test = train_test_split(load_dataset("synthetic-image", limit=1200, seed=3), seed=0)
    first = _choose(PREDICTION)
    timeline = board.power_sampler(50.0)
    with board.pinned(first.frequency_hz):
        guard = PowerGuard(board, CAP_W, first.frequency_hz, tolerance=0.0)
        confirm = TrainingConfirmation(
            board, PREDICTION, _choose, CAP_W, first, warmup_steps=WARMUP, measure_steps=MEASURE, guard=guard
        )
        config = FineTuneConfig(
            batch_size=first.batch_size, lr=1e-3, target_accuracy=None, max_samples=max_steps * 64,
            eval_every_samples=None,
        )  # fmt: skip
        timeline.start()
        result = fine_tune(
            build_model("cnn-tiny", 10, seed=0), train, test, config, device=board, workload=WORKLOAD,
            callbacks=FineTuneCallbacks(progress=False, hooks=[confirm]),
        )  # fmt: skip
        return result, confirm, timeline.stop()


def _over_cap_segments(samples: list[tuple[float, float]]) -> int:
    segs = samples[1:-1]  # two readings per constant-power segment (one per step)
    return sum(w > CAP_W for (_, w), _ in zip(segs[::2], segs[1::2], strict=True))


def test_a_true_prediction_is_confirmed_by_its_first_steps_and_nothing_moves() -> None:
    result, confirm, timeline = _run(1.0)
    first = _choose(PREDICTION)
    assert confirm.confirmed and not confirm.switches and not confirm.guard.step_downs
    ((pair, point),) = confirm.measured.items()
    assert pair == (first.batch_size, first.frequency_hz) and point.peak_power_w <= CAP_W
    assert confirm.pick.peak_power_w == point.peak_power_w  # the pick reports what was measured
    expected = PREDICTION.point(*pair)
    assert point.seconds_per_batch == pytest.approx(expected.seconds_per_batch)
    assert point.peak_power_w == pytest.approx(expected.peak_power_w)
    assert result.steps * first.batch_size == result.samples >= 120 * 64  # the measuring steps trained
    assert _over_cap_segments(timeline) == 0


@pytest.mark.parametrize("scale", [1.1, 1.25])
def test_a_pair_measured_over_the_cap_runs_only_its_measuring_steps(scale: float) -> None:
    """The board draws `scale` × what the prediction says: every pair the walk drops is over the cap for
    exactly its warm-up and measured steps, and the walk ends where the board's true profile chooses."""
    result, confirm, timeline = _run(scale)
    truth = replace(
        PREDICTION, points=[replace(p, peak_power_w=p.peak_power_w * scale) for p in PREDICTION.points]
    )
    best = _choose(truth)
    assert confirm.confirmed and confirm.switches
    assert (confirm.batch_size, confirm.frequency_hz) == (best.batch_size, best.frequency_hz)
    measured = confirm.measured[(best.batch_size, best.frequency_hz)]
    assert confirm.pick.peak_power_w == measured.peak_power_w <= CAP_W
    assert all(s.measured_w > CAP_W for s in confirm.switches)
    assert [s.new for s in confirm.switches[:-1]] == [s.old for s in confirm.switches[1:]]
    assert _over_cap_segments(timeline) == (WARMUP + MEASURE) * len(confirm.switches)
    assert not confirm.guard.step_downs  # the confirmed pair holds the cap: the guard has nothing to do
    assert result.samples >= 120 * 64  # every step trained, those that measured a dropped pair too


def test_a_board_no_predicted_pair_of_which_fits_stops_with_one_line() -> None:
    with pytest.raises(NothingConfirmed, match=r"no pair predicted under the 3 W cap measured under it"):
        _run(5.0, max_steps=2000)


class _NoRoomFor(SimulatedBoard):
    """A Nano whose steps at one batch size fail as `error` says (an accelerator out of memory)."""

    def __init__(self, batch_size: int, error: Exception) -> None:
        super().__init__(NANO, noise=False)
        self.no_room, self.error, self.failed = batch_size, error, 0

    def run_step(self, fn, *, batch_size, workload):
        if batch_size == self.no_room:
            self.failed += 1
            raise self.error
        return super().run_step(fn, batch_size=batch_size, workload=workload)


@pytest.mark.parametrize(
    "error",
    [torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
     RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")],
)  # fmt: skip
def test_a_batch_size_out_of_memory_in_training_is_dropped_as_the_profiler_drops_it(error, caplog) -> None:
    """The predicted choice's batch size does not fit: its first step fails, the batch size leaves the
    prediction (as the profiler skips it) and the next choice is pinned, measured and confirmed; every
    sample trains at the batch sizes that fit."""
    first = _choose(PREDICTION)
    board = _NoRoomFor(first.batch_size, error)
    result, confirm, _ = _run(1.0, board=board)
    rest = replace(PREDICTION, points=[p for p in PREDICTION.points if p.batch_size != first.batch_size])
    best = _choose(rest)
    assert board.failed == 1 and [s["batch_size"] for s in confirm.skipped] == [first.batch_size]
    assert "out of memory" in confirm.skipped[0]["reason"]
    said = [r.getMessage() for r in caplog.records if r.name == "powerctl.selection.confirm"]
    assert said == [
        f"sim:jetson-nano: batch size {first.batch_size} ran out of memory in training; dropped, as "
        f"profiling drops it: b={best.batch_size} at {best.frequency_hz / 1e6:.1f} MHz"
    ]
    assert confirm.confirmed and (confirm.batch_size, confirm.frequency_hz) == (
        best.batch_size,
        best.frequency_hz,
    )
    assert result.samples == result.steps * best.batch_size >= 120 * 64
    state = json.loads(json.dumps(confirm.resume_state()))
    again = TrainingConfirmation(
        SimulatedBoard(NANO, noise=False), PREDICTION, _choose, CAP_W, first, warmup_steps=WARMUP,
        measure_steps=MEASURE,
    )  # fmt: skip
    again.load_resume_state(state)  # a resumed run does not pick the batch size that did not fit
    assert all(p.batch_size != first.batch_size for p in again.prediction.points)


def test_another_failure_in_training_stands() -> None:
    board = _NoRoomFor(_choose(PREDICTION).batch_size, RuntimeError("cuDNN error: bad param"))
    with pytest.raises(RuntimeError, match="cuDNN error"):
        _run(1.0, board=board)


def test_the_confirmation_resumes_where_it_stood() -> None:
    """Its state in a checkpoint (JSON) continues the walk: what was measured, the pair in force."""
    _, confirm, _ = _run(1.4, max_steps=4)  # mid-walk: one pair dropped, the next one measuring (b=32)
    assert len(confirm.switches) == 1 and not confirm.confirmed
    state = json.loads(json.dumps(confirm.resume_state()))
    board = SimulatedBoard(NANO, noise=False)
    guard = PowerGuard(board, CAP_W, _choose(PREDICTION).frequency_hz)
    again = TrainingConfirmation(
        board, PREDICTION, _choose, CAP_W, _choose(PREDICTION), warmup_steps=WARMUP, measure_steps=MEASURE,
        guard=guard,
    )  # fmt: skip
    again.load_resume_state(state)
    assert again.resume_state() == confirm.resume_state()
    assert board.current_frequency() == confirm.frequency_hz and again.switches == confirm.switches
