"""The in-memory dataset every loader returns (the fine-tuning sets are small, and indexing a tensor
makes per-batch-size runs cheap to repeat), and the splits the method needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from powerfed.training.errors import DataError
from powerfed.training.tasks import TASKS

CIFAR10_CLASSES: tuple[str, ...] = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
CIFAR10_MEAN: tuple[float, float, float] = (0.4914, 0.4822, 0.4465)
CIFAR10_STD: tuple[float, float, float] = (0.2470, 0.2435, 0.2616)
"""Fixed normalisation for EVERY image dataset, the CIFAR-10 training mean/std per channel: pre-training,
proxy and local data all reach the network the same way, as transferring pre-trained weights needs."""


@dataclass
class Dataset:
    """Inputs and targets of one task, in memory. Images: x float32 [N, 3, 32, 32] normalised, y int64
    [N]. Text: x int64 [N, T] character ids, y the windows shifted by one, num_classes the vocabulary."""

    name: str
    task: str
    x: torch.Tensor
    y: torch.Tensor
    num_classes: int
    classes: tuple[str, ...] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    """Provenance and facts worth reporting (source path, split, dropped characters, ceilings)."""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise DataError(f"dataset {self.name!r}: task must be one of {TASKS}, got {self.task!r}")
        if len(self.x) != len(self.y):
            raise DataError(f"dataset {self.name!r}: {len(self.x)} inputs but {len(self.y)} targets")

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> Dataset:
        """The samples at `indices`, in that order (a copy; the parent is unchanged)."""
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return replace(self, x=self.x[idx], y=self.y[idx], info=dict(self.info))

    def labels(self) -> np.ndarray:
        """One label per sample, for stratifying and partitions (text: each window's first target)."""
        y = self.y if self.task == "image" else self.y[:, 0]
        return y.numpy().astype(np.int64, copy=False)


def normalise_uint8(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """uint8 [N, C, H, W] in 0..255 → float32 by the one fixed transform: CIFAR-10's per-channel
    constants for three channels, their means on every channel for any other count."""
    x = torch.as_tensor(images).to(torch.float32).div_(255.0)
    if x.shape[1] != 3:
        return x.sub_(float(np.mean(CIFAR10_MEAN))).div_(float(np.mean(CIFAR10_STD)))
    mean = torch.tensor(CIFAR10_MEAN, dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD, dtype=torch.float32).view(1, 3, 1, 1)
    return x.sub_(mean).div_(std)


def image_dataset(
    name: str,
    images: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    classes: Sequence[str] | None,
    **info: Any,
) -> Dataset:
    """Wrap uint8 [N, 3, 32, 32] images (each reader checked their shape) and integer labels, checking
    these lie in the classes."""
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(
            f"{name}: labels must lie in 0..{num_classes - 1}, found {labels.min()}..{labels.max()}"
        )
    return Dataset(
        name=name,
        task="image",
        x=normalise_uint8(images),
        y=torch.from_numpy(labels),
        num_classes=num_classes,
        classes=tuple(classes) if classes is not None else None,
        info=info,
    )


def train_test_split(
    ds: Dataset, *, test_fraction: float | None = None, seed: int = 0
) -> tuple[Dataset, Dataset]:
    """Split into (train, test): default 20% test for images, 10% for text. Images: a seeded,
    stratified shuffle (a label-skewed client tests on its own label mix). Text: the contiguous tail of
    the windows (seed unused): a random split would test on passages the model has half seen."""
    frac = (0.2 if ds.task == "image" else 0.1) if test_fraction is None else float(test_fraction)
    if not 0.0 < frac < 1.0:
        raise DataError(f"test_fraction must be in (0, 1), got {frac}")
    n = len(ds)
    if n < 2:
        raise DataError(f"dataset {ds.name!r} has {n} sample(s); a train/test split needs at least 2")
    n_test = min(max(1, round(frac * n)), n - 1)
    if ds.task == "text":
        return ds.subset(np.arange(n - n_test)), ds.subset(np.arange(n - n_test, n))
    test_idx = _stratified_pick(ds.labels(), n_test, np.random.default_rng(seed))
    mask = np.zeros(n, dtype=bool)
    mask[test_idx] = True
    return ds.subset(np.flatnonzero(~mask)), ds.subset(np.flatnonzero(mask))


def _stratified_pick(labels: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """`k` random indices with each label represented in proportion (largest-remainder rounding)."""
    classes, counts = np.unique(labels, return_counts=True)
    want = counts * (k / len(labels))
    take = np.floor(want).astype(np.int64)
    extra = k - int(take.sum())
    if extra > 0:
        order = np.argsort(-(want - take), kind="stable")
        take[order[:extra]] += 1
    picked = [
        rng.permutation(np.flatnonzero(labels == c))[:t] for c, t in zip(classes, take, strict=True) if t > 0
    ]
    return np.sort(np.concatenate(picked)) if picked else np.zeros(0, dtype=np.int64)
