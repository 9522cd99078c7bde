"""fine_tune: stops at the target or the budget, repeatable, device time and energy of training only."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import pytest
import torch
from torch import nn

from powerctl.devices import open_device
from powerctl.devices.base import PowerSampler
from powerctl.devices.host import HostDevice
from powerctl.records.workload import Workload
from powerfed.training.data import Dataset, load_dataset, train_test_split
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import (
    DEFAULT_MAX_EPOCHS,
    FineTuneCallbacks,
    FineTuneConfig,
    FineTuneResult,
    make_optimizer,
)
from powerfed.training.lr import scaled_lr
from powerfed.training.models import build_model

STEP_S = 0.25  # a fake device's seconds per training step (exact in binary floating point)
EVAL_S = 10.0  # ... and per evaluation forward pass, which must NOT count as device time
WATTS = 5.0


class FakeBoard(HostDevice):
    """Virtual clock: +STEP_S per training step; `charge_eval` adds time outside any step."""

    def __init__(self, sensor: bool = False) -> None:
        super().__init__("fake")
        self.t = 0.0
        self.has_power_sensor = sensor
        self.steps = 0
        self.batch_sizes: set[int] = set()

    def clock(self) -> float:
        return self.t

    def run_step(self, fn: Any, *, batch_size: int, workload: Workload) -> Any:
        assert isinstance(workload, Workload)
        self.batch_sizes.add(batch_size)
        out = fn()
        self.t += STEP_S
        self.steps += 1
        return out

    def read_power_w(self) -> float:
        return WATTS

    def power_sampler(self, rate_hz: float) -> PowerSampler:
        return EdgeSampler(self)


class EdgeSampler(PowerSampler):
    """Reads the sensor exactly at start and stop (no thread, so no scheduling luck in the test)."""

    def __init__(self, board: FakeBoard) -> None:
        self.board = board
        self.samples: list[tuple[float, float]] = []

    def start(self) -> None:
        self.samples = [(self.board.clock(), self.board.read_power_w())]

    def samples_so_far(self) -> list[tuple[float, float]]:
        return self.samples

    def stop(self) -> list[tuple[float, float]]:
        return [*self.samples, (self.board.clock(), self.board.read_power_w())]


class EvalCharged(nn.Module):
    """Wraps a model so every eval-mode forward advances the board's clock (evaluation costs time)."""

    def __init__(self, inner: nn.Module, board: FakeBoard) -> None:
        super().__init__()
        self.inner, self.board = inner, board

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            self.board.t += EVAL_S
        return self.inner(x)


@pytest.fixture(scope="module")
def image_split() -> tuple[Dataset, Dataset]:
    return train_test_split(load_dataset("synthetic-image", split="all", limit=300))


def _tune(
    split: tuple[Dataset, Dataset], device: Any = None, model: nn.Module | None = None, **kw: Any
) -> FineTuneResult:
    """A run of these settings (`FineTuneConfig`'s fields in `kw`), quiet."""
    train, test = split
    settings: dict[str, Any] = {
        "batch_size": 16,
        "lr": 1e-3,
        "target_accuracy": 0.5,
        "eval_every_samples": 64,
        "max_samples": 3000,
    }
    config = FineTuneConfig(**{**settings, **kw})
    return fine_tune(
        model or build_model("cnn-tiny", train.num_classes, seed=0),
        train,
        test,
        config,
        device=device or HostDevice(),
        callbacks=QUIET,
    )


QUIET = FineTuneCallbacks(progress=False)


def _monotone(r: FineTuneResult) -> bool:
    pairs = list(itertools.pairwise(r.curve))
    return all(b.samples > a.samples and b.device_s >= a.device_s for a, b in pairs)


