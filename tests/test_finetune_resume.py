"""An interrupted fine-tune resumed from its checkpoint ends exactly where an uninterrupted one ends."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from powerctl.devices import open_device
from powerfed.training.checkpoint import Checkpointing, load
from powerfed.training.data import load_dataset, train_test_split
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import FineTuneCallbacks, FineTuneConfig, FineTuneResult
from powerfed.training.models import build_model


class Interrupted(Exception):
    pass


def _data():
    return train_test_split(load_dataset("synthetic-image", limit=600, seed=3), seed=0)


def _run(
    ckpt: Checkpointing | None, stop_at_step: int | None = None
) -> tuple[FineTuneResult, dict[str, torch.Tensor]]:
    train, test = _data()
    model = build_model("cnn-tiny", 10, seed=0)

    def on_step(steps: int, samples: int) -> None:
        if steps == stop_at_step:
            raise Interrupted(f"step {steps}")

    with open_device("sim:jetson-nano", seed=5) as dev, dev.pinned(dev.frequencies()[6]):
        config = FineTuneConfig(
            batch_size=16,
            lr=2e-3,
            target_accuracy=0.99,  # not reached: the sample budget ends the run
            max_samples=480,
            eval_every_samples=64,
            eval_max_samples=64,
            seed=4,
        )
        callbacks = FineTuneCallbacks(progress=False, checkpoint=ckpt, on_step=on_step)
        result = fine_tune(model, train, test, config, device=dev, callbacks=callbacks)
    return result, {k: v.clone() for k, v in model.state_dict().items()}


def _same(a: tuple[FineTuneResult, dict], b: tuple[FineTuneResult, dict]) -> None:
    (ra, wa), (rb, wb) = a, b
    assert set(wa) == set(wb) and all(torch.equal(wa[k], wb[k]) for k in wa)
    keep = ("samples", "steps", "device_s", "energy_j", "peak_power_w", "final_accuracy", "curve")
    assert [getattr(ra, k) for k in keep] == [getattr(rb, k) for k in keep]


def test_an_interrupted_run_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    plain = _run(None)
    ckpt = Checkpointing(tmp_path / "ft.safetensors", every_samples=128, key="work-1")
    # saving changes nothing of the run itself
    _same(_run(Checkpointing(tmp_path / "other.safetensors", every_samples=128)), plain)
    with pytest.raises(Interrupted):
        _run(ckpt, stop_at_step=19)  # 304 samples: the last save was at 256
    saved = load(ckpt.path)
    assert saved.state["progress"]["samples"] == 256 and "optimizer.0.exp_avg" in saved.tensors
    resumed = _run(ckpt)
    _same(resumed, plain)
    assert resumed[0].samples == 480 and resumed[0].device_s > 0
    assert resumed[0].extra["resumed_at_samples"] == 256
    assert load(ckpt.path).state["finished"]  # the end state stays, for the same work sent again


def _said(caplog: pytest.LogCaptureFixture) -> str:
    """What the library logged (INFO and up) since the last call, its lines; forgotten after."""
    text = "\n".join(caplog.messages)
    caplog.clear()
    return text


def test_the_same_work_after_it_finished_returns_its_result_without_training(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A resent round whose reply was lost: the end state answers it, step for step the same result,
    and no training step runs (on_step would raise at the first)."""
    caplog.set_level(logging.INFO)
    ckpt = Checkpointing(tmp_path / "ft.safetensors", every_samples=128, key="work-1")
    first = _run(ckpt)
    assert "resumed_at_samples" not in first[0].extra
    again = _run(ckpt, stop_at_step=1)
    _same(again, first)
    assert again[0].extra["resumed_at_samples"] == again[0].samples == 480
    assert again[0].stop_reason == first[0].stop_reason == "max_samples"
    assert "its result again, without training" in _said(caplog)
    # other work finds the end state of this one: it trains from the start, with no line about it
    other = _run(Checkpointing(ckpt.path, every_samples=128, key="work-2"))
    _same(other, first)
    assert "resumed_at_samples" not in other[0].extra
    assert "checkpoint" not in _said(caplog)


def test_a_checkpoint_of_other_work_or_a_corrupt_one_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    plain = _run(None)
    path = tmp_path / "ft.safetensors"
    with pytest.raises(Interrupted):
        _run(Checkpointing(path, every_samples=64, key="round-1"), stop_at_step=10)
    assert path.is_file()
    _same(_run(Checkpointing(path, every_samples=64, key="round-2")), plain)
    assert "belongs to other work" in _said(caplog)

    with pytest.raises(Interrupted):
        _run(Checkpointing(path, every_samples=64, key="round-1"), stop_at_step=10)
    path.write_bytes(path.read_bytes()[:200])  # truncated by a crash of the disk, not of the writer
    _same(_run(Checkpointing(path, every_samples=64, key="round-1")), plain)
    assert "not a readable checkpoint" in _said(caplog)
