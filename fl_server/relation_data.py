"""Proxy data for the relation estimator, whatever form the user holds it in (a dataset spec, a
`Dataset`, a torch Dataset or DataLoader, tensors (x, y)): one in-memory `Dataset` with a train/test
split, a label for the relation file and a digest of its bytes for the cache."""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from powerctl.errors import PowerctlError
from powerfed.training.data import Dataset, load_dataset, train_test_split
from powerfed.training.errors import DataError

ProxyData = Any  # a spec string, a `Dataset` (ours or torch's), a `DataLoader` or a pair (x, y)
TEST_FRACTION = 0.2  # the test share of a split that cannot be stratified


@dataclass(frozen=True)
class Proxy:
    """The proxy data as the estimator uses it."""

    train: Dataset
    test: Dataset
    label: str  # what the relation file names as its proxy dataset
    sha256: str | None  # the bytes behind it (a file's or the tensors'); None for generated data
    whole: Dataset


def tensor_digest(x: torch.Tensor, y: torch.Tensor) -> str:
    """sha256 of the tensors' dtypes, shapes and bytes: the cache's identity of in-memory data."""
    h = hashlib.sha256()
    for t in (x, y):
        t = t.detach().cpu().contiguous()
        h.update(f"{t.dtype}{tuple(t.shape)}\0".encode())
        h.update(t.numpy().tobytes() if t.dtype != torch.bfloat16 else t.float().numpy().tobytes())
    return h.hexdigest()


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes, or of a folder's files (relative names and bytes, sorted)."""
    p = Path(path)
    h = hashlib.sha256()
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    for f in files:
        if p.is_dir():
            h.update(f"{f.relative_to(p).as_posix()}\0".encode())
        with f.open("rb") as fh:
            for chunk in iter(partial(fh.read, 1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def spec_digest(spec: str) -> str | None:
    """Digest of the file/folder a dataset spec points at (`kind:PATH`); None for generated data."""
    _, sep, rest = spec.partition(":")
    if not sep or not rest:
        return None
    if not Path(rest).exists():
        raise DataError(f"dataset {spec!r}: {rest} does not exist")
    return file_digest(rest)


def _as_tensor(value: Any, what: str) -> torch.Tensor:
    try:
        return value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise DataError(f"proxy data: {what} is not a tensor or an array ({exc})") from None


def _pairs_of(data: Any, limit: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) stacked from a torch Dataset or a DataLoader's dataset."""
    from torch.utils.data import DataLoader, TensorDataset

    if isinstance(data, DataLoader):
        data = data.dataset
    if isinstance(data, TensorDataset) and len(data.tensors) == 2:
        return data.tensors[0][:limit], data.tensors[1][:limit]
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    try:
        items = iter(data) if not hasattr(data, "__getitem__") else (data[i] for i in range(len(data)))
        for item in itertools.islice(items, limit):
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise DataError(
                    f"proxy data: each sample must be a pair (input, target), got {type(item).__name__}"
                )
            xs.append(_as_tensor(item[0], "an input"))
            ys.append(_as_tensor(item[1], "a target"))
    except TypeError as exc:
        raise DataError(
            f"proxy data: {type(data).__name__} is neither a dataset spec, a torch Dataset, a DataLoader "
            f"nor a pair (x, y) ({exc})"
        ) from None
    if not xs:
        raise DataError(f"proxy data: {type(data).__name__} holds no samples")
    try:
        return torch.stack(xs), torch.stack(ys)
    except RuntimeError as exc:
        raise DataError(f"proxy data: samples of different shapes cannot be stacked ({exc})") from None


def in_memory(data: Any, task: str | None, limit: int | None) -> Dataset:
    """The user's proxy data as one `Dataset` of `task` ("image": one target per sample; "text": ids
    [N, T] with targets of the same shape; None: read off the tensors)."""
    if isinstance(data, Dataset):
        return data if limit is None else data.subset(np.arange(min(limit, len(data))))
    if isinstance(data, (tuple, list)) and len(data) == 2 and not isinstance(data[0], (tuple, list)):
        x, y = (_as_tensor(v, w) for v, w in zip(data, ("x", "y"), strict=True))
        x, y = (x, y) if limit is None else (x[:limit], y[:limit])
    else:
        x, y = _pairs_of(data, limit)
    if x.ndim < 2 or len(x) != len(y):
        raise DataError(
            f"proxy data: x must be [N, ...] with N targets in y, "
            f"got x {tuple(x.shape)} and y {tuple(y.shape)}"
        )
    integer = not (y.is_floating_point() or y.is_complex())
    if task is None:
        task = "text" if x.ndim == 2 and not x.is_floating_point() and y.shape == x.shape else "image"
    if x.is_floating_point() and not torch.isfinite(x).all():
        raise DataError("proxy data: x holds NaN or infinite values")
    if integer and y.numel() and int(y.min()) < 0:
        raise DataError(f"proxy data: targets must be class indices ≥ 0, got {int(y.min())}")
    classes = int(y.max()) + 1 if integer and y.numel() else 1
    shape = "x".join(str(d) for d in x.shape[1:])
    return Dataset(f"tensors:{len(x)}x{shape}", task, x.detach().cpu(), y.detach().cpu(), max(classes, 1))


def split(ds: Dataset, seed: int) -> tuple[Dataset, Dataset]:
    """train_test_split for class targets (stratified) or text; otherwise a seeded random split."""
    if ds.task == "text" or (ds.y.ndim == 1 and not ds.y.is_floating_point()):
        return train_test_split(ds, seed=seed)
    n = len(ds)
    if n < 2:
        raise DataError(f"proxy data has {n} sample(s); a train/test split needs at least 2")
    n_test = min(max(1, round(TEST_FRACTION * n)), n - 1)
    order = np.random.default_rng(seed).permutation(n)
    return ds.subset(np.sort(order[n_test:])), ds.subset(np.sort(order[:n_test]))


def load_proxy(data: ProxyData, *, task: str | None, seq_len: int, limit: int | None, seed: int) -> Proxy:
    """The proxy data split for training and testing, with its label and digest."""
    if isinstance(data, Path):
        raise PowerctlError(f"proxy data {str(data)!r}: give a dataset spec such as 'npz:{data}'")
    if isinstance(data, str):
        sha = spec_digest(data)
        ds = load_dataset(data, split="all", seq_len=seq_len, limit=limit, seed=seed)
        return Proxy(*train_test_split(ds, seed=seed), data, sha, ds)
    ds = in_memory(data, task, limit)
    return Proxy(*split(ds, seed), ds.name, tensor_digest(ds.x, ds.y), ds)
