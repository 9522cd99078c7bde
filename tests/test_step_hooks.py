"""The one interface between the training loop and what acts between its steps (`StepHook`): powerctl's
guard and follower fit it without importing training; a hook changes the batch size, sees every step's
power, and its state goes through a checkpoint with the rest of the run."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from powerctl.devices.simulated import SimulatedBoard
from powerctl.selection.follow import CapFollower
from powerctl.selection.guard import PowerGuard
from powerfed.training.checkpoint import Checkpointing
from powerfed.training.data import load_dataset, train_test_split
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import FineTuneCallbacks, FineTuneConfig, FineTuneResult, StepHook
from powerfed.training.models import build_model


def _methods(cls: type) -> dict[str, list[str]]:
    names = [n for n in vars(StepHook) if not n.startswith("_")]
    return {n: list(inspect.signature(getattr(cls, n)).parameters) for n in names}


@pytest.mark.parametrize("hook", [PowerGuard, CapFollower])
def test_the_guard_and_the_follower_are_step_hooks(hook: type) -> None:
    wanted = _methods(StepHook)
    assert set(wanted) == {"before_step", "after_step", "resume_state", "load_resume_state"}
    assert _methods(hook) == wanted


class Halve:
    """Halves the batch size once `at_samples` are trained; counts steps and readings as it goes."""

    def __init__(self, at_samples: int) -> None:
        self.at_samples = at_samples
        self.steps = self.readings = 0
        self.seconds: list[float] = []

    def before_step(self, samples: int) -> int | None:
        return 8 if samples >= self.at_samples else None

    def after_step(self, power: list[tuple[float, float]], device_s: float) -> None:
        self.steps += 1
        self.readings += len(power)
        self.seconds.append(device_s)

    def resume_state(self) -> dict[str, Any]:
        return {"steps": self.steps, "readings": self.readings, "seconds": self.seconds}

    def load_resume_state(self, state: dict[str, Any]) -> None:
        self.steps, self.readings, self.seconds = state["steps"], state["readings"], state["seconds"]


class _Killed(Exception):
    pass


def _run(tmp_path: Path, kill_at_step: int | None = None) -> tuple[FineTuneResult, Halve, list[float]]:
    train, test = train_test_split(load_dataset("synthetic-image", limit=600, seed=3), seed=0)
    hook, rates = Halve(at_samples=96), []
    board = SimulatedBoard.open("jetson-nano", seed=2)

    def rate(b: int) -> float:
        rates.append(1e-3 * (b / 16) ** 0.5)
        return rates[-1]

    def on_step(steps: int, samples: int) -> None:
        if steps == kill_at_step:
            raise _Killed

    with board.pinned(board.frequencies()[6]):
        config = FineTuneConfig(
            batch_size=16, lr=rate, target_accuracy=None, max_samples=256, eval_every_samples=64,
            eval_max_samples=64, seed=1,
        )  # fmt: skip
        callbacks = FineTuneCallbacks(
            progress=False, checkpoint=Checkpointing(tmp_path / "ft.safetensors", every_samples=64),
            hooks=[hook], on_step=on_step,
        )  # fmt: skip
        result = fine_tune(
            build_model("cnn-tiny", 10, seed=0), train, test, config, device=board, callbacks=callbacks
        )
    return result, hook, rates


def test_a_hook_changes_the_batch_size_sees_each_step_and_resumes(tmp_path: Path) -> None:
    whole, hook, rates = _run(tmp_path)
    (tmp_path / "ft.safetensors").unlink()  # its end state would answer the same work without training
    # 6 steps of 16, then 20 of 8; the rule gave the rate of each size it was asked for
    assert (whole.steps, whole.samples, whole.batch_size) == (6 + 20, 256, 16)
    assert rates == [1e-3, 1e-3 * 0.5**0.5] and whole.lr == 1e-3
    assert hook.steps == whole.steps and hook.seconds[-1] == pytest.approx(whole.device_s)
    assert hook.seconds == sorted(hook.seconds) and hook.readings >= 2 * whole.steps  # a sensor: readings
    with pytest.raises(_Killed):
        _run(tmp_path, kill_at_step=14)  # 96 + 8 · 8 = 160 samples; the last save at 128
    resumed, again, _ = _run(tmp_path)
    assert resumed.extra["resumed_at_samples"] == 128
    assert again.resume_state() == hook.resume_state()
    same = ("steps", "samples", "device_s", "energy_j", "curve")
    assert [getattr(resumed, k) for k in same] == [getattr(whole, k) for k in same]
