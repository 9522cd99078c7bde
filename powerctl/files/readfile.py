"""The one reader of files a user names (which may be /dev/zero, a FIFO or gigabytes): a regular file,
checked before and after opening, at most `limit` bytes read. What ``open`` raises is left to the caller."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

JSON_LIMIT = 64 * MiB  # profiles, relations, board records, results: a fleet run's are a few MB
YAML_LIMIT = 4 * MiB  # fleet files and board models: hand-written, a few KB
TRACE_LIMIT = 64 * MiB  # a cap trace (CSV ``seconds,watts``): a year at one row a minute fits
LIVE_CAP_LIMIT = 4 * KiB  # a live cap file holds one number (or `none`), re-read while training runs
SYSFS_LIMIT = 64 * KiB  # a board's sysfs or procfs file: a frequency table, a number, meminfo
TEXT_LIMIT = 256 * MiB  # a character-level text corpus, held as 8-byte ids (2 GiB at this limit)
DATA_LIMIT = 4 * GiB  # a dataset file (npz, MATLAB, idx, a CIFAR batch, an archive), uncompressed
IMAGE_LIMIT = 64 * MiB  # one image of an image folder (the datasets' are 32x32 pixels)

ErrorType = Callable[[str], Exception]

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISREG, "a file"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def not_regular(path: str | Path) -> str | None:
    """What `path` is when it is not a regular file to read, in words; None for a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return exc.strerror or "unreadable"
    return None if stat.S_ISREG(mode) else file_kind(mode)


def size_text(n: int) -> str:
    """A byte count as people say it: 4 KiB, 64 MiB, 4 GiB."""
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n} bytes"


def too_large(path: str | Path, limit: int, what: str) -> str:
    """The one line for a file (or what it unpacks to) over `limit`."""
    return f"{path}: larger than the {size_text(limit)} limit for {what}; give a smaller file"


def _check_regular(mode: int, path: str | Path, what: str, error: ErrorType) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(mode):
        raise error(f"{path}: not a regular file ({file_kind(mode)}); give {what}")


def file_kind(mode: int) -> str:
    """What the file of a stat mode is, in words ("a folder", "a FIFO"), for a refusal."""
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def open_regular(path: str | Path, *, limit: int, what: str, error: ErrorType) -> BinaryIO:
    """`path` opened in binary if a regular file of at most `limit` bytes, else one `error` line."""
    try:
        mode = os.stat(path).st_mode
    except ValueError:  # a NUL in a name from a config file: no file can have it
        raise error(f"{str(path)!r}: not a file name (it holds a NUL character); give {what}") from None
    _check_regular(mode, path, what, error)  # before opening: no device is opened
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        _check_regular(st.st_mode, path, what, error)
        if st.st_size > limit:
            raise error(too_large(path, limit, what))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: str | Path, *, limit: int, what: str, error: ErrorType) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them; anything else is refused."""
    with open_regular(path, limit=limit, what=what, error=error) as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # grown since, or a size fstat does not tell (sysfs)
        raise error(too_large(path, limit, what))
    return data
