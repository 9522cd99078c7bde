"""Pre-train a model on a public dataset (`fine_tune`, a sample budget): the starting weights and a report."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_server.weights import save_weights, weights_hash
from powerctl.devices import open_device
from powerctl.files.jsonfile import write_json
from powerctl.files.outputs import OutputPathError, check_output_dir
from powerfed.training.data import load_dataset, train_test_split
from powerfed.training.errors import DataError, ModelError
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import DEFAULT_EVAL_MAX_SAMPLES, FineTuneCallbacks, FineTuneConfig
from powerfed.training.models import (
    build_model,
    check_data_fits,
    check_size,
    get_model_spec,
)

PRETRAIN_SCHEMA = "fl_server.pretrain/2"
CURVE_POINTS = 10  # evaluations along a run (besides the first and the last), for the report's curve


@dataclass
class PretrainReport:
    weights_path: Path
    report_path: Path
    data: dict[str, Any]


def report_path_for(weights_path: str | Path) -> Path:
    """`w.safetensors` → `w.report.json`: the report always sits next to its weights."""
    return Path(weights_path).with_suffix(".report.json")


def _epochs_budget(epochs: float, train_size: int, batch_size: int) -> int:
    """The samples of `epochs` passes over the train split; fewer than one batch is an error."""
    budget = round(epochs * train_size)
    if budget < min(batch_size, train_size):
        least = min(batch_size, train_size) / train_size
        digits = 2 - math.floor(math.log10(least))  # three significant digits, rounded up
        least = math.ceil(least * 10**digits) / 10**digits
        raise DataError(
            f"epochs {epochs:g} of the {train_size}-sample train split is {budget} samples, less than one "
            f"batch of {batch_size}: give at least {least:g} epochs, or a sample budget"
        )
    return budget


@dataclass(frozen=True)
class PretrainSettings:
    """How the starting weights are trained: `samples` or `epochs` (not both; neither = 1 epoch), the
    step, the seed, the model's options and how much data is read."""

    samples: int | None = None
    epochs: float | None = None
    batch_size: int = 64
    lr: float = 1e-3
    seed: int = 0
    overrides: dict[str, Any] = field(default_factory=dict)
    seq_len: int | None = None  # text models: the context length (None: the model's own)
    limit: int | None = None  # read at most this many samples of the dataset (None: all)
    eval_max_samples: int | None = DEFAULT_EVAL_MAX_SAMPLES

    def __post_init__(self) -> None:
        if self.samples is not None and self.epochs is not None:
            raise ValueError("give either samples or epochs, not both")
        if self.epochs is not None and not self.epochs > 0:
            raise ValueError(f"epochs must be > 0, got {self.epochs}")


def pretrain(
    model_name: str,
    dataset_spec: str,
    *,
    out: str | Path,
    settings: PretrainSettings | None = None,
    device: str = "auto",
    progress: bool = True,
    on_step: Callable[[int, int], None] | None = None,
) -> PretrainReport:
    """Train `model_name` from a seeded init on `dataset_spec`'s train split and save weights + report
    (nothing unless training completes); `on_step(steps, samples)` hears every step."""
    st = settings or PretrainSettings()
    out = Path(out)
    if out.is_dir():  # before any work: missing folders are made when writing
        raise DataError(f"{out}: is a directory; give a file name for the output")
    try:
        check_output_dir(out.parent, "the folder of")
    except OutputPathError as exc:
        raise DataError(str(exc)) from None
    if out.suffix == ".json":
        raise DataError(f"{out}: the weights file must not end in .json (the report goes to *.report.json)")
    overrides = check_size(model_name, None, dict(st.overrides))  # before the data is read (again below)
    spec = get_model_spec(model_name)
    model_len = int(overrides.get("seq_len", spec.input_shape[0])) if spec.task == "text" else 0
    length = (model_len or 64) if st.seq_len is None else st.seq_len
    if spec.task == "text" and length > model_len:
        raise ModelError(f"seq_len {length} exceeds the context of {model_name} ({model_len})")
    dataset = load_dataset(dataset_spec, split="all", seq_len=length, limit=st.limit, seed=st.seed)
    check_data_fits(spec, dataset, dataset_spec)
    train, test = train_test_split(dataset, seed=st.seed)
    budget = (
        st.samples if st.samples is not None else _epochs_budget(st.epochs or 1.0, len(train), st.batch_size)
    )
    dev = open_device(device, seed=st.seed)

    started = time.perf_counter()
    try:
        # built on the CPU from its seed (the same initial weights on every device), then moved
        model = build_model(model_name, dataset.num_classes, seed=st.seed, **overrides).to(dev.torch_device())
        config = FineTuneConfig(
            batch_size=st.batch_size,
            lr=st.lr,
            target_accuracy=None,
            max_samples=budget,
            eval_every_samples=max(st.batch_size, budget // CURVE_POINTS),
            eval_max_samples=st.eval_max_samples,
            seed=st.seed,
        )
        callbacks = FineTuneCallbacks(progress=progress, desc=f"pretrain {model_name}", on_step=on_step)
        result = fine_tune(model, train, test, config, device=dev, callbacks=callbacks)
    finally:
        dev.close()  # restores any knob state
    wall = time.perf_counter() - started
    extra = {"pretrained_on": dataset_spec, "pretrain_samples": str(result.samples)}
    save_weights(
        out, model, model_name=model_name, num_classes=dataset.num_classes, overrides=overrides, extra=extra
    )
    report = {
        "schema": PRETRAIN_SCHEMA,
        "model": model_name,
        "overrides": overrides,
        "task": spec.task,
        "num_classes": dataset.num_classes,
        "dataset": dataset_spec,
        "train_size": len(train),
        "test_size": len(test),
        "seq_len": length if spec.task == "text" else None,
        "batch_size": st.batch_size,
        "lr": st.lr,
        "seed": st.seed,
        "device": dev.spec,
        "torch_device": dev.torch_device(),
        "samples": result.samples,
        "epochs": result.samples / len(train),
        "steps": result.steps,
        "device_s": result.device_s,
        "wall_s": wall,
        "energy_j": result.energy_j,
        "final_test_accuracy": result.final_accuracy,
        "weights": out.name,
        "weights_sha256": weights_hash(model),
        "curve": [[p.samples, p.device_s, p.accuracy] for p in result.curve],
    }
    rpath = report_path_for(out)
    write_json(rpath, report)
    return PretrainReport(out, rpath, report)
