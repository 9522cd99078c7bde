"""The two tasks a model may have, "image" (one label per sample) and "text" (next-character ids [B, T]
scored at every position): the vocabulary, default classes, loss and accuracy."""

from __future__ import annotations

import string
from collections.abc import Callable

import torch
import torch.nn.functional as F

from powerfed.training.errors import ModelError

VOCAB: str = string.ascii_letters + string.digits + string.punctuation + " \n"
"""The paper's character vocabulary (96 symbols); text outside it is dropped by the loaders."""
VOCAB_SIZE: int = len(VOCAB)

TASKS = ("image", "text")


def check_task(task: str) -> str:
    """`task` itself when it is one of TASKS, else one ModelError line."""
    if task not in TASKS:
        raise ModelError(f"unknown task {task!r}; expected one of: {', '.join(TASKS)}")
    return task


def default_num_classes(task: str) -> int:
    """Ten CIFAR-style classes for images, the character vocabulary for text."""
    return VOCAB_SIZE if check_task(task) == "text" else 10


def _text_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def loss_fn(task: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross entropy: per sample for images, averaged over every position for text."""
    return _text_ce if check_task(task) == "text" else F.cross_entropy


def correct_count(task: str, logits: torch.Tensor, targets: torch.Tensor) -> int:
    """Top-1 hits for images; correctly predicted next characters (all positions) for text."""
    check_task(task)
    return int((logits.argmax(dim=-1) == targets).sum().item())


def targets_count(task: str, targets: torch.Tensor) -> int:
    """How many predictions `correct_count` scored: samples for images, positions for text."""
    check_task(task)
    return int(targets.numel())
