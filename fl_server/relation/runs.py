"""The proxy runs of a relation estimate: what they share (`ProxyRuns`), one run to the target
(`run_to_target`), a run as a record that crosses to a Ray worker (`run_job`, `run_user_job`), and the
probe that a model and its data fit."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from fl_server.relation.request import RelationError, RelationRequest
from fl_server.relation_data import Proxy
from powerctl.devices.base import Device
from powerctl.devices.host import HostDevice
from powerctl.files.mapping import accepts
from powerctl.records.workload import Workload
from powerfed.training.crossing import DEFAULT_MIN_EVALUATIONS, run_dense
from powerfed.training.data import Dataset
from powerfed.training.errors import DataError, ModelError
from powerfed.training.evaluation import eval_subset
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import (
    FineTuneCallbacks,
    FineTuneConfig,
    FineTuneResult,
    TrainToTarget,
    UserFunctions,
)
from powerfed.training.models import ModelSpec, build_spec, check_data_fits, model_fingerprint
from powerfed.training.trace import StepTrace

INIT_SEED = 0  # seed of the starting weights when none are given
RECORD_KEYS = ("batch_size", "seed", "lr")  # a run record's first keys, from its FineTuneConfig


@dataclass(frozen=True)
class Start:
    """Where an estimate's runs start: the model, its starting weights (None: a seeded init, made once
    the data gives the classes) and their file, the device, the proxy's reader."""

    spec: ModelSpec
    state: dict[str, torch.Tensor] | None
    num_classes: int | None
    weights: str | Path | None
    device: str
    read: Callable[[], Proxy]


@dataclass(frozen=True)
class ProxyRuns:
    """What every run of one estimate shares: the model and its starting weights, the train/test split,
    how densely a crossing is read, the user's functions, where it trains (the paper tables' runs too)."""

    spec: ModelSpec
    """The model's registry entry (a Ray worker has not run the user's `register_model`)."""
    num_classes: int
    state: dict[str, torch.Tensor]
    train: Dataset
    test: Dataset
    overrides: dict[str, Any] = field(default_factory=dict)
    min_evaluations: int = DEFAULT_MIN_EVALUATIONS  # as RelationSettings.min_evaluations
    user: UserFunctions = field(default_factory=UserFunctions)
    device: str = "cpu"
    workload: Workload | None = None
    """What the device charges per step (None: measured from the model, `fine_tune`'s default)."""


def run_to_target(
    runs: ProxyRuns, config: FineTuneConfig, *, host: Device | None = None, progress: bool = False
) -> tuple[FineTuneResult, float | None, int | None]:
    """One fine-tuning run from the shared starting weights, again with denser evaluation if it crossed
    too early (`run_dense`); with no target, one run for the budget. Returns (the run, its crossing or
    None, the evaluation interval used). `host`: the device (default: this host on `runs.device`)."""
    host = host or HostDevice(runs.device, torch_device=runs.device)
    callbacks = FineTuneCallbacks(progress=progress, desc=f"b={config.batch_size} seed={config.seed}")
    traced: list[tuple[StepTrace, FineTuneResult]] = []  # the last trained run, with its weights per step
    traceable = (
        runs.user.make_step is None
        and config.max_device_s is None
        and config.target_accuracy is not None
        and config.eval_every_samples is not None
    )

    def run(every: int | None) -> FineTuneResult:
        model = build_spec(runs.spec, runs.num_classes, **runs.overrides)
        model.load_state_dict(runs.state)
        model = model.to(host.torch_device())
        trace = StepTrace(model) if traceable else None
        result = fine_tune(
            model,
            runs.train,
            runs.test,
            replace(config, eval_every_samples=every),
            device=host,
            workload=runs.workload,
            callbacks=callbacks if trace is None else replace(callbacks, hooks=(trace,)),
            user=runs.user,
        )
        traced[:] = [] if trace is None else [(trace, result)]
        return result

    def replay(every: int) -> FineTuneResult | None:
        """The run again, evaluated every `every` samples, from the last trained run's weights."""
        if not traced:
            return None
        trace, first = traced[0]
        x, y = eval_subset(runs.test, config.eval_max_samples)
        dev = host.torch_device()
        budget = config.sample_budget(len(runs.train))
        return trace.replay(
            first, every, eval_x=x.to(dev), eval_y=y.to(dev), task=runs.train.task, max_samples=budget,
            metric=runs.user.metric,
        )  # fmt: skip

    every = config.eval_every_samples
    if config.target_accuracy is None or every is None:
        return run(every), None, every
    return run_dense(
        run,
        batch_size=config.batch_size,
        eval_every_samples=every,
        target=config.target_accuracy,
        replay=replay,
        min_evaluations=runs.min_evaluations,
    )


