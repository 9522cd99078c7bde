"""Datasets: real loaders (CIFAR, CINIC, SVHN, Fashion-MNIST, text, npz), generated defaults, splits.

Everything is loaded into memory as tensors (`Dataset`); nothing is ever downloaded.
"""

from __future__ import annotations

from powerfed.training.data.dataset import (
    CIFAR10_CLASSES,
    CIFAR10_MEAN,
    CIFAR10_STD,
    Dataset,
    concat,
    normalise_uint8,
    take_fraction,
    train_test_split,
)
from powerfed.training.data.load import SPECS, load_dataset, save_npz
from powerfed.training.data.text import decode, encode

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "SPECS",
    "Dataset",
    "concat",
    "decode",
    "encode",
    "load_dataset",
    "normalise_uint8",
    "save_npz",
    "take_fraction",
    "train_test_split",
]
