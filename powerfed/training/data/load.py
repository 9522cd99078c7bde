"""`load_dataset(spec)`: one string names any dataset the project can train on."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import torch

from powerctl.files.mapping import Invalid
from powerctl.files.readfile import DATA_LIMIT, open_regular, too_large
from powerfed.training.data import images, text
from powerfed.training.data.dataset import CIFAR10_CLASSES, Dataset, normalise_uint8
from powerfed.training.errors import DataError
from powerfed.training.tasks import VOCAB_SIZE

SPLITS = ("train", "test", "all")
GENERATED = ("synthetic-image", "synthetic-text")
"""The specs of generated data (no file)."""
SPECS = {
    "synthetic-image": "generated images, 10 classes (no file)",
    "synthetic-text": "generated order-2 Markov text (no file)",
    "cifar10:DIR": "CIFAR-10 python batches",
    "cifar100:DIR": "CIFAR-100 python files (fine labels)",
    "cifar10-jpeg:PATH": "CIFAR-10 as {train,test}/<class>/*.jpg, a folder or a .tar(.gz)",
    "cinic10:DIR": "CINIC-10 {train,valid,test}/<class>/*.png",
    "svhn:PATH": "SVHN *_32x32.mat (MATLAB v5): a file or a folder with train/test",
    "fashion-mnist:DIR": "Fashion-MNIST idx files (.gz or not); 'mnist:DIR' for MNIST",
    "text:PATH": "a UTF-8 text file, character level",
    "npz:PATH": "numpy arrays x, y (or x_train/y_train/x_test/y_test)",
}


def load_dataset(
    spec: str, *, split: str = "train", seq_len: int = 64, limit: int | None = None, seed: int = 0
) -> Dataset:
    """Load the dataset named by `spec` (see SPECS); `split` is train, test or all (cinic10: valid too).
    `limit` caps the samples (class-balanced for images, the first windows for text); `seed` only
    matters for generated data. Nothing is downloaded: a bad file is one DataError line."""
    path = dataset_path(spec)
    kind = spec.partition(":")[0]
    if split not in SPLITS and not (kind == "cinic10" and split == "valid"):  # the loaders' one check
        raise DataError(f"unknown split {split!r}; use one of: {', '.join(SPLITS)}")
    if limit is not None and limit < 1:
        raise DataError(f"limit must be ≥ 1, got {limit}")
    if path is None:
        return _synthetic(kind, split=split, seq_len=seq_len, limit=limit, seed=seed)
    windows = {"seq_len": seq_len} if kind == "text" else {}
    return _FILE_LOADERS[kind](path, split=split, limit=limit, **windows)


def dataset_path(spec: str) -> Path | None:
    """The file or folder `spec` names (None: generated data), read as `load_dataset` reads it, nothing
    opened: a kind it does not know, or KIND: without a path, is one DataError line."""
    kind, sep, arg = spec.partition(":")
    if kind in GENERATED and not sep:
        return None
    if kind not in _FILE_LOADERS:
        raise DataError(f"unknown dataset spec {spec!r}; use one of: {', '.join(SPECS)}")
    if not arg.strip():
        raise DataError(f"dataset spec {spec!r} needs a path: {kind}:PATH")
    return Path(arg).expanduser()


def existing_dataset_path(spec: str, base: Path | None = None) -> Path | None:
    """`dataset_path`, relative paths from `base` (default: the current folder), which must exist:
    a run's pre-flight, where the loader would only fail once the run is under way."""
    path = dataset_path(spec)
    if path is None:
        return None
    path = path if base is None or path.is_absolute() else base / path
    if not path.exists():
        raise DataError(f"dataset spec {spec!r}: no such file or folder {path}")
    if not (path.is_file() or path.is_dir()):  # a device or a FIFO: never read as data
        raise DataError(f"dataset spec {spec!r}: {path} is neither a file nor a folder")
    return path


def _synthetic(kind: str, *, split: str, seq_len: int, limit: int | None, seed: int) -> Dataset:
    from powerfed.training.synthetic import synthetic_image, synthetic_text

    if kind == "synthetic-image":
        sizes = _synthetic_sizes(split, limit)
        parts = [synthetic_image(n, seed=seed, split=s) for s, n in sizes.items() if n > 0]
        if len(parts) == 1:
            return parts[0]
        x, y = torch.cat([p.x for p in parts]), torch.cat([p.y for p in parts])
        return replace(parts[0], x=x, y=y, info={**parts[0].info, "split": "all"})
    ds = synthetic_text(seq_len=seq_len, seed=seed, split=split)
    return ds if limit is None else ds.subset(np.arange(min(limit, len(ds))))


