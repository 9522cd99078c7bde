"""How a fine-tune is judged: the fixed test subset every evaluation of a run reads, and the accuracy
(the task's, or the user's metric) and loss on it."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from powerctl.errors import ArgumentError
from powerfed.training.finetune_records import MetricFn
from powerfed.training.tasks import correct_count, loss_fn, targets_count

if TYPE_CHECKING:
    from powerfed.training.data import Dataset

EVAL_BATCH_SIZE = 256
_EVAL_SUBSET_SEED = 0x5EED  # fixed: every run (any batch size, any seed) is evaluated on the same samples


def eval_subset(test: Dataset, eval_max_samples: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """At most `eval_max_samples` test samples, the same for every run (a seeded choice, in their order)."""
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
    metric: MetricFn | None = None,
) -> tuple[float, float]:
    """(accuracy, mean loss) of `model` on (x, y) in eval mode (train mode restored): the task's loss per
    sample; the accuracy the task's, or `metric` of all outputs together."""
    was_training = model.training
    model.eval()
    criterion = loss_fn(task)
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
    """A user's metric's value, which must be an accuracy in [0, 1]: else one line naming the metric."""
    value = metric(outputs, targets)
    scalar = isinstance(value, (int, float, torch.Tensor)) and torch.numel(torch.as_tensor(value)) == 1
    if not scalar or not 0.0 <= float(value) <= 1.0:
        name = getattr(metric, "__name__", type(metric).__name__)
        raise ArgumentError(
            f"metric {name}(outputs, targets) returned {value!r}; it must return an accuracy in [0, 1]"
        )
    return float(value)


def evaluate(
    model: nn.Module, task: str, x: torch.Tensor, y: torch.Tensor, *, metric: MetricFn | None = None
) -> float:
    """Accuracy of `model` on (x, y) (see `evaluate_with_loss`)."""
    return evaluate_with_loss(model, task, x, y, metric=metric)[0]
