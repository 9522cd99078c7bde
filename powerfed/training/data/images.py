"""Readers for the real image datasets, each turned into uint8 [N, 3, 32, 32] + labels: numpy over the
arrays, scipy for MATLAB files, Pillow for compressed images, nothing downloaded, every fault one
DataError line."""

from __future__ import annotations

import gzip
import io
import math
import pickle
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import numpy as np

from powerctl.files.readfile import DATA_LIMIT, IMAGE_LIMIT, open_regular, read_bytes, too_large
from powerfed.training.data.dataset import CIFAR10_CLASSES, Dataset, image_dataset
from powerfed.training.errors import DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
FASHION_MNIST_CLASSES = (
    "t-shirt/top",
    "trouser",
    "pullover",
    "dress",
    "coat",
    "sandal",
    "shirt",
    "sneaker",
    "bag",
    "ankle boot",
)


def _exists(path: Path, what: str) -> Path:
    if not path.exists():
        raise DataError(f"{what} not found: {path}; check the path (nothing is downloaded)")
    return path


def class_quotas(limit: int | None, num_classes: int) -> list[int] | None:
    """A class-balanced `limit`: limit // C per class, the remainder to the first classes."""
    if limit is None:
        return None
    base, rem = divmod(limit, num_classes)
    return [base + (1 if c < rem else 0) for c in range(num_classes)]


def _balanced_take(labels: np.ndarray, limit: int | None, num_classes: int) -> np.ndarray:
    """Indices of the first samples of each class up to the class-balanced quota, in file order."""
    quotas = class_quotas(limit, num_classes)
    if quotas is None:
        return np.arange(len(labels))
    rank = np.zeros(len(labels), dtype=np.int64)  # position of each sample within its class
    for c in range(num_classes):
        members = labels == c
        rank[members] = np.arange(int(members.sum()))
    return np.flatnonzero(rank < np.asarray(quotas)[labels])


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """CIFAR batches are pickles; load them without letting a bad file run code (numpy arrays only)."""

    ALLOWED: ClassVar[frozenset[str]] = frozenset(
        {"_reconstruct", "ndarray", "dtype", "scalar", "_frombuffer"}
    )

    def find_class(self, module: str, name: str) -> type:
        if module.split(".")[0] == "numpy" and name in self.ALLOWED:
            return super().find_class(module, name)
        if (module, name) == ("_codecs", "encode"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a dataset file")


def _load_pickle(path: Path) -> dict[Any, Any]:
    try:
        what = "a CIFAR python batch"
        with open_regular(_exists(path, "CIFAR batch"), limit=DATA_LIMIT, what=what, error=DataError) as f:
            obj = _NumpyOnlyUnpickler(f, encoding="bytes").load()
    except DataError:
        raise
    except Exception as exc:  # a corrupt pickle can fail in many ways; all mean "not a CIFAR batch"
        raise DataError(f"{path}: not a CIFAR python batch ({exc}); use the 'python version' files") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path}: not a CIFAR python batch (no dict inside); use the 'python version' files")
    return obj


