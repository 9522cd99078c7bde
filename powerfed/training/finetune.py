"""Fine-tune to a target accuracy (or a budget): the one training loop of the project.

Pre-training, relation-vector estimation and the clients all use this loop, so "samples to the target"
means the same thing everywhere. Every step goes through `device.run_step`, so a simulated board charges
its virtual clock and power sensor; device seconds count training steps only (evaluation excluded), as
the time-to-accuracy (docs/design/method.md) is a training time. The loop is lean (in-memory tensors, index
slicing, no DataLoader): its overhead must stay within a few percent of a bare PyTorch loop
(bench/loop_overhead.py measures it).
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from powerctl.devices.base import Device, PowerSamples
from powerctl.errors import ArgumentError
from powerctl.monitor import PowerMonitor, PowerReading
from powerctl.workload import Workload, measure_workload
from powerfed.training.checkpoint import (
    Checkpointing,
    Part,
    Tensors,
    identity_digest,
    optimizer_parts,
    optimizer_state,
    restore_parts,
    resumable,
    save_parts,
    state_digest,
)
from powerfed.training.errors import DataError
from powerfed.training.models import correct_count, loss_fn, targets_count

log = logging.getLogger(__name__)
"""`powerfed.training.finetune`: a fine-tune resumed from its checkpoint (INFO)."""

if TYPE_CHECKING:
    from powerfed.training.data import Dataset

__all__ = [
    "DEFAULT_EVAL_EVERY_SAMPLES",
    "DEFAULT_EVAL_MAX_SAMPLES",
    "DEFAULT_MAX_EPOCHS",
    "CurvePoint",
    "FineTuneResult",
    "LossFn",
    "MetricFn",
    "StepHook",
    "evaluate",
    "evaluate_with_loss",
    "step_workload",
    "fine_tune",
    "make_optimizer",
]

DEFAULT_EVAL_EVERY_SAMPLES = 1024
"""Evaluate after every this many training samples (the resolution of samples-to-target)."""
DEFAULT_EVAL_MAX_SAMPLES = 1024
"""Evaluate on at most this many test samples (a fixed subset, the same for every run)."""
DEFAULT_MAX_EPOCHS = 20
"""With neither `max_samples` nor `max_device_seconds`, stop after this many epochs of the train split,
so that an unreachable target can never run forever."""
EVAL_BATCH_SIZE = 256
POWER_RATE_HZ = 20.0
"""Power readings per second while training (what the step hooks and the energy figures see)."""
_EVAL_SUBSET_SEED = 0x5EED  # fixed: every run (any batch size, any seed) is evaluated on the same samples

OptimizerFactory = Callable[[Iterable[nn.Parameter], float], torch.optim.Optimizer]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(model outputs, targets) → the scalar loss to minimise (default: the task's,
`powerfed.training.models.loss_fn`)."""
MetricFn = Callable[[torch.Tensor, torch.Tensor], float]
"""(outputs, targets) of the whole evaluation subset → the accuracy-like number the target is set in
(higher is better; default: the task's top-1 accuracy, per character for text)."""
MakeStep = Callable[[nn.Module], Callable[..., Any]]
"""model → the user's training step `step(x, y)` (one optimizer step on one batch): what a
`PowerSession` profiles and the loop runs, and what `estimate_relation(make_step=...)` trains with."""


