"""The training step the profiler measures: the real model, optimizer and loss on task-shaped inputs."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from powerctl.records.workload import Workload
from powerfed.training.finetune_records import make_optimizer, train_step
from powerfed.training.models import build_model, example_batch, get_model_spec, model_workload
from powerfed.training.tasks import loss_fn


def profiling_step_factory(
    model_name: str,
    *,
    torch_device: str = "cpu",
    num_classes: int | None = None,
    model: nn.Module | None = None,
    seed: int = 0,
) -> tuple[Workload, Callable[[int], Callable[[], None]]]:
    """(workload, batch size → step) on random inputs of the task's shape: the fine-tune's own step (its
    optimizer and loss for the task), so power and time are those of the step that trains."""
    spec = get_model_spec(model_name)
    if model is None:
        model = build_model(model_name, **({"num_classes": num_classes} if num_classes else {}), seed=seed)
    workload = model_workload(model_name, model, num_classes)
    model = model.to(torch_device).train()
    optimizer = make_optimizer(spec.task, model.parameters(), 1e-4)
    loss = loss_fn(spec.task)
    gen = torch.Generator().manual_seed(seed)

    def make_step(batch_size: int) -> Callable[[], None]:
        x, y = example_batch(model_name, batch_size, num_classes, generator=gen)
        return partial(train_step, model, optimizer, loss, x.to(torch_device), y.to(torch_device))

    return workload, make_step