def run_job(runs: ProxyRuns, config: FineTuneConfig, progress: bool, threads: int) -> dict[str, Any]:
    """One run to the target with `threads` torch threads, as a plain dict so that it crosses Ray."""
    with torch_threads(threads):
        result, crossing, every = run_to_target(runs, config, progress=progress)
    return {
        **{k: getattr(config, k) for k in RECORD_KEYS},
        "reached": result.reached,
        "samples": float(crossing) if crossing is not None else float(result.samples),
        "samples_at_evaluation": result.samples,
        "eval_every_samples": every,
        "evaluations": len(result.curve) - 1,
        "steps": result.steps,
        "final_accuracy": result.final_accuracy,
        "best_accuracy": max(p.accuracy for p in result.curve),
        "initial_accuracy": result.curve[0].accuracy,
        "wall_s": result.wall_s,
    }


@contextlib.contextmanager
def torch_threads(threads: int) -> Any:
    """torch's intra-op thread count `threads` for the block, the caller's put back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_user_job(
    train_to_target: TrainToTarget, config: FineTuneConfig, progress: bool, threads: int
) -> dict[str, Any]:
    """One run of the user's own loop, its answer checked, as a record like `run_job`'s."""
    batch_size, lr, seed, target_accuracy = config.batch_size, config.lr, config.seed, config.target_accuracy
    started = time.perf_counter()
    args: tuple[Any, ...] = (batch_size, lr, seed)
    if accepts(train_to_target, 4) is True:  # then it is given the target (unreadable: the three)
        args = (*args, target_accuracy)
    with torch_threads(threads):
        samples = train_to_target(*args)
    ok = samples is None or (
        isinstance(samples, (int, float)) and not isinstance(samples, bool) and not math.isnan(samples)
    )
    if not ok or (samples is not None and samples < 0):
        raise RelationError(
            f"train_to_target({batch_size}, {lr:g}, {seed}) returned {samples!r}: it must return the "
            "samples it trained until the target (a number ≥ 0), or None when it missed the target"
        )
    reached = samples is not None and math.isfinite(samples)
    return {
        **{k: getattr(config, k) for k in RECORD_KEYS},
        "reached": reached,
        "samples": float(samples) if reached and samples is not None else math.inf,
        "wall_s": time.perf_counter() - started,
    }


def probe(runs: ProxyRuns, proxy: str) -> dict[str, Any]:
    """One forward and loss on two proxy samples before any run: a model and data that do not fit are
    one line, not a traceback from a Ray task. Returns the model's fingerprint."""
    from powerfed.training.tasks import loss_fn

    spec, train, device = runs.spec, runs.train, runs.device
    model = build_spec(spec, runs.num_classes, **runs.overrides)
    model.load_state_dict(runs.state)
    model = model.to(device)
    try:
        with torch.no_grad():
            model.eval()
            x, y = train.x[:2].to(device), train.y[:2].to(device)
            float((runs.user.loss or loss_fn(spec.task))(model(x), y))
    except Exception as exc:  # the user's model, loss or data: any error means they do not fit
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"model {spec.name!r} cannot train on {proxy} (inputs {tuple(train.x.shape[1:])}, targets "
            f"{tuple(train.y.shape[1:]) or 'one per sample'}): {first}"
        ) from None
    return model_fingerprint(model)


def make_proxy_runs(start: Start, request: RelationRequest, user: UserFunctions) -> ProxyRuns:
    """The runs' shared part, the proxy read if not yet and checked against the model."""
    spec, bs, data = start.spec, request.batch_sizes, start.read()
    dataset, train = data.whole, data.train
    check_data_fits(spec, dataset, data.label)
    if len(train) < bs[-1]:
        raise DataError(f"proxy train split has {len(train)} samples, fewer than batch size {bs[-1]}")
    num_classes, state = start.num_classes, start.state
    if num_classes is not None and num_classes != dataset.num_classes:
        raise DataError(
            f"{start.weights}: weights have {num_classes} outputs, "
            f"{data.label} has {dataset.num_classes} classes"
        )
    if num_classes is None:
        num_classes = dataset.num_classes
        state = build_spec(spec, num_classes, seed=INIT_SEED, **request.overrides).state_dict()
    assert state is not None  # weights come with their number of classes; without, built above
    return ProxyRuns(
        spec=spec,
        num_classes=num_classes,
        state=state,
        train=train,
        test=data.test,
        overrides=request.overrides,
        min_evaluations=request.settings.min_evaluations,
        user=user,
        device=start.device,
    )