class StepHook(Protocol):
    """What acts between training steps: `powerctl`'s power guard and cap follower satisfy it as they
    are (powerctl does not import `training`). Every method is called by `fine_tune` alone."""

    def before_step(self, samples: int) -> int | None:
        """Before every step, with the samples trained so far: the batch size to train with from now
        on when it changes (the optimizer state is kept, the rate rescaled), else None."""
        ...

    def after_step(self, power: PowerSamples, device_seconds: float) -> None:
        """After every step: the power readings taken during it (none without a sensor) and the
        training device seconds so far."""
        ...

    def resume_state(self) -> dict[str, Any]:
        """What a resumed run needs to continue this hook exactly (JSON; {} when nothing)."""
        ...

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Continue from `resume_state()` (called after the device's own state is back)."""
        ...


@dataclass(frozen=True)
class CurvePoint:
    samples: int
    device_seconds: float
    accuracy: float


@dataclass
class FineTuneResult:
    reached: bool
    """True when the test accuracy reached `target_accuracy`."""
    samples: int
    """Training samples consumed when the target was first reached, or in total."""
    device_seconds: float
    """Device-clock seconds of the training steps only (evaluation excluded)."""
    energy_j: float | None
    """Energy over the training steps, None when the device has no power sensor."""
    peak_power_w: float | None
    mean_power_w: float | None
    final_accuracy: float
    curve: list[CurvePoint]
    batch_size: int
    """The batch size the run started with (a step hook may have changed it since)."""
    lr: float
    """The learning rate the run started with."""
    steps: int
    target_accuracy: float | None = None
    stop_reason: str = ""
    """"target", "max_samples" or "max_device_seconds"."""
    wall_seconds: float = 0.0
    """Host wall time of the whole call, evaluation included (for overhead accounting, not for TTA)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_optimizer(
    task: str, params: Iterable[nn.Parameter], lr: float, optimizer: str | OptimizerFactory | None = None
) -> torch.optim.Optimizer:
    """Adam for images, AdamW for text (the paper's choice); a name or a factory overrides it."""
    if optimizer is None:
        optimizer = "adamw" if task == "text" else "adam"
    if callable(optimizer):
        return optimizer(params, lr)
    if optimizer == "adam":
        return torch.optim.Adam(params, lr=lr)
    if optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    raise ValueError(f"unknown optimizer {optimizer!r}; use adam, adamw or sgd")


def _model_device(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def _eval_subset(test: Dataset, eval_max_samples: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(test)
    if eval_max_samples is None or eval_max_samples >= n:
        return test.x, test.y
    g = torch.Generator().manual_seed(_EVAL_SUBSET_SEED)
    idx = torch.randperm(n, generator=g)[:eval_max_samples].sort().values
    return test.x[idx], test.y[idx]


@torch.no_grad()
def evaluate_with_loss(
    model: nn.Module,
    task: str,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    loss: LossFn | None = None,
    metric: MetricFn | None = None,
) -> tuple[float, float]:
    """(accuracy, mean loss) of `model` on (x, y): eval mode, no gradients, fixed batches; train mode
    restored. The loss is the training loss (`loss`, default the task's), averaged over samples; the
    accuracy is the task's, or `metric` of every batch's outputs together."""
    was_training = model.training
    model.eval()
    criterion = loss or loss_fn(task)
    correct = total = 0
    loss_sum = 0.0
    outputs: list[torch.Tensor] = []
    try:
        for start in range(0, len(x), EVAL_BATCH_SIZE):
            xb, yb = x[start : start + EVAL_BATCH_SIZE], y[start : start + EVAL_BATCH_SIZE]
            logits = model(xb)
            if metric is None:
                correct += correct_count(task, logits, yb)
                total += targets_count(task, yb)
            else:
                outputs.append(logits)
            loss_sum += float(criterion(logits, yb)) * len(xb)
    finally:
        model.train(was_training)
    if metric is not None:
        accuracy = _metric_value(metric, torch.cat(outputs), y) if outputs else 0.0
    else:
        accuracy = correct / total if total else 0.0
    return accuracy, (loss_sum / len(x) if len(x) else math.nan)


def _metric_value(metric: MetricFn, outputs: torch.Tensor, targets: torch.Tensor) -> float:
    """A user's metric's value, which must be an accuracy in [0, 1]: anything else is one line naming
    the metric (not a TypeError from deep in the loop, nor a NaN that never crosses the target)."""
    value = metric(outputs, targets)
    number = (
        float(value)
        if isinstance(value, (int, float, torch.Tensor)) and torch.numel(torch.as_tensor(value)) == 1
        else None
    )
    if number is None or not 0.0 <= number <= 1.0:
        name = getattr(metric, "__name__", type(metric).__name__)
        raise ArgumentError(
            f"metric {name}(outputs, targets) returned {value!r}; it must return an accuracy in [0, 1]"
        )
    return number


def evaluate(
    model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor, *, metric: MetricFn | None = None
) -> float:
    """Accuracy of `model` on (x, y) (see `evaluate_with_loss`)."""
    return evaluate_with_loss(model, task, x, y, metric=metric)[0]


def step_workload(
    model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor, loss: LossFn | None = None
) -> Workload:
    """Workload of one step, from a batch of 2; buffers (BatchNorm statistics) are put back after."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    name = getattr(model, "model_name", None) or type(model).__name__
    wl = measure_workload(model, x[:2], y[:2], loss or loss_fn(task), name)
    with torch.no_grad():
        for bname, b in model.named_buffers():
            b.copy_(buffers[bname])
    return wl


class TrainingPower:
    """Power over the training segments only: the monitor is paused around every evaluation."""

    def __init__(self, device: Device, rate_hz: float) -> None:
        self._monitor = PowerMonitor(device, rate_hz) if device.has_power_sensor else None
        self.readings: list[PowerReading] = []
        self._open = False
        self._seen = 0

    def resume(self) -> None:
        if self._monitor is not None and not self._open:
            self._monitor.start()
            self._open = True
            self._seen = 0

    def new_samples(self) -> PowerSamples:
        """The readings since the last call (the step just run), for the step hooks."""
        if self._monitor is None or not self._open:
            return []
        samples = self._monitor.samples_so_far()
        end = len(samples)
        new = samples[self._seen : end]
        self._seen = end
        return new

    def pause(self) -> None:
        if self._monitor is not None and self._open:
            self._open = False
            if (reading := self._monitor.stop()) is not None:
                self.readings.append(reading)

    def abort(self) -> None:
        if self._monitor is not None and self._open:
            self._open = False
            self._monitor.stop(keep=False)

    def summary(self) -> tuple[float | None, float | None, float | None]:
        """(energy J, peak W, mean W) over all segments, or Nones without a sensor."""
        if self._monitor is None or not self.readings:
            return None, None, None
        energy = sum(r.energy_j for r in self.readings)
        seconds = sum(r.seconds for r in self.readings)
        peak = max(r.peak_w for r in self.readings)
        mean = energy / seconds if seconds > 0 else sum(r.mean_w for r in self.readings) / len(self.readings)
        return energy, peak, mean

    def resume_state(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.readings]

    def load_resume_state(self, readings: list[dict[str, Any]]) -> None:
        self.readings = [PowerReading(**r) for r in readings]


@dataclass
class _Progress:
    """Where a run stands: what the loop advances, saved and restored field by field."""

    batch_size: int
    lr: float
    next_eval: int
    """Evaluate once `samples` reaches this."""
    samples: int = 0
    steps: int = 0
    device_seconds: float = 0.0
    first: int = 0
    """Where in `perm` the next batch starts."""
    perm: torch.Tensor | None = None
    """This epoch's order of the train split (a new one when the next batch does not fit)."""
    curve: list[CurvePoint] = field(default_factory=list)
    stop_reason: str = ""
    """Why the run ended ("target", "max_samples", "max_device_seconds"); "" while it runs."""

    def take(self) -> tuple[Tensors, dict[str, Any]]:
        """(the permutation, every other field) for a checkpoint."""
        assert self.perm is not None, "a checkpoint is taken after a step"
        plain = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("perm", "curve")}
        return {"perm": self.perm}, {**plain, "curve": [asdict(p) for p in self.curve]}

    def put(self, tensors: Tensors, plain: dict[str, Any], device: torch.device) -> None:
        """Back to what `take` returned."""
        for name, value in plain.items():
            setattr(self, name, [CurvePoint(**p) for p in value] if name == "curve" else value)
        self.perm = tensors["perm"].to(device)


def _rng_states(gen: torch.Generator, cuda: list[int]) -> Tensors:
    states = {"torch": torch.get_rng_state(), "data": gen.get_state()}
    return states | ({"cuda": torch.cuda.get_rng_state(cuda[0])} if cuda else {})


def _set_rng_states(gen: torch.Generator, cuda: list[int], states: Tensors) -> None:
    torch.set_rng_state(states["torch"])
    gen.set_state(states["data"])
    if cuda and "cuda" in states:
        torch.cuda.set_rng_state(states["cuda"], cuda[0])


def _resumable_parts(
    run: _Progress,
    dev: torch.device,
    model: nn.Module,
    opt: torch.optim.Optimizer,
    gen: torch.Generator,
    cuda: list[int],
    power: TrainingPower,
    device: Device,
    hooks: Sequence[StepHook],
) -> dict[str, Part]:
    """Everything a resumed run needs to end where an uninterrupted one ends, each piece once:
    checkpoints are written and read back from this table, in its order (the device before the hooks:
    a follower resumes on the device's clock)."""
    return {
        "model": Part(lambda: (model.state_dict(), None), lambda t, _: model.load_state_dict(t)),
        "optimizer": Part(
            lambda: optimizer_parts(opt), lambda t, plain: opt.load_state_dict(optimizer_state(t, plain))
        ),
        "rng": Part(lambda: (_rng_states(gen, cuda), None), lambda t, _: _set_rng_states(gen, cuda, t)),
        "progress": Part(run.take, lambda t, plain: run.put(t, plain, dev)),
        "power": Part(lambda: ({}, power.resume_state()), lambda _, plain: power.load_resume_state(plain)),
        "device": Part(lambda: ({}, device.resume_state()), lambda _, plain: device.load_resume_state(plain)),
        "hooks": Part(
            lambda: ({}, [h.resume_state() for h in hooks]),
            lambda _, states: [h.load_resume_state(st) for h, st in zip(hooks, states, strict=True)],
        ),
    }


def _identity(
    checkpoint: Checkpointing,
    model: nn.Module,
    train: Dataset,
    test: Dataset,
    device: Device,
    hooks: Sequence[StepHook],
    settings: dict[str, Any],
) -> str:
    """What this run is (a checkpoint of anything else is not resumed): the caller's key, the starting
    weights, the data, the settings, the device and the kinds of hooks."""
    return identity_digest(
        {
            "key": checkpoint.key,
            "weights": state_digest(model.state_dict()),
            "train": [train.name, len(train)],
            "test": [test.name, len(test)],
            "settings": settings,
            "device": getattr(device, "spec", type(device).__name__),
            "hooks": [type(h).__name__ for h in hooks],
        }
    )


def _check_positive(name: str, value: float | None, *, integer: bool = False) -> None:
    if value is None:
        return
    bad_type = isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
    if bad_type or not math.isfinite(value) or value <= 0:
        kind = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")


def _check_args(
    train: Dataset,
    test: Dataset,
    batch_size: int,
    lr: float,
    target_accuracy: float | None,
    max_samples: int | None,
    max_device_seconds: float | None,
    eval_every_samples: int | None,
    eval_max_samples: int | None,
) -> None:
    """One ValueError or DataError line for anything `fine_tune` cannot run with."""
    _check_positive("batch_size", batch_size, integer=True)
    _check_positive("lr", lr)
    _check_positive("max_samples", max_samples, integer=True)
    _check_positive("max_device_seconds", max_device_seconds)
    _check_positive("eval_every_samples", eval_every_samples, integer=True)
    _check_positive("eval_max_samples", eval_max_samples, integer=True)
    if target_accuracy is not None and not 0.0 < target_accuracy <= 1.0:
        raise ValueError(f"target_accuracy must be in (0, 1], got {target_accuracy}")
    if target_accuracy is not None and eval_every_samples is None:
        raise ValueError("a target accuracy needs periodic evaluation: set eval_every_samples")
    if train.task != test.task:
        raise DataError(f"train split is {train.task!r} data but test split is {test.task!r}")
    if len(train) < batch_size:
        raise DataError(
            f"the train split of {train.name} has {len(train)} samples, fewer than batch size {batch_size}; "
            "use a smaller batch size or more data"
        )
    if len(test) == 0:
        raise DataError(f"the test split of {test.name} is empty")


def _train_step(
    model: nn.Module, opt: torch.optim.Optimizer, criterion: nn.Module, xb: torch.Tensor, yb: torch.Tensor
) -> None:
    opt.zero_grad(set_to_none=True)
    criterion(model(xb), yb).backward()
    opt.step()


def fine_tune(
    model: nn.Module,
    train: Dataset,
    test: Dataset,
    *,
    device: Device,
    batch_size: int,
    lr: float | Callable[[int], float],
    target_accuracy: float | None,
    workload: Workload | None = None,
    max_samples: int | None = None,
    max_device_seconds: float | None = None,
    eval_every_samples: int | None = DEFAULT_EVAL_EVERY_SAMPLES,
    eval_max_samples: int | None = DEFAULT_EVAL_MAX_SAMPLES,
    seed: int = 0,
    optimizer: str | OptimizerFactory | None = None,
    progress: bool = True,
    desc: str | None = None,
    checkpoint: Checkpointing | None = None,
    hooks: Sequence[StepHook] = (),
    on_step: Callable[[int, int], None] | None = None,
    loss: LossFn | None = None,
    metric: MetricFn | None = None,
    make_step: MakeStep | None = None,
) -> FineTuneResult:
    """Train `model` in place on `train` until its accuracy on `test` reaches `target_accuracy`.

    Stops at the first evaluation at or above the target, or when `max_samples` training samples or
    `max_device_seconds` device seconds are spent (with neither, after DEFAULT_MAX_EPOCHS epochs).
    `target_accuracy=None` trains for the budget only (pre-training). Evaluation happens before
    training, every `eval_every_samples` samples (None: only at the end) and at the end, on a fixed
    subset of at most `eval_max_samples` test samples. Batches are drawn from a seeded permutation per
    epoch (the last incomplete batch of an epoch is dropped so every step has `batch_size` samples).
    Same seed, same data, same starting weights → the same curve (on the CPU).

    `lr` is the learning rate, or the rule batch size → rate (needed when a hook changes the batch
    size; a number is the same rate for every size). `hooks` act between steps (`StepHook`: the power
    guard, a cap follower): before a step a hook may hand over another batch size, which takes effect
    at once with the optimizer state kept and the rate `lr(b)`; after it, each sees its power readings.
    What they did, they keep (the caller reads it from them). `batch_size` is where the run starts.
    With `checkpoint`, the run saves itself at evaluations (see `powerfed.training.checkpoint`) and, when a
    checkpoint of the same work exists, continues from it instead of starting over: the weights,
    samples, accuracy curve, device seconds, energy and the hooks' state are then those of a run never
    interrupted. A finished run leaves its end state there (one file, replaced by the next work's): the
    same work again returns the same result at once, without training (`extra.resumed_at_samples`
    then equals `samples`). `on_step(steps, samples)` is called
    after every training step (progress reports, fault injection); what it raises ends the run.
    `loss` and `metric` replace the task's loss and accuracy (`LossFn`, `MetricFn`): a user's model
    whose outputs or targets are not the task's. `make_step(model)` replaces the whole training step
    with the user's own (`step(x, y)`: their optimizer, their loss, a proximal term, two passes; the
    one a `PowerSession` takes): `lr`, `optimizer` and `loss` then do not train (the step has its own),
    and a run with it is not checkpointed (its optimizer state is the step's).
    """
    if make_step is not None and (checkpoint is not None or hooks):
        raise ArgumentError("fine_tune: a user's make_step runs without checkpoints or step hooks")
    lr_for = lr if callable(lr) else (lambda _: lr)
    start_lr = lr_for(batch_size)
    _check_args(
        train,
        test,
        batch_size,
        start_lr,
        target_accuracy,
        max_samples,
        max_device_seconds,
        eval_every_samples,
        eval_max_samples,
    )
    wall_start = time.perf_counter()
    task, n = train.task, len(train)
    if max_samples is None and max_device_seconds is None:
        max_samples = DEFAULT_MAX_EPOCHS * n
    dev = _model_device(model)
    x, y = train.x.to(dev), train.y.to(dev)
    ex, ey = (t.to(dev) for t in _eval_subset(test, eval_max_samples))
    if workload is None:
        workload = step_workload(model, task, x, y, loss)
    criterion = loss or loss_fn(task)
    model.train()
    run = _Progress(batch_size, float(start_lr), eval_every_samples or 0)
    identity, saved, resumed_at = "", None, None
    if checkpoint is not None:
        settings = {
            "batch_size": batch_size,
            "lr": run.lr,
            "target_accuracy": target_accuracy,
            "max_samples": max_samples,
            "max_device_seconds": max_device_seconds,
            "eval": [eval_every_samples, eval_max_samples],
            "seed": seed,
            "optimizer": optimizer if optimizer is None or isinstance(optimizer, str) else "custom",
        }
        identity = _identity(checkpoint, model, train, test, device, hooks, settings)
        saved = resumable(checkpoint, identity)
    cuda = [dev.index or 0] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)  # dropout and friends: repeatable, and the caller's RNG is left alone
        opt = make_optimizer(task, model.parameters(), run.lr, optimizer)
        user_step = make_step(model) if make_step is not None else None
        gen = torch.Generator().manual_seed(seed)
        power = TrainingPower(device, POWER_RATE_HZ)
        parts = _resumable_parts(run, dev, model, opt, gen, cuda, power, device, hooks)
        finished = False
        if saved is not None:
            restore_parts(saved, parts)
            resumed_at, finished = run.samples, bool(run.stop_reason)
            if finished:
                log.info(
                    "checkpoint: %s holds this work's end (%s samples, stopped at %s): its result again, "
                    "without training",
                    saved.path,
                    resumed_at,
                    run.stop_reason,
                )
            else:
                log.info("checkpoint: resuming from %s at %s samples", saved.path, resumed_at)
        saved_at = run.samples
        bar = _progress_bar(progress, max_samples, desc, run.samples)

        def look() -> bool:
            """Evaluate now; True when the target is met."""
            acc = evaluate(model, task, ex, ey, metric=metric)
            run.curve.append(CurvePoint(run.samples, run.device_seconds, acc))
            if bar is not None:
                bar.set_postfix(acc=f"{acc:.3f}", dev_s=f"{run.device_seconds:.1f}", refresh=False)
            return target_accuracy is not None and acc >= target_accuracy

        try:
            if saved is None and eval_every_samples is not None and look():
                run.stop_reason = "target"  # met before any training
            if not finished:  # (a finished run's end state: no step, no reading, no look)
                power.resume()
            while not run.stop_reason:
                for hook in hooks:
                    if (b := hook.before_step(run.samples)) is not None and b != run.batch_size:
                        run.batch_size, run.lr = b, float(lr_for(b))
                        for group in opt.param_groups:  # the optimizer state (moments) is kept
                            group["lr"] = run.lr
                if run.perm is None or run.first + run.batch_size > n:  # a new epoch; the tail is dropped
                    run.perm, run.first = torch.randperm(n, generator=gen).to(dev), 0
                idx = run.perm[run.first : run.first + run.batch_size]
                run.first += run.batch_size
                xb, yb = x.index_select(0, idx), y.index_select(0, idx)

                t0 = device.clock()
                device.run_step(
                    partial(user_step, xb, yb)
                    if user_step is not None
                    else partial(_train_step, model, opt, criterion, xb, yb),
                    batch_size=run.batch_size,
                    workload=workload,
                )
                run.device_seconds += device.clock() - t0
                run.samples += run.batch_size
                run.steps += 1
                if hooks:
                    readings = power.new_samples()
                    for hook in hooks:
                        hook.after_step(readings, run.device_seconds)
                if bar is not None:
                    bar.update(run.batch_size)
                if on_step is not None:
                    on_step(run.steps, run.samples)

                if max_samples is not None and run.samples >= max_samples:
                    run.stop_reason = "max_samples"
                elif max_device_seconds is not None and run.device_seconds >= max_device_seconds:
                    run.stop_reason = "max_device_seconds"
                elif eval_every_samples is not None and run.samples >= run.next_eval:
                    power.pause()
                    met = look()
                    while run.next_eval <= run.samples:
                        run.next_eval += eval_every_samples
                    if met:
                        run.stop_reason = "target"
                    elif checkpoint is not None and run.samples - saved_at >= checkpoint.every_samples:
                        save_parts(checkpoint.path, identity, parts)
                        saved_at = run.samples
                    power.resume()
            power.pause()
            if not finished and run.stop_reason != "target" and look():
                run.stop_reason = "target"  # budget spent: one last look may still meet the target
        except BaseException:
            power.abort()
            raise
        finally:
            if bar is not None:
                bar.close()
        if checkpoint is not None and not finished:
            if run.perm is None:  # met before any step: nothing a resend would save
                checkpoint.path.unlink(missing_ok=True)
            else:  # the end state, for this same work sent again (a resent round)
                save_parts(checkpoint.path, identity, parts, finished=True)

    energy, peak, mean = power.summary()
    return FineTuneResult(
        reached=run.stop_reason == "target",
        samples=run.samples,
        device_seconds=run.device_seconds,
        energy_j=energy,
        peak_power_w=peak,
        mean_power_w=mean,
        final_accuracy=run.curve[-1].accuracy,
        curve=run.curve,
        batch_size=batch_size,
        lr=float(start_lr),
        steps=run.steps,
        target_accuracy=target_accuracy,
        stop_reason=run.stop_reason,
        wall_seconds=time.perf_counter() - wall_start,
        extra={} if resumed_at is None else {"resumed_at_samples": resumed_at},
    )


def _progress_bar(progress: bool, total: int | None, desc: str | None, done: int) -> Any:
    """A tqdm bar on stderr, only when asked for and stderr is a terminal (logs stay clean)."""
    if not progress or not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(
        total=total, initial=done, desc=desc or "fine-tune", unit="sample", file=sys.stderr, leave=False
    )