def _cifar_batch(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    d = _load_pickle(path)
    if b"data" not in d or label_key not in d:
        raise DataError(f"{path}: CIFAR batch lacks b'data' or {label_key!r}; is it the right dataset?")
    data = np.asarray(d[b"data"])
    labels = np.asarray(d[label_key], dtype=np.int64).reshape(-1)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072 or len(data) != len(labels):
        raise DataError(f"{path}: CIFAR batch data must be uint8 [N, 3072] with N labels, got {data.shape}")
    return data.reshape(-1, 3, 32, 32), labels


def _find_dir(root: Path, marker: str, sub: str) -> Path:
    """Accept the batches folder itself or the folder that holds the extracted archive."""
    _exists(root, "dataset folder")
    if (root / marker).exists():
        return root
    if (root / sub / marker).exists():
        return root / sub
    raise DataError(f"{root}: no {marker!r} here or in {sub}/; point at the extracted python-version folder")


def load_cifar(root: Path, *, fine: bool, split: str, limit: int | None) -> Dataset:
    """CIFAR-10 (data_batch_1..5, test_batch) or CIFAR-100 (train, test; fine labels) pickles."""
    if fine:
        base = _find_dir(root, "train", "cifar-100-python")
        files = {"train": ["train"], "test": ["test"]}
        key, meta, meta_key, n = b"fine_labels", "meta", b"fine_label_names", 100
    else:
        base = _find_dir(root, "data_batch_1", "cifar-10-batches-py")
        files = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
        key, meta, meta_key, n = b"labels", "batches.meta", b"label_names", 10
    names = files["train"] + files["test"] if split == "all" else files[split]
    parts = [_cifar_batch(base / f, key) for f in names]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    take = _balanced_take(labels, limit, n)
    classes = _class_names(base / meta, meta_key) or (CIFAR10_CLASSES if n == 10 else None)
    name = "cifar100" if fine else "cifar10"
    return image_dataset(name, images[take], labels[take], n, classes, source=str(root), split=split)


def _class_names(path: Path, key: bytes) -> tuple[str, ...] | None:
    if not path.exists():
        return None
    names = _load_pickle(path).get(key)
    return tuple(b.decode() if isinstance(b, bytes) else str(b) for b in names) if names else None


def _decode(data: bytes, where: str) -> np.ndarray:
    """One image file → uint8 [3, 32, 32]."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            rgb = np.asarray(im.convert("RGB"))
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise DataError(f"{where}: cannot decode image ({exc}); the file is corrupt") from None
    if rgb.shape != (32, 32, 3):
        raise DataError(
            f"{where}: image is {rgb.shape[1]}x{rgb.shape[0]}, expected 32x32; resize the dataset"
        )
    return rgb.transpose(2, 0, 1)


def load_image_folders(
    path: Path,
    *,
    name: str,
    splits: tuple[str, ...],
    split: str,
    limit: int | None,
    classes: tuple[str, ...] = CIFAR10_CLASSES,
) -> Dataset:
    """Images in <split>/<class>/* under a folder (at any depth) or inside a tar(.gz) archive, ordered
    by class, then path. Reading stops once every class has its share of `limit` (in file order)."""
    _exists(path, "image dataset")
    wanted = splits if split == "all" else (split,)
    quotas = class_quotas(limit, len(classes))
    counts = [0] * len(classes)
    items: list[tuple[int, str, np.ndarray]] = []  # (label, <split>/<class>/<file>, image)
    for parts, read, where in _image_sources(path):  # <split>/<class>/<file>.<image suffix> only
        if len(parts) < 3 or not parts[-1].lower().endswith(IMAGE_SUFFIXES):
            continue
        if parts[-3] not in wanted or parts[-2] not in classes:
            continue
        label = classes.index(parts[-2])
        if quotas is not None and counts[label] >= quotas[label]:
            continue
        items.append((label, "/".join(parts[-3:]), _decode(read(), where)))
        counts[label] += 1
        if counts == quotas:  # every class has its share: stop reading
            break
    if not items:
        raise DataError(f"{path}: no images found in <split>/<class>/*.jpg|png layout; check the path")
    items.sort(key=lambda t: (t[0], t[1]))
    images, labels = np.stack([t[2] for t in items]), np.array([t[0] for t in items], dtype=np.int64)
    return image_dataset(name, images, labels, len(classes), classes, source=str(path), split=split)


def _image_sources(path: Path) -> Iterable[tuple[tuple[str, ...], Callable[[], bytes], str]]:
    """(path parts, reader of the bytes, description) for every file of a folder or tar."""
    if path.is_dir():
        for f in sorted(path.rglob("*")):
            if f.is_file():
                yield f.relative_to(path).parts, partial(_image_bytes, f), str(f)
        return
    for name, data in iter_tar_files(path):
        yield PurePosixPath(name).parts, partial(bytes, data), f"{path}:{name}"


def iter_tar_files(path: Path) -> Iterator[tuple[str, bytes]]:
    """(member name, bytes) of every regular file, in archive order; stop iterating to stop reading."""
    what = "an image archive (.tar, .tar.gz)"
    try:
        with open_regular(path, limit=DATA_LIMIT, what=what, error=DataError) as f:
            gzipped = f.read(2) == b"\x1f\x8b"
            f.seek(0)
            # GzipFile reads every gzip member (bgzip, `pigz --independent`); tarfile reads only the first
            with tarfile.open(fileobj=gzip.GzipFile(fileobj=f) if gzipped else f, mode="r|*") as tf:
                total = 0
                for member in tf:
                    if not member.isfile():
                        continue
                    total += member.size
                    if total > DATA_LIMIT:  # a small .tar.gz may unpack to anything
                        raise DataError(too_large(path, DATA_LIMIT, "an image archive, unpacked"))
                    fh = tf.extractfile(member)
                    yield member.name, fh.read() if fh is not None else b""
    except (zlib.error, gzip.BadGzipFile, EOFError) as exc:
        raise DataError(f"{path}: corrupt gzip data ({exc}); re-copy the file") from None
    except (tarfile.TarError, OSError, ValueError) as exc:
        raise DataError(
            f"{path}: cannot read the archive ({exc}); the file is corrupt or not a tar"
        ) from None


def _image_bytes(path: Path) -> bytes:
    """One image file of a folder, read bounded (`IMAGE_LIMIT`)."""
    try:
        return read_bytes(path, limit=IMAGE_LIMIT, what="an image file", error=DataError)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}; check the file") from None


def load_svhn(path: Path, *, split: str, limit: int | None) -> Dataset:
    """SVHN cropped digits (label 10 is digit 0): a folder with train_32x32.mat/test_32x32.mat, or one
    .mat file, the whole dataset (no test split)."""
    _exists(path, "SVHN file")
    if path.is_dir():
        names = ["train", "test"] if split == "all" else [split]
        parts = [_svhn_file(path / f"{s}_32x32.mat") for s in names]
    else:
        if split == "test":
            raise DataError(
                f"{path} is a single file with no test split; pass its folder, or load it with split='all'"
            )
        parts = [_svhn_file(path)]
    images = np.concatenate([p[0] for p in parts])
    labels = np.concatenate([p[1] for p in parts])
    take = _balanced_take(labels, limit, 10)
    classes = tuple(str(d) for d in range(10))
    return image_dataset("svhn", images[take], labels[take], 10, classes, source=str(path), split=split)


def _svhn_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    arrays = _read_mat(_exists(path, "SVHN file"), ["X", "y"])
    if "X" not in arrays or "y" not in arrays:
        raise DataError(f"{path}: no variables X and y; is it an SVHN *_32x32.mat file?")
    x, y = arrays["X"], arrays["y"].reshape(-1)
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.shape[3] != len(y):
        raise DataError(f"{path}: X must be [32, 32, 3, N] with N labels, got X {x.shape}, y {len(y)}")
    labels = y.astype(np.int64)
    if len(labels) and (labels.min() < 0 or labels.max() > 10):
        raise DataError(
            f"{path}: SVHN labels must be 1..10 (10 = digit 0), found {labels.min()}..{labels.max()}"
        )
    labels[labels == 10] = 0
    images = np.ascontiguousarray(x.astype(np.uint8, copy=False).transpose(3, 2, 0, 1))
    return images, labels


_MAT_BYTES = dict(single=4, int32=4, uint32=4, int16=2, uint16=2, int8=1, uint8=1, logical=1)
"""Bytes per element of a MATLAB class once loadmat unpacks it; 8 for the others (double, 64-bit)."""


def _read_mat(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    """The variables `names` of a MATLAB v5/v7 MAT-file (scipy), read and unpacked bounded (`DATA_LIMIT`)."""
    from scipy.io import loadmat, whosmat

    try:
        raw = read_bytes(path, limit=DATA_LIMIT, what="a MATLAB v5 MAT-file", error=DataError)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}; check the path") from None
    if raw.startswith(b"MATLAB 7.3"):
        raise DataError(
            f"{path}: MATLAB v7.3 (HDF5) files are not supported; re-save as v7 (save -v7) or convert to npz"
        )
    try:
        declared = whosmat(io.BytesIO(raw))
        unpacked = sum(
            math.prod(shape) * _MAT_BYTES.get(cls, 8) for name, shape, cls in declared if name in names
        )
        if unpacked <= DATA_LIMIT:  # the declared sizes, checked before loadmat unpacks them
            return loadmat(io.BytesIO(raw), variable_names=names)
    except Exception as exc:  # a corrupt file can fail in many ways; all mean "not a readable MAT-file"
        raise DataError(
            f"{path}: corrupt or not a MATLAB v5/v7 MAT-file ({exc}); re-save it with MATLAB/scipy as v7"
        ) from None
    raise DataError(too_large(path, DATA_LIMIT, "a MAT-file, unpacked"))


_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: Path) -> np.ndarray:
    """An idx file (gzipped or not): magic 0x0000TTDD (type TT, DD dimensions), big-endian sizes."""
    found = next((p for p in (path, path.with_name(path.name + ".gz")) if p.exists()), None)
    if found is None:
        raise DataError(f"idx file not found: {path}[.gz]; check the folder (nothing is downloaded)")
    path = found
    try:
        raw = read_bytes(path, limit=DATA_LIMIT, what="an idx file", error=DataError)
        if path.suffix == ".gz":
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as gz:
                raw = gz.read(DATA_LIMIT + 1)  # bounded: a small .gz may unpack to anything
            if len(raw) > DATA_LIMIT:
                raise DataError(too_large(path, DATA_LIMIT, "an idx file, unpacked"))
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read ({exc}); the file is corrupt") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES or not 1 <= raw[3] <= 4:
        raise DataError(f"{path}: not an idx file (bad magic {raw[:4].hex()}); check the file")
    ndim, dtype = raw[3], np.dtype(_IDX_DTYPES[raw[2]])
    if len(raw) < 4 + 4 * ndim:
        raise DataError(f"{path}: idx header truncated; the file is corrupt")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    count = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - 4 - 4 * ndim != count:
        raise DataError(f"{path}: idx data is {len(raw) - 4 - 4 * ndim} bytes, header says {count}; corrupt")
    return np.frombuffer(raw, dtype, offset=4 + 4 * ndim).reshape(dims)


def load_fashion_mnist(root: Path, *, split: str, limit: int | None, name: str = "fashion-mnist") -> Dataset:
    """Fashion-MNIST (or MNIST) idx files: 28×28 grey, padded with 2 black pixels to 32×32 and
    repeated to 3 channels, so the same 32×32 RGB models and normalisation apply unchanged."""
    _exists(root, "dataset folder")
    prefixes = {"train": "train", "test": "t10k"}
    names = ["train", "test"] if split == "all" else [split]
    images, labels = [], []
    for s in names:
        x = read_idx(root / f"{prefixes[s]}-images-idx3-ubyte")
        y = read_idx(root / f"{prefixes[s]}-labels-idx1-ubyte")
        if x.ndim != 3 or x.shape[1:] != (28, 28) or y.ndim != 1 or len(x) != len(y) or x.dtype != np.uint8:
            raise DataError(f"{root}: {s} idx files must hold uint8 [N, 28, 28] images and N labels")
        images.append(x)
        labels.append(y.astype(np.int64))
    x, y = np.concatenate(images), np.concatenate(labels)
    take = _balanced_take(y, limit, 10)
    x = np.pad(x[take], ((0, 0), (2, 2), (2, 2)))
    x = np.repeat(x[:, None], 3, axis=1)
    classes = FASHION_MNIST_CLASSES if name == "fashion-mnist" else tuple(str(d) for d in range(10))
    return image_dataset(name, x, y[take], 10, classes, source=str(root), split=split)