def test_reaches_target_and_stops_there(image_split: tuple[Dataset, Dataset]) -> None:
    r = _tune(image_split, target_accuracy=0.5)
    assert r.reached and r.stop_reason == "target"
    assert r.curve[-1].accuracy >= 0.5 and r.final_accuracy == r.curve[-1].accuracy
    assert all(p.accuracy < 0.5 for p in r.curve[:-1]), "must stop at the FIRST evaluation at the target"
    assert r.samples == r.curve[-1].samples == r.steps * 16
    assert 0 < r.samples < 3000
    assert r.curve[0].samples == 0 and _monotone(r)
    assert r.batch_size == 16 and r.lr == 1e-3


def test_stops_at_sample_budget_when_target_unreachable(image_split: tuple[Dataset, Dataset]) -> None:
    r = _tune(image_split, target_accuracy=1.0, lr=1e-7, max_samples=200)
    assert not r.reached and r.stop_reason == "max_samples"
    assert 200 <= r.samples < 200 + 16 and r.steps == math.ceil(200 / 16)
    assert r.curve[-1].samples == r.samples and _monotone(r)


def test_no_budget_defaults_to_max_epochs(image_split: tuple[Dataset, Dataset]) -> None:
    train, test = image_split
    small = train.subset(list(range(40)))  # 2 steps of 16 per epoch (the incomplete batch is dropped)
    board = FakeBoard()
    config = FineTuneConfig(batch_size=16, lr=1e-7, target_accuracy=1.0, eval_every_samples=64)
    r = fine_tune(
        build_model("cnn-tiny", train.num_classes, seed=0), small, test, config, device=board, callbacks=QUIET
    )
    assert not r.reached and r.stop_reason == "max_samples"
    assert r.steps == math.ceil(DEFAULT_MAX_EPOCHS * len(small) / 16)
    assert board.batch_sizes == {16}


def test_same_seed_same_curve_other_seed_other_curve(image_split: tuple[Dataset, Dataset]) -> None:
    kw = {"target_accuracy": None, "max_samples": 256, "eval_every_samples": 64}
    a, b = _tune(image_split, seed=3, **kw), _tune(image_split, seed=3, **kw)
    c = _tune(image_split, seed=4, **kw)
    assert [(p.samples, p.accuracy) for p in a.curve] == [(p.samples, p.accuracy) for p in b.curve]
    assert [p.accuracy for p in a.curve] != [p.accuracy for p in c.curve]


def test_device_seconds_count_training_steps_only(image_split: tuple[Dataset, Dataset]) -> None:
    board = FakeBoard()
    model = EvalCharged(build_model("cnn-tiny", image_split[0].num_classes, seed=0), board)
    r = _tune(image_split, device=board, model=model, target_accuracy=None, max_samples=160)
    evaluations = len(r.curve)
    assert evaluations >= 3 and board.t > r.device_s  # evaluation did advance the clock ...
    assert r.device_s == r.steps * STEP_S == board.steps * STEP_S  # ... but is not counted
    assert [p.device_s for p in r.curve] == [p.samples / 16 * STEP_S for p in r.curve]


def test_device_seconds_budget(image_split: tuple[Dataset, Dataset]) -> None:
    r = _tune(
        image_split,
        device=FakeBoard(),
        target_accuracy=1.0,
        lr=1e-7,
        max_samples=None,
        max_device_s=2.0,
    )
    assert not r.reached and r.stop_reason == "max_device_s"
    assert r.device_s == 2.0 and r.steps == 8


def test_energy_from_sensor_for_training_only(image_split: tuple[Dataset, Dataset]) -> None:
    board = FakeBoard(sensor=True)
    model = EvalCharged(build_model("cnn-tiny", image_split[0].num_classes, seed=0), board)
    r = _tune(image_split, device=board, model=model, target_accuracy=None, max_samples=160)
    assert r.peak_power_w == pytest.approx(WATTS) and r.mean_power_w == pytest.approx(WATTS)
    assert r.energy_j == pytest.approx(WATTS * r.device_s)  # evaluation time (EVAL_S) not included


def test_no_sensor_no_energy(image_split: tuple[Dataset, Dataset]) -> None:
    r = _tune(image_split, target_accuracy=None, max_samples=32)
    assert r.energy_j is None and r.peak_power_w is None and r.mean_power_w is None
    assert r.device_s > 0


