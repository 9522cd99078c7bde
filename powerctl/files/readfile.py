"""The one reader of files a user names: it bounds what it reads and refuses what it cannot bound.

Why: a path on a command line, in a fleet file or in a node config can name ``/dev/zero`` (read for
ever, until memory runs out), a FIFO with no writer (a plain ``open`` blocks for ever), a folder, or
a file of gigabytes. Here a file must be a regular file, checked before it is opened (opening some
devices does something) and again on the open descriptor (it may have been swapped meanwhile); it
is opened with ``O_NONBLOCK``, so that not even a FIFO swapped in can block; and at most `limit`
bytes are read: a larger file is one line naming the limit, never a partial read. sysfs and procfs
files are regular files whose size says nothing (4096 or 0), so the limit holds on the bytes read,
not only on ``st_size``.

A file that does not exist, a folder, or one the process may not read raises the `OSError` that
``open`` raises (FileNotFoundError, IsADirectoryError, PermissionError): each caller already says
those in its own words. What only this module refuses is one line in the caller's error class.
"""

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

JSON_LIMIT = 64 * MiB
"""Profiles, relations, board records, results: the largest of them (a fleet run's results with
every round of a thousand clients) is a few MB."""
YAML_LIMIT = 4 * MiB
"""Fleet files and the board models: hand-written, a few KB."""
TRACE_LIMIT = 64 * MiB
"""A cap trace (CSV ``seconds,watts``): a year at one row a second is about 500 MB; a year at one
row a minute, or a day at one row a millisecond, fits."""
LIVE_CAP_LIMIT = 4 * KiB
"""A live cap file holds one number (or `none`): re-read while training runs, so it is read small."""
SYSFS_LIMIT = 64 * KiB
"""A sysfs or procfs file of a board: a frequency table, a number, a model string, meminfo."""
TEXT_LIMIT = 256 * MiB
"""A character-level text corpus, held in memory as 8-byte ids (2 GiB at this limit); the paper's
texts are a few MB and WikiText-103 is about 540 MB of which one client's share is far less."""
DATA_LIMIT = 4 * GiB
"""A dataset file (npz, a MATLAB file, idx, a CIFAR batch, an image archive), counted uncompressed:
all of CIFAR-10 as float32 is 0.74 GB, SVHN's train file 0.18 GB."""
IMAGE_LIMIT = 64 * MiB
"""One image file of an image folder: the datasets' are 32x32 pixels, a few KB."""

ErrorType = Callable[[str], Exception]

_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


def not_regular(path: str | Path) -> str | None:
    """What `path` is when it is not a regular file to read, in words ("no such file", "a folder",
    "a FIFO", "a character device", ...); None for a regular file (a link is followed)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file"
    except OSError as exc:
        return exc.strerror or "unreadable"
    if stat.S_ISDIR(mode):
        return "a folder"
    return None if stat.S_ISREG(mode) else _kind(mode)


def size_text(n: int) -> str:
    """A byte count as people say it: 4 KiB, 64 MiB, 4 GiB (the limits are powers of two)."""
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
        raise error(f"{path}: not a regular file ({_kind(mode)}); give {what}")


def _kind(mode: int) -> str:
    """What a file that is neither regular nor a folder is, in words."""
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def open_regular(path: str | Path, *, limit: int, what: str, error: ErrorType) -> BinaryIO:
    """`path` opened for reading in binary, if it is a regular file of at most `limit` bytes.

    `what` names what the file should be ("a cap trace (CSV)"); `error` is the caller's one-line
    error class. For readers that stream (an archive, a pickle): they read no more than the file
    holds, which is at most `limit` when opened."""
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
    """The bytes of the regular file `path`, at most `limit` of them; anything else is refused
    (see the module's docstring)."""
    with open_regular(path, limit=limit, what=what, error=error) as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # a file that grew since, or one whose size fstat does not tell (sysfs)
        raise error(too_large(path, limit, what))
    return data
