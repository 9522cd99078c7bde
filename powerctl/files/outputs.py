"""Output paths, checked (by a probe file) before the work that fills them, and the one atomic writer;
what is not a regular file is never replaced, a link to one is written through."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from powerctl.errors import PowerctlError
from powerctl.files.readfile import file_kind

NAME_MAX = 255  # bytes in one path component when the file system does not say (Linux's)
PATH_MAX = 4096  # bytes in a whole path when the system does not say (Linux)
TEMP_EXTRA = len("..XXXXXXXX.tmp")  # what a temporary name (`.NAME.RANDOM.tmp`) adds to NAME


class OutputPathError(PowerctlError):
    """An output path that cannot be written; the text names the flag and the path."""


def output_path(text: str) -> Path:
    """argparse type of an output flag: an empty path would quietly mean the current folder."""
    if not text.strip() or "\0" in text:
        raise argparse.ArgumentTypeError(f"expected a path to write, got {text!r}")
    return Path(text)


def _where(what: str, path: Path | str) -> str:
    return f"{what} {path}" if what else str(path)


def _limit(path: Path, name: str, default: int) -> int:
    """`os.pathconf` of the nearest ancestor that answers."""
    for folder in [path, *path.parents]:
        with contextlib.suppress(OSError, ValueError):
            return int(os.pathconf(folder, name))
    return default


def _short(text: str, keep: int = 32) -> str:
    return text if len(text) <= 2 * keep + 1 else f"{text[:keep]}…{text[-keep:]}"


def check_name_lengths(path: str | Path, what: str = "--out", *, room: int = 0, hint: str = "") -> Path:
    """`path` fits NAME_MAX and PATH_MAX (less `room`, for the names a folder output gets inside it)."""
    if isinstance(path, str) and not path.strip():
        raise OutputPathError(f"{_where(what, repr(path))}: is empty; give a path")
    if "\0" in str(path):
        raise OutputPathError(f"{_where(what, repr(str(path)))}: holds a NUL byte; give a path")
    p = Path(path)
    name_max = _limit(p.parent, "PC_NAME_MAX", NAME_MAX)
    hint = hint or "give a shorter path"
    for part in p.parts:
        size = len(os.fsencode(part))
        if part != "/" and size > name_max:
            name = "its name" if part == p.name else f"the folder name {_short(part)!r} in it"
            raise OutputPathError(
                f"{_where(what, _short(str(p)))}: {name} is {size} bytes, over the {name_max} this file "
                f"system allows; {hint}"
            )
    path_max = _limit(p.parent, "PC_PATH_MAX", PATH_MAX)
    size = len(os.fsencode(os.path.abspath(p))) + room
    if size >= path_max:
        raise OutputPathError(
            f"{_where(what, _short(str(p)))}: the path is {size - room} bytes"
            + (f" (+{room} for the names inside it)" if room else "")
            + f", over the {path_max} this system allows; {hint}"
        )
    return p


def _stat(path: Path, what: str) -> os.stat_result | None:
    """`path`'s stat, links followed; None when nothing is there (or a component is a file)."""
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        if os.path.islink(path):
            raise OutputPathError(
                f"{_where(what, path)}: is a symbolic link to {os.readlink(path)}, which does not exist; "
                "remove the link or give another path"
            ) from None
        return None
    except OSError as exc:
        raise OutputPathError(f"{_where(what, path)}: cannot be checked ({exc.strerror or exc})") from None


def writable_file(path: str | Path, what: str = "") -> Path:
    """The file a write to `path` replaces (`path`, or the regular file its link names), else one line."""
    p = check_name_lengths(path, what)
    st = _stat(p, what)
    if st is None:
        return p
    if stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"{_where(what, p)}: is a folder; give a file name")
    if not stat.S_ISREG(st.st_mode):
        raise OutputPathError(
            f"{_where(what, p)}: is {file_kind(st.st_mode)}, not a regular file, and is never replaced; "
            "give the path of a file"
        )
    return Path(os.path.realpath(p)) if p.is_symlink() else p