def _synthetic_sizes(split: str, limit: int | None) -> dict[str, int]:
    """4000 train and 1000 test images; a limit caps the total ("all" keeps the 80/20 proportion)."""
    if split == "all":
        return (
            {"train": 4000, "test": 1000}
            if limit is None
            else {"train": limit - limit // 5, "test": limit // 5}
        )
    return {split: limit or (4000 if split == "train" else 1000)}


def _npz(path: Path, *, split: str, limit: int | None) -> Dataset:
    """Arrays x, y — or x_train, y_train, x_test, y_test for a file with its own split. Integer x
    [N, T] is text (y: next characters); else images [N, C, H, W], [N, H, W, C] (C 1, 3 or 4) or
    [N, H, W], uint8 normalised like every image loader, float taken as normalised (`save_npz`)."""
    arrays = _read_npz(path)
    if {"x_train", "y_train", "x_test", "y_test"} <= arrays.keys():
        names = ["train", "test"] if split == "all" else [split]
        pairs = [(arrays[f"x_{s}"], arrays[f"y_{s}"]) for s in names]
    elif {"x", "y"} <= arrays.keys():
        if split == "test":
            raise DataError(f"{path} has only x, y (no x_test/y_test); load it with split='all' and split it")
        pairs = [(arrays["x"], arrays["y"])]
    else:
        raise DataError(f"{path}: needs arrays x and y (has {', '.join(sorted(arrays)) or 'none'})")
    x = np.concatenate([p[0] for p in pairs])
    y = np.concatenate([p[1] for p in pairs])
    if x.ndim == 2 and np.issubdtype(x.dtype, np.integer):
        ds = _npz_text(path, x, y)
    else:
        every = [a for k, a in arrays.items() if k in ("y", "y_train", "y_test")]
        ds = _npz_image(path, x, y, _image_classes(path, every, _stored_classes(path, arrays)))
    ds.info.update(source=str(path), split=split)
    return ds if limit is None else ds.subset(np.arange(min(limit, len(ds))))


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of the file: a regular file, its arrays unpacked at most `DATA_LIMIT` bytes in all
    (the sizes the zip declares, which bound what it unpacks to)."""
    what = "an .npz file (numpy.savez)"
    try:
        with open_regular(path, limit=DATA_LIMIT, what=what, error=DataError) as f:
            if not zipfile.is_zipfile(f):  # else numpy reads it as a pickle and says so
                raise DataError(f"{path}: not a readable .npz: not a zip archive (numpy.savez writes one)")
            f.seek(0)
            with np.load(f, allow_pickle=False) as z:
                if sum(info.file_size for info in z.zip.infolist()) > DATA_LIMIT:
                    raise DataError(too_large(path, DATA_LIMIT, f"{what}, unpacked"))
                return {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise DataError(f"npz file not found: {path}; check the path") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a folder; give {what}") from None
    except MemoryError:
        raise DataError(f"{path}: its arrays do not fit in memory; give a smaller file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{path}: not a readable .npz ({exc}); save it with numpy.savez") from None


def _stored_classes(path: Path, arrays: dict[str, np.ndarray]) -> int | None:
    """The file's `num_classes` (what `save_npz` writes), held to the bound of `--num-classes`."""
    from powerctl.cli.profile_command import NUM_CLASSES  # the one class-count bound

    if "num_classes" not in arrays:
        return None
    stored = arrays["num_classes"]
    if stored.size != 1 or not np.issubdtype(stored.dtype, np.integer):
        raise DataError(
            f"{path}: num_classes must be one integer, got {stored.dtype} of shape {stored.shape}"
        )
    try:
        return int(NUM_CLASSES.kind(int(stored.reshape(()))))
    except Invalid as exc:
        raise DataError(f"{path}: num_classes {exc}") from None


def _image_classes(path: Path, every: list[np.ndarray], stored: int | None) -> int:
    """How many classes the labels of the whole file (every split) stand for; refused in one line when
    the labels are not class indices 0..K-1 or are all one class (any model would score 1.0)."""
    if not all(y.ndim == 1 and np.issubdtype(y.dtype, np.integer) for y in every):
        return stored or 1  # the shape check of _npz_image says what is wrong
    labels = np.concatenate(every)
    if labels.size == 0:
        return stored or 1
    low, top = int(labels.min()), int(labels.max())
    if low < 0:
        raise DataError(f"{path}: labels must be class indices 0..K-1, got {low}")
    if low == top:
        raise DataError(
            f"{path}: every one of the {labels.size} labels is {top}: accuracy would be meaningless; "
            "give samples of two classes at least"
        )
    if stored is None and top + 1 > labels.size:
        raise DataError(
            f"{path}: labels reach {top} with only {labels.size} samples: number the classes 0..K-1, "
            "or store num_classes in the file"
        )
    n = stored if stored is not None else top + 1
    if top >= n:
        raise DataError(f"{path}: labels must lie in 0..{n - 1} (num_classes {n}), got {top}")
    return n


def _npz_text(path: Path, x: np.ndarray, y: np.ndarray) -> Dataset:
    if y.shape != x.shape:
        raise DataError(f"{path}: text x {x.shape} and y {y.shape} must have the same shape [N, T]")
    if x.size and (min(x.min(), y.min()) < 0 or max(x.max(), y.max()) >= VOCAB_SIZE):
        raise DataError(f"{path}: character ids must lie in 0..{VOCAB_SIZE - 1}")
    return Dataset(
        f"npz:{path.name}",
        "text",
        torch.from_numpy(x.astype(np.int64)),
        torch.from_numpy(y.astype(np.int64)),
        VOCAB_SIZE,
    )


_CHANNELS_LAST = (1, 3, 4)
"""Channel counts recognised at the end of [N, H, W, C] (grey, RGB, RGBA)."""


def _npz_image(path: Path, x: np.ndarray, y: np.ndarray, num_classes: int) -> Dataset:
    if x.ndim == 3:  # grey [N, H, W]
        x = x[:, None]
    if x.ndim == 4 and x.shape[1] not in _CHANNELS_LAST and x.shape[-1] in _CHANNELS_LAST:
        x = x.transpose(0, 3, 1, 2)
    if (
        x.ndim != 4
        or min(x.shape[1:], default=0) < 1
        or y.ndim != 1
        or not np.issubdtype(y.dtype, np.integer)
    ):
        raise DataError(
            f"{path}: images need x [N, C, H, W], [N, H, W, C] or [N, H, W] and integer y [N]; "
            f"got {x.shape}, {y.shape}"
        )
    if x.dtype == np.uint8:
        xt = normalise_uint8(np.ascontiguousarray(x))
    elif np.issubdtype(x.dtype, np.floating):
        if not np.isfinite(x).all():
            raise DataError(f"{path}: image x holds NaN or infinite values")
        xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    else:
        raise DataError(f"{path}: image x must be uint8 or float, got {x.dtype}")
    n = num_classes  # checked against every split's labels by _image_classes
    classes = CIFAR10_CLASSES if n == 10 else None
    return Dataset(f"npz:{path.name}", "image", xt, torch.from_numpy(y.astype(np.int64)), n, classes=classes)


def save_npz(ds: Dataset, path: str | Path) -> None:
    """Write a dataset as npz (x, y, num_classes) that `load_dataset('npz:PATH')` reads back as is."""
    np.savez(path, x=ds.x.numpy(), y=ds.y.numpy(), num_classes=np.int64(ds.num_classes))


_FILE_LOADERS: dict[str, Callable[..., Dataset]] = {
    "cifar10": partial(images.load_cifar, fine=False),
    "cifar100": partial(images.load_cifar, fine=True),
    "cifar10-jpeg": partial(images.load_image_folders, name="cifar10-jpeg", splits=("train", "test")),
    "cinic10": partial(images.load_image_folders, name="cinic10", splits=("train", "valid", "test")),
    "svhn": images.load_svhn,
    "fashion-mnist": images.load_fashion_mnist,
    "mnist": partial(images.load_fashion_mnist, name="mnist"),
    "text": text.load_text,
    "npz": _npz,
}
