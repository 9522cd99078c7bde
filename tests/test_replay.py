"""Replay: a run's recorded steps charged at another frequency cost what a pinned run there costs."""

from __future__ import annotations

import pytest

from powerctl.devices.boards import board_model
from powerctl.devices.simulated import SimulatedBoard, replay_cost
from powerctl.records.workload import Workload
from powerfed.training.data import load_dataset, train_test_split
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import FineTuneCallbacks, FineTuneConfig
from powerfed.training.models import build_model


@pytest.mark.parametrize("board_name", ["jetson-nano", "jetson-tx2nx"])
def test_replayed_cost_equals_a_pinned_run(board_name: str, paper_workloads: dict[str, Workload]) -> None:
    board = board_model(board_name)
    full = paper_workloads["resnet18"]  # the small model trains; the board charges the full one
    data = load_dataset("synthetic-image", split="all", limit=400, seed=3)
    train, test = train_test_split(data, seed=3)
    runs = {}
    config = FineTuneConfig(
        batch_size=16, lr=2e-3, target_accuracy=None, max_samples=160, eval_every_samples=None
    )
    for hz in (board.frequencies_hz[2], board.frequencies_hz[-1]):
        dev = SimulatedBoard(board, noise=False)
        with dev.pinned(hz):
            runs[hz] = fine_tune(
                build_model("cnn-tiny", seed=0), train, test, config, device=dev, workload=full,
                callbacks=FineTuneCallbacks(progress=False),
            )  # fmt: skip
    (lo, a), (hi, b) = runs.items()
    assert a.steps == b.steps == 10 and a.samples == b.samples  # the frequency does not change the run
    for hz, run in runs.items():
        seconds, energy = replay_cost(board, full, 16, a.steps, hz)  # charged from the other run's steps
        assert seconds == pytest.approx(run.device_s, rel=1e-9)
        assert run.energy_j is not None and energy == pytest.approx(run.energy_j, rel=1e-6)
    assert runs[lo].device_s > runs[hi].device_s
