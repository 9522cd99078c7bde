"""The records around the loop in `powerfed.training.finetune`: what it is asked (`FineTuneConfig`), what
steers it (`FineTuneCallbacks`, `StepHook`), the user's functions (`UserFunctions`), what it returns."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from powerctl.devices.base import PowerSamples
from powerctl.files.mapping import (
    Custom,
    Integer,
    Maybe,
    Number,
    check_arguments,
    check_callable,
    check_fields,
    field_kinds,
    kind_field,
)
from powerfed.training.checkpoint import Checkpointing

DEFAULT_EVAL_EVERY_SAMPLES = 1024
"""Evaluate after every this many training samples (the resolution of samples-to-target)."""
DEFAULT_EVAL_MAX_SAMPLES = 1024
"""Evaluate on at most this many test samples (a fixed subset, the same for every run)."""
DEFAULT_MAX_EPOCHS = 20
"""With neither `max_samples` nor `max_device_s`, stop after this many epochs of the train split,
so that an unreachable target can never run forever."""

OptimizerFactory = Callable[[Iterable[nn.Parameter], float], torch.optim.Optimizer]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""(model outputs, targets) → the scalar loss to minimise (default: the task's)."""
MetricFn = Callable[[torch.Tensor, torch.Tensor], float]
"""(outputs, targets) of the whole evaluation subset → the accuracy-like number the target is set in
(higher is better; default: the task's top-1 accuracy, per character for text)."""
MakeStep = Callable[[nn.Module], Callable[..., Any]]
"""model → the user's training step `step(x, y)` (one optimizer step on one batch)."""
TrainToTarget = Callable[..., float | None]
"""A user's own loop: (batch_size, lr, seed[, target_accuracy]) → samples to the target, None when it was
not reached (a callable that takes a fourth argument is given the target)."""