def _probe(folder: Path, what: str, path: Path) -> None:
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".powerctl-probe-")
    except OSError as exc:
        raise OutputPathError(f"{what} {path}: cannot write in {folder} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(tmp)


def check_output_file(
    path: str | Path, what: str = "--out", in_folder: str | None = None, beside: Iterable[str | Path] = ()
) -> Path:
    """`path` can be written as a file. `in_folder`: an existing folder is taken as the file of that name
    in it. `beside`: the files the command writes next to it, held to the same rules."""
    path = check_name_lengths(path, what)
    if in_folder is not None and (st := _stat(path, what)) is not None and stat.S_ISDIR(st.st_mode):
        path = check_name_lengths(path / in_folder, what)
    target = writable_file(path, what)
    parent = target.parent
    st = _stat(parent, what)
    if st is None or not stat.S_ISDIR(st.st_mode):
        raise OutputPathError(
            f"{what} {path}: folder {parent} does not exist"
            + (f" (it is {file_kind(st.st_mode)})" if st is not None else "; create it first")
        )
    _probe(parent, what, path)
    for other in beside:
        writable_file(other, f"{what} also writes")
    return path


def check_output_dir(path: str | Path, what: str = "--out") -> Path:
    """`path` is, or can be created as, a writable folder (missing parents are created too)."""
    path = check_name_lengths(path, what, room=NAME_MAX + 1)
    existing = path
    while (st := _stat(existing, what)) is None:
        if existing.parent == existing:  # the current folder was removed
            raise OutputPathError(f"{what} {path}: no folder above it exists")
        existing = existing.parent
    if not stat.S_ISDIR(st.st_mode):
        kind = file_kind(st.st_mode)
        if existing == path:
            raise OutputPathError(f"{what} {path}: is {kind}, not a folder; give a folder")
        raise OutputPathError(f"{what} {path}: {existing} is {kind}, not a folder")
    _probe(existing, what, path)
    return path


def _temp_prefix(name: str, name_max: int) -> str:
    """`.NAME.`, NAME cut so that `.NAME.RANDOM.tmp` fits the file system."""
    keep = name
    while keep and len(os.fsencode(keep)) > name_max - TEMP_EXTRA:
        keep = keep[:-1]
    return f".{keep}."


@contextlib.contextmanager
def replacing(
    path: str | Path, what: str = "", *, shared: bool = True, durable: bool = False
) -> Iterator[Path]:
    """Write `path` atomically: yields a temporary file beside it to fill, renamed over it on success and
    removed on failure. `shared`: the umask's mode (else 0600); `durable`: the folder is fsynced too."""
    target = writable_file(path, what)
    target.parent.mkdir(parents=True, exist_ok=True)
    name_max = _limit(target.parent, "PC_NAME_MAX", NAME_MAX)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=_temp_prefix(target.name, name_max), suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        if shared:  # the mode a plain `open(..., "w")` gives under the umask
            mask = os.umask(0)
            os.umask(mask)
            os.chmod(tmp, 0o666 & ~mask)
        writable_file(target, what)  # again: it may have changed while the temporary file was filled
        os.replace(tmp, target)
        if durable:
            fd = os.open(target.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def plot_format(path: str | Path, what: str = "") -> str:
    """The format a plot file's suffix names (pgf only with TeX installed), else one line listing them."""
    from matplotlib import rcParams
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    suffix = Path(path).suffix.lower().removeprefix(".")
    formats = list(FigureCanvasAgg.get_supported_filetypes())
    if shutil.which(str(rcParams["pgf.texsystem"])) is None:
        formats.remove("pgf")
    if suffix not in formats:
        got = f"its suffix .{suffix} is not a format matplotlib writes" if suffix else "it has no suffix"
        raise OutputPathError(
            f"{_where(what, path)}: {got}; end it in one of {', '.join('.' + f for f in formats)}"
        )
    return suffix