def test_text_task_trains_with_adamw() -> None:
    train, test = train_test_split(load_dataset("synthetic-text", split="all", seq_len=16, limit=400))
    model = build_model("chartransformer-small", seed=0, seq_len=16)
    config = FineTuneConfig(
        batch_size=8, lr=3e-3, target_accuracy=None, max_samples=160, eval_every_samples=80
    )
    r = fine_tune(model, train, test, config, device=HostDevice(), callbacks=QUIET)
    assert r.steps == 20 and r.curve[-1].accuracy > r.curve[0].accuracy
    assert isinstance(make_optimizer("text", model.parameters(), 1e-3), torch.optim.AdamW)
    assert type(make_optimizer("image", model.parameters(), 1e-3)) is torch.optim.Adam


def test_rejects_bad_arguments(image_split: tuple[Dataset, Dataset]) -> None:
    with pytest.raises(ValueError, match="target_accuracy"):
        _tune(image_split, target_accuracy=1.5)
    with pytest.raises(ValueError, match="batch_size"):
        _tune(image_split, batch_size=0)
    with pytest.raises(ValueError, match="eval_every_samples"):
        _tune(image_split, eval_every_samples=None)


def test_settings_are_checked_once_when_made(image_split: tuple[Dataset, Dataset]) -> None:
    """A `FineTuneConfig` that exists can run: its refusals come when it is made, a rate rule's when a
    run asks it (once, for the batch size the run starts with)."""
    with pytest.raises(ValueError, match="FineTuneConfig: 'lr' must be a number > 0, got 0"):
        FineTuneConfig(batch_size=16, lr=0, target_accuracy=None)
    good = FineTuneConfig(batch_size=16, lr=1e-3, target_accuracy=None, max_samples=32)
    with pytest.raises(ValueError, match="'max_samples' must be an integer ≥ 1 or None"):
        dataclasses.replace(good, max_samples=0)
    asked: list[int] = []

    def negative(batch_size: int) -> float:
        asked.append(batch_size)
        return -1.0

    _ = FineTuneConfig(batch_size=16, lr=negative, target_accuracy=None)
    assert asked == []
    with pytest.raises(ValueError, match=r"'lr' must be a number > 0, got -1\.0"):
        _tune(image_split, lr=negative, target_accuracy=None, max_samples=32)
    assert asked == [16]


def test_square_root_lr_rule() -> None:
    assert scaled_lr(1e-3, 64, 64) == pytest.approx(1e-3)
    assert scaled_lr(1e-3, 16, 64) == pytest.approx(5e-4)
    assert scaled_lr(2e-3, 4, 64) == pytest.approx(5e-4)
    assert scaled_lr(1e-3, 32, 128) == pytest.approx(1e-3 * math.sqrt(0.25))
    for bad in [(0.0, 4, 64), (1e-3, 0, 64), (1e-3, 128, 64), (float("nan"), 4, 64), (1e-3, 4.0, 64)]:
        with pytest.raises(ValueError):
            scaled_lr(*bad)  # type: ignore[arg-type]


def test_target_met_before_training_trains_nothing(image_split: tuple[Dataset, Dataset]) -> None:
    board = FakeBoard()
    r = _tune(image_split, device=board, target_accuracy=0.01)
    assert r.reached and r.stop_reason == "target" and r.samples == r.steps == 0
    assert len(r.curve) == 1 and r.device_s == 0.0 and board.steps == 0


def test_simulated_board_charges_virtual_time_and_energy(image_split: tuple[Dataset, Dataset]) -> None:
    board = open_device("sim:jetson-nano")
    start = board.clock()
    r = _tune(image_split, device=board, target_accuracy=None, max_samples=160)
    assert r.device_s == pytest.approx(board.clock() - start)  # the board's clock, training only
    assert r.energy_j is not None and r.energy_j > 0
    assert 0 < r.mean_power_w <= r.peak_power_w
    assert r.energy_j == pytest.approx(r.mean_power_w * r.device_s, rel=1e-6)
