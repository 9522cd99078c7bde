"""Output paths, checked before the work that fills them: a long profile or training run must never end
in a traceback because its result cannot be written.

The rule, for every command: an output FILE goes into a folder that already exists (a typo in the folder
must not silently create one somewhere, even at the filesystem root); an output FOLDER (plots, a demo's
results) may be created, with any missing parents, below the nearest existing folder. Either way the
place is probed by actually creating (and removing) a file in it, which also catches read-only mounts
and pseudo file systems such as /proc, where permission bits alone say "writable".
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from powerctl.errors import PowerctlError


class OutputPathError(PowerctlError):
    """An output path that cannot be written; the text names the flag and the path."""


def _probe(folder: Path, what: str, path: Path) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".powerctl-probe-")
    except OSError as exc:
        raise OutputPathError(f"{what} {path}: cannot write in {folder} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(tmp)


def check_output_file(path: str | Path, what: str = "--out", in_folder: str | None = None) -> Path:
    """`path` can be written as a file: its folder exists and takes files, and it is not a folder.

    `in_folder`: an existing folder is taken too, as the file of that name inside it (what the command
    then prints is the file it writes)."""
    path = Path(path)
    if in_folder is not None and path.is_dir():
        path = path / in_folder
    if path.is_dir():
        raise OutputPathError(f"{what} {path}: is a folder; give a file name")
    parent = path.parent
    if not parent.is_dir():
        raise OutputPathError(
            f"{what} {path}: folder {parent} does not exist"
            + (" (it is a file)" if parent.exists() else "; create it first")
        )
    _probe(parent, what, path)
    return path


def check_output_dir(path: str | Path, what: str = "--out") -> Path:
    """`path` is, or can be created as, a writable folder (missing parents are created too)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{what} {path}: is a file, not a folder; give a folder")
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise OutputPathError(f"{what} {path}: {existing} is a file, not a folder")
    _probe(existing, what, path)
    return path