class StepHook(Protocol):
    """What acts between training steps, called by `fine_tune` alone: `powerctl`'s power guard and cap
    follower satisfy it as they are (powerctl does not import `training`)."""

    def before_step(self, samples: int) -> int | None:
        """Before every step, with the samples trained so far: the batch size to train with from now
        on when it changes (the optimizer state is kept, the rate rescaled), else None."""
        ...

    def after_step(self, power: PowerSamples, device_s: float) -> None:
        """After every step: the power readings taken during it (none without a sensor) and the
        training device seconds so far."""
        ...

    def resume_state(self) -> dict[str, Any]:
        """What a resumed run needs to continue this hook exactly (JSON; {} when nothing)."""
        ...

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Continue from `resume_state()` (called after the device's own state is back)."""
        ...


def step_failed(hook: StepHook, exc: Exception) -> int | None:
    """A hook's optional `step_failed(exc)` on a step that raised: the batch size to go on with (the step
    did not train; the in-training confirmation drops one that ran out of memory), or None: it stands."""
    handler = getattr(hook, "step_failed", None)
    return None if handler is None else handler(exc)


@dataclass(frozen=True)
class CurvePoint:
    samples: int
    device_s: float
    accuracy: float


@dataclass
class FineTuneResult:
    reached: bool
    """True when the test accuracy reached `target_accuracy`."""
    samples: int
    """Training samples consumed when the target was first reached, or in total."""
    device_s: float
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
    """"target", "max_samples" or "max_device_s"."""
    wall_s: float = 0.0
    """Host wall time of the whole call, evaluation included (for overhead accounting, not for TTA)."""
    extra: dict[str, Any] = field(default_factory=dict)


COUNT, RATE = Integer(1), Number(0.0, above=True)
RATE_OR_RULE = Custom(lambda lr: lr if callable(lr) else RATE(lr))  # a rule's rate: checked by `start_lr`


@dataclass(frozen=True)
class FineTuneConfig:
    """What a fine-tune is asked to do: where it starts, when it stops, how it is judged. Checked when
    made (one ValueError line), so no run starts with settings it could not finish."""

    batch_size: int = kind_field(COUNT)
    """The batch size the run starts with (a step hook may change it)."""
    lr: float | Callable[[int], float] = kind_field(RATE_OR_RULE)  # noqa: RUF009
    """The learning rate, or the rule batch size → rate (for a hook that changes the batch size)."""
    target_accuracy: float | None = kind_field(Maybe(Number(0.0, 1.0, above=True)))
    """Stop at the first evaluation at or above it; None trains for the budget only (pre-training)."""
    max_samples: int | None = kind_field(Maybe(COUNT), None)
    """Training samples to spend at most (with no budget at all: DEFAULT_MAX_EPOCHS epochs)."""
    max_device_s: float | None = kind_field(Maybe(RATE), None)
    """Device seconds of training steps to spend at most."""
    eval_every_samples: int | None = kind_field(Maybe(COUNT), DEFAULT_EVAL_EVERY_SAMPLES)
    """Evaluate after every this many training samples (None: only before training and at the end)."""
    eval_max_samples: int | None = kind_field(Maybe(COUNT), DEFAULT_EVAL_MAX_SAMPLES)
    """Evaluate on a fixed subset of at most this many test samples (None: all of them)."""
    seed: int = 0
    """Seeds the batch order and the run's own RNG (dropout): same seed, same curve (on the CPU)."""
    optimizer: str | OptimizerFactory | None = None
    """adam, adamw, sgd or a factory; None: the task's (`make_optimizer`)."""

    def __post_init__(self) -> None:
        check_fields(self, "FineTuneConfig", field_kinds(self))
        if self.target_accuracy is not None and self.eval_every_samples is None:
            raise ValueError("a target accuracy needs periodic evaluation: set eval_every_samples")

    def start_lr(self) -> float:
        """The rate the run starts with: a rule is asked here, once per run, and its answer checked."""
        lr = self.lr(self.batch_size) if callable(self.lr) else self.lr
        return check_arguments("FineTuneConfig", lr=(lr, RATE))["lr"]

    def rate(self, batch_size: int) -> float:
        """The rate for a batch size a step hook handed over."""
        return float(self.lr(batch_size) if callable(self.lr) else self.lr)

    def sample_budget(self, train_samples: int) -> int | None:
        """`max_samples`, or with no budget at all DEFAULT_MAX_EPOCHS epochs of the train split."""
        if self.max_samples is None and self.max_device_s is None:
            return DEFAULT_MAX_EPOCHS * train_samples
        return self.max_samples


@dataclass(frozen=True)
class FineTuneCallbacks:
    """What watches or steers a run without being what it is asked to do (`FineTuneConfig`)."""

    progress: bool = True
    """A tqdm bar on stderr, shown only when stderr is a terminal."""
    desc: str | None = None
    """The bar's label (default "fine-tune")."""
    checkpoint: Checkpointing | None = None
    """Save at evaluations and resume the same work from there (`powerfed.training.checkpoint`)."""
    hooks: Sequence[StepHook] = ()
    """What acts between steps (`StepHook`: the power guard, a cap follower); what they did, they keep."""
    on_step: Callable[[int, int], None] | None = None
    """`on_step(steps, samples)` after every training step; what it raises ends the run."""


@dataclass(frozen=True)
class UserFunctions:
    """The user's own loss, metric or whole training step, for a model whose outputs or targets are not
    the task's (None: the task's)."""

    loss: LossFn | None = None
    metric: MetricFn | None = None
    make_step: MakeStep | None = None
    """The whole training step (`step(x, y)`, the one a `PowerSession` takes): `lr`, `optimizer` and
    `loss` then do not train, and the run has no checkpoints or step hooks."""
    train_to_target: TrainToTarget | None = None
    """The whole loop instead of the project's (`estimate_relation` only: the crossing is then the
    user's); `fine_tune`, the project's loop, refuses it."""

    def __post_init__(self) -> None:
        """Each function checked where it is given: one ArgumentError line, not a TypeError later."""
        where = "UserFunctions"
        check_callable(where, "loss", self.loss, "(outputs, targets)", 2, optional=True)
        check_callable(where, "metric", self.metric, "(outputs, targets)", 2, optional=True)
        check_callable(where, "make_step", self.make_step, "(model)", 1, optional=True)
        args = "(batch_size, lr, seed[, target_accuracy])"
        check_callable(where, "train_to_target", self.train_to_target, args, 3, 4, optional=True)


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


def train_step(
    model: nn.Module, opt: torch.optim.Optimizer, criterion: LossFn, xb: torch.Tensor, yb: torch.Tensor
) -> None:
    """One optimizer step on one batch: the step the loop trains with and the profiler measures."""
    opt.zero_grad(set_to_none=True)
    criterion(model(xb), yb).backward()
    opt.step()
