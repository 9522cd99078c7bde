"""Datasets: real loaders (CIFAR, CINIC, SVHN, Fashion-MNIST, text, npz), generated defaults, splits;
all in memory as tensors (`Dataset`), nothing ever downloaded."""

from __future__ import annotations

from powerfed.training.data.dataset import CIFAR10_CLASSES as CIFAR10_CLASSES
from powerfed.training.data.dataset import CIFAR10_MEAN as CIFAR10_MEAN
from powerfed.training.data.dataset import CIFAR10_STD as CIFAR10_STD
from powerfed.training.data.dataset import Dataset as Dataset
from powerfed.training.data.dataset import train_test_split as train_test_split
from powerfed.training.data.load import SPECS as SPECS
from powerfed.training.data.load import load_dataset as load_dataset
from powerfed.training.data.load import save_npz as save_npz
from powerfed.training.data.text import decode as decode
