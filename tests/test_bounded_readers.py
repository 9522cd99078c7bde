"""Inputs that never end: every reader of a file a user names refuses a device, a FIFO with no writer, a
folder or a file over its limit in one line, reads nothing it cannot bound and never blocks
(`powerctl.files.readfile`, issue 28)."""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import resource
import signal
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from powerctl.errors import FileFormatError
from powerctl.files import readfile
from powerctl.files.readfile import (
    JSON_LIMIT,
    LIVE_CAP_LIMIT,
    TEXT_LIMIT,
    TRACE_LIMIT,
    YAML_LIMIT,
    read_bytes,
    size_text,
)
from powerctl.selection.capsource import CapSourceError, LiveFileCap, parse_cap_source
from powerfed.training.data import load_dataset
from powerfed.training.errors import DataError

ROOT = Path(__file__).resolve().parents[1]
MEMORY = 2 << 30
"""Address space for a command under test: reading /dev/zero would hit it (MemoryError, a traceback)."""

PROFILE = (
    '{"schema": "powerctl.profile/2", "device": "jetson-nano", "model": "cnn-tiny", '
    '"input_shape": [3, 32, 32], '
    '"samples": 1000, "points": [{"batch_size": 8, "frequency_hz": 76800000, "peak_power_w": 2.1, '
    '"mean_power_w": 2.0, "seconds_per_batch": 0.01, "seconds_for_samples": 1.25}]}'
)


@contextlib.contextmanager
def no_hang(seconds: int = 60) -> Iterator[None]:
    """A guard, not a timing: a reader that blocks on a FIFO fails the test instead of hanging it."""

    def stop(*_: object) -> None:
        raise AssertionError("the reader blocked")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _hostile(kind: str, folder: Path, limit: int) -> Path:
    """A path to refuse: /dev/zero, a FIFO nobody writes, a folder, a (sparse) file of limit + 1."""
    if kind == "dev-zero":
        return Path("/dev/zero")
    path = folder / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    else:
        with path.open("wb") as f:
            f.truncate(limit + 1)
    return path


def _expected(kind: str, path: Path, limit: int) -> str:
    return {
        "dev-zero": "/dev/zero: not a regular file (a character device); give ",
        "fifo": f"{path}: not a regular file (a FIFO); give ",
        "too-large": f"{path}: larger than the {size_text(limit)} limit for ",
    }.get(kind, str(path))


def _limited_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _listing(folder: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(folder)), p.lstat().st_size) for p in folder.rglob("*"))


def _select(profile: Path, relation: Path) -> list[str]:
    return ["powerctl", "select", "--profile", str(profile), "--relation", str(relation)]


