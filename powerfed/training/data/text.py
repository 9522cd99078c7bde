"""Character-level text: the paper's vocabulary, windows of seq_len + 1 characters, a 90/10 split."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch

from powerctl.files.readfile import TEXT_LIMIT, read_bytes
from powerfed.training.data.dataset import Dataset
from powerfed.training.errors import DataError
from powerfed.training.tasks import VOCAB, VOCAB_SIZE

TEXT_TRAIN_FRACTION = 0.9

_LUT = np.full(128, -1, dtype=np.int64)
_LUT[[ord(c) for c in VOCAB]] = np.arange(VOCAB_SIZE)


def encode(text: str) -> tuple[np.ndarray, int]:
    """Character ids of `text` in VOCAB order, and how many characters were outside VOCAB (dropped, to
    keep the paper's 96-symbol vocabulary: tabs and non-ASCII letters are the usual casualties)."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    ids = _LUT[np.where(codes < 128, codes, 0)]
    ids[codes >= 128] = -1
    keep = ids >= 0
    return ids[keep], int(codes.size - keep.sum())


def decode(ids: np.ndarray | torch.Tensor) -> str:
    """Inverse of `encode`, for looking at samples."""
    return "".join(VOCAB[int(i)] for i in np.asarray(ids).reshape(-1))


def windows(ids: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping windows: x = ids[k·T : k·T + T], y = the same shifted by one character."""
    if seq_len < 1:
        raise DataError(f"seq_len must be ≥ 1, got {seq_len}")
    n = (len(ids) - 1) // seq_len
    if n < 1:
        raise DataError(f"text of {len(ids)} characters is too short for one window of {seq_len + 1}")
    x = torch.from_numpy(np.ascontiguousarray(ids[: n * seq_len].reshape(n, seq_len)))
    y = torch.from_numpy(np.ascontiguousarray(ids[1 : n * seq_len + 1].reshape(n, seq_len)))
    return x, y


def split_ids(ids: np.ndarray, split: str) -> np.ndarray:
    """'train' is the first 90% of the characters, 'test' the last 10% (never seen in part), 'all' all."""
    cut = int(len(ids) * TEXT_TRAIN_FRACTION)
    return {"train": ids[:cut], "test": ids[cut:], "all": ids}[split]  # its callers checked `split`


def text_dataset(
    name: str, ids: np.ndarray, *, split: str, seq_len: int, limit: int | None, **info: object
) -> Dataset:
    x, y = windows(split_ids(ids, split), seq_len)
    if limit is not None:
        x, y = x[:limit], y[:limit]
    return Dataset(name, "text", x, y, VOCAB_SIZE, classes=tuple(VOCAB), info={"split": split, **info})


def load_text(path: Path, *, split: str, seq_len: int, limit: int | None) -> Dataset:
    """A plain UTF-8 text file, character level; characters outside VOCAB are dropped and counted.
    Read bounded (`TEXT_LIMIT`): `text:/dev/zero` or a FIFO is refused, not read."""
    try:
        raw = read_bytes(path, limit=TEXT_LIMIT, what="a UTF-8 text file", error=DataError)
    except FileNotFoundError:
        raise DataError(f"text file not found: {path}; check the path (nothing is downloaded)") from None
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror or exc}; check the path") from None
    if b"\x00" in raw[:65536]:
        raise DataError(f"{path}: looks binary (NUL bytes), not a text file; pass a UTF-8 text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start}); re-encode it as UTF-8"
        ) from None
    ids, dropped = encode(text.replace("\r\n", "\n"))
    if len(ids) == 0:
        raise DataError(f"{path}: no characters of the vocabulary in the file; is it a text file?")
    if dropped > 0.01 * (len(ids) + dropped):
        warnings.warn(f"{path}: dropped {dropped} characters outside the vocabulary", stacklevel=3)
    return text_dataset(
        f"text:{path.name}",
        ids,
        split=split,
        seq_len=seq_len,
        limit=limit,
        source=str(path),
        dropped_chars=dropped,
    )
