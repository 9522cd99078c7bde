"""bench/paper_tables.py's `calibrate_target` refuses a target the evaluation cannot tell from the start
(issue 29: the full text model's targets sat 0.002-0.018 above it), and trains where --device says."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import paper_tables
from paper_setup import Task
from paper_tables import NOISE_Z, TargetInNoise, calibrate_target, evaluation_noise

from powerctl.devices import open_device
from powerfed.training.data import load_dataset
from powerfed.training.models import build_model, model_workload
from tests.test_server_device import fake_gpu, tensors  # noqa: F401 - the pretend GPU

Ds = type("Ds", (), {"name": "text:fake.txt"})


def _task(eval_max_samples: int = 500) -> Task:
    return Task("text", "chartransformer", "chartransformer", 5e-4, 0, [16, 64], [0], [0], 1000, 100,
                eval_max_samples)  # fmt: skip


def _stub(monkeypatch: pytest.MonkeyPatch, curve: list[float], eval_samples: int = 500) -> None:
    """The calibration run, as `run_to_target` returns it: evaluations evenly over its budget."""

    def run(task: Task, weights: Any, ds: Any, target: Any, b: int, seed: int, host: Any) -> dict[str, Any]:
        step = task.calibration_samples / (len(curve) - 1)
        points = [(i * step, acc) for i, acc in enumerate(curve)]
        return {"curve": points, "eval_samples": eval_samples}

    monkeypatch.setattr(paper_tables, "run_to_target", run)


def test_the_noise_is_two_standard_errors_of_the_difference_or_the_plateaus_own_spread() -> None:
    se = math.hypot(math.sqrt(0.28 * 0.72 / 500), math.sqrt(0.29 * 0.71 / 500))
    assert evaluation_noise(0.28, 0.29, 500, [0.29, 0.29]) == pytest.approx(NOISE_Z * se)
    assert 0.05 < evaluation_noise(0.28, 0.29, 500, [0.29]) < 0.06  # the full text runs: refused
    # on many samples the binomial part is small; a plateau that jumps about is noise all the same
    assert evaluation_noise(0.3, 0.4, 10**6, [0.3, 0.5, 0.3, 0.5]) > 0.2


def test_a_target_inside_the_noise_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # start 0.283, plateau 0.291: the full-size chartransformer on 500 evaluated sequences
    _stub(monkeypatch, [0.283, 0.285, 0.288, 0.289, 0.290, 0.291, 0.291, 0.292, 0.291, 0.290, 0.291])
    with pytest.raises(TargetInNoise) as caught:
        calibrate_target(_task(), {}, Ds(), None)
    line = str(caught.value)
    assert "\n" not in line and "within the evaluation's noise" in line and "500 evaluated samples" in line
    assert "plateau 0.291" in line and "start 0.283" in line and "--text-calibration-samples" in line


def test_a_clear_plateau_gives_its_target(monkeypatch: pytest.MonkeyPatch) -> None:
    _stub(monkeypatch, [0.30, 0.36, 0.40, 0.43, 0.44, 0.45, 0.45, 0.46, 0.45, 0.44, 0.45])
    target, plateau, start = calibrate_target(_task(), {}, Ds(), None)
    assert (start, plateau) == (0.30, 0.45) and target == round(0.30 + 0.8 * 0.15, 3)
    # the same gain measured on 20 samples is inside their noise
    with pytest.raises(TargetInNoise, match="20 evaluated samples"):
        _stub(
            monkeypatch, [0.30, 0.36, 0.40, 0.43, 0.44, 0.45, 0.45, 0.46, 0.45, 0.44, 0.45], eval_samples=20
        )
        calibrate_target(_task(), {}, Ds(), None)


def test_the_bench_says_it_in_one_line_exit_2_and_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _stub(monkeypatch, [0.283, 0.285, 0.288, 0.289, 0.290, 0.291, 0.291, 0.292, 0.291, 0.290, 0.291])

    def data(task: Task, quick: bool) -> None:
        task.data.update({"proxy": Ds(), "targets": {"a": Ds(), "b": Ds()}})

    monkeypatch.setattr(paper_tables, "prepare_data", data)
    monkeypatch.setattr(paper_tables, "pretrained", lambda task, host, out: {})
    out = tmp_path / "out"
    assert paper_tables.main(["--task", "text", "--full", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paper_tables: error: text chartransformer"), captured.err
    assert not out.exists()


def test_a_gpu_the_bench_does_not_have_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        paper_tables.parse_args(["--device", "cuda"])
    err = capsys.readouterr().err.strip().splitlines()
    assert caught.value.code == 2 and len(err) == 1 and "sees no CUDA device" in err[0]


def test_full_text_regime_defaults() -> None:
    full = paper_tables.make_tasks(paper_tables.parse_args(["--task", "text", "--full"]))[0]
    small = paper_tables.make_tasks(paper_tables.parse_args(["--task", "text"]))[0]
    assert (full.model, full.lr_max, full.pretrain_lr, full.pretrain_samples) == (
        "chartransformer",
        5e-4,
        1e-3,
        300_000,
    )
    assert (small.model, small.lr_max, small.pretrain_lr, small.pretrain_samples) == (
        "chartransformer-small",
        3e-3,
        None,
        80_000,
    )


def test_calibration_runs_train_on_the_device(fake_gpu: list) -> None:  # noqa: F811
    ds = load_dataset("synthetic-image", split="all", limit=120)
    task = Task("vision", "cnn-tiny", "cnn-tiny", 2e-3, 0, [16], [0], [0], 64, 32, 40)
    task.data["charged_workload"] = model_workload("cnn-tiny", build_model("cnn-tiny", seed=0))
    weights = build_model("cnn-tiny", ds.num_classes, seed=0).state_dict()
    run = paper_tables.run_to_target(task, weights, ds, None, 16, 0, open_device("cuda:1"))
    assert run["eval_samples"] == 24 and [t for w, t in fake_gpu if w != "tensor"] == ["cuda:1"]
    assert len(tensors(fake_gpu)) >= 5 and set(tensors(fake_gpu)) == {"cuda:1"}  # its data follow it