COMMANDS: dict[str, tuple[Callable[[Path, Path], list[str]], int]] = {
    "select --profile": (lambda bad, good: _select(bad, bad), JSON_LIMIT),
    "select --relation": (lambda bad, good: _select(good, bad), JSON_LIMIT),
    "cap-source trace:": (lambda bad, good: ["powerctl", "cap-source", f"trace:{bad}"], TRACE_LIMIT),
    "cap-source live:": (lambda bad, good: ["powerctl", "cap-source", f"live:{bad}"], LIVE_CAP_LIMIT),
    "simulations run": (lambda bad, good: ["simulations", "run", str(bad)], YAML_LIMIT),
}


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder", "too-large"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_each_command_refuses_what_it_cannot_read_whole_in_one_line(
    tmp_path: Path, command: str, kind: str
) -> None:
    argv, limit = COMMANDS[command]
    work = tmp_path / "work"
    work.mkdir()
    good = work / "profile.json"
    good.write_text(PROFILE)
    bad = _hostile(kind, work, limit)
    before = _listing(work)
    proc = subprocess.run(
        [sys.executable, "-m", *argv(bad, good)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # a guard against a hang, not a timing
        preexec_fn=_limited_memory,
        check=False,
    )
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and proc.stdout == "", proc.stderr
    assert _expected(kind, bad, limit) in lines[0]
    if kind == "folder":
        assert "folder" in lines[0] or "Is a directory" in lines[0]
    assert _listing(work) == before  # nothing written, nothing replaced


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder", "too-large"])
def test_the_reader_refuses_before_reading(tmp_path: Path, kind: str) -> None:
    path = _hostile(kind, tmp_path, 100)
    with no_hang(), pytest.raises((FileFormatError, IsADirectoryError)) as err:
        read_bytes(path, limit=100, what="a test file", error=FileFormatError)
    if kind == "folder":
        assert isinstance(err.value, IsADirectoryError)  # each caller says a folder in its own words
    else:
        assert str(err.value) == _expected(kind, path, 100) + (
            "a test file" if kind != "too-large" else "a test file; give a smaller file"
        )


def test_a_file_of_the_limit_is_read_and_one_whose_size_says_nothing_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "exact"
    path.write_bytes(b"x" * 100)
    assert read_bytes(path, limit=100, what="a test file", error=FileFormatError) == b"x" * 100
    status = Path("/proc/self/status")  # like sysfs: a regular file whose st_size (0) is not its length
    assert status.stat().st_size == 0
    with pytest.raises(FileFormatError, match="larger than the 16 bytes limit"):
        read_bytes(status, limit=16, what="a test file", error=FileFormatError)
    assert b"Name:" in read_bytes(
        status, limit=readfile.SYSFS_LIMIT, what="a test file", error=FileFormatError
    )


def test_a_missing_file_is_the_callers_to_say(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_bytes(tmp_path / "nope", limit=100, what="a test file", error=FileFormatError)


def test_a_live_cap_file_swapped_for_a_fifo_or_a_huge_file_keeps_the_last_cap_without_blocking(
    tmp_path: Path,
) -> None:
    live = tmp_path / "cap.txt"
    live.write_text("3.5\n")
    cap = LiveFileCap(live, poll_s=1.0)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    os.replace(fifo, live)
    with no_hang():
        assert cap.cap_at(2.0) == 3.5
    assert "not a regular file (a FIFO)" in cap.warnings[-1] and "keeping 3.5 W" in cap.warnings[-1]
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.truncate(LIVE_CAP_LIMIT + 1)
    os.replace(big, live)
    assert cap.cap_at(4.0) == 3.5 and "larger than the 4 KiB limit" in cap.warnings[-1]
    live.write_text("2\n")
    assert cap.cap_at(6.0) == 2.0


def test_a_live_cap_file_that_is_a_fifo_at_the_start_is_one_error_line(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with (
        no_hang(),
        pytest.raises(CapSourceError, match=r"not a regular file \(a FIFO\); give a live cap file"),
    ):
        LiveFileCap(fifo)


@pytest.mark.parametrize("spec", ["text", "npz"])
@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "too-large"])
def test_a_dataset_path_that_never_ends_is_refused(tmp_path: Path, spec: str, kind: str) -> None:
    limit = TEXT_LIMIT if spec == "text" else readfile.DATA_LIMIT
    path = _hostile(kind, tmp_path, limit)
    with no_hang(), pytest.raises(DataError) as err:
        load_dataset(f"{spec}:{path}")
    assert _expected(kind, path, limit) in str(err.value) and "\n" not in str(err.value)


def test_an_npz_that_unpacks_past_the_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = np.zeros((50, 3, 32, 32), np.uint8)  # 150 KB unpacked, a few hundred bytes packed
    np.savez_compressed(tmp_path / "bomb.npz", x=x, y=np.arange(50) % 2)
    assert (tmp_path / "bomb.npz").stat().st_size < 10_000
    monkeypatch.setattr("powerfed.training.data.load.DATA_LIMIT", 10_000)
    with pytest.raises(
        DataError, match=r"larger than the 9.77 KiB limit for an .npz file \(numpy.savez\), unpacked"
    ):
        load_dataset(f"npz:{tmp_path / 'bomb.npz'}")


def test_an_idx_gz_and_a_tar_gz_that_unpack_past_the_limit_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from powerfed.training.data.images import iter_tar_files, read_idx

    raw = b"\x00\x00\x08\x01" + (100_000).to_bytes(4, "big") + bytes(100_000)
    (tmp_path / "labels-idx1-ubyte.gz").write_bytes(gzip.compress(raw))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("train/cat/0.png")
        info.size = 100_000
        tf.addfile(info, io.BytesIO(bytes(100_000)))
    (tmp_path / "a.tar.gz").write_bytes(buf.getvalue())
    monkeypatch.setattr("powerfed.training.data.images.DATA_LIMIT", 10_000)
    with pytest.raises(DataError, match="limit for an idx file, unpacked"):
        read_idx(tmp_path / "labels-idx1-ubyte")
    with pytest.raises(DataError, match=r"limit for an (archive member|image archive, unpacked)"):
        list(iter_tar_files(tmp_path / "a.tar.gz"))


def test_a_name_with_a_nul_from_a_config_file_is_one_line() -> None:
    with pytest.raises(
        CapSourceError, match=r"not a file name \(it holds a NUL character\); give a cap trace"
    ):
        parse_cap_source("trace:/tmp/a\0b", "node config 'power-cap-w'")
