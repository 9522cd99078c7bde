"""A private Flower home for each `flwr run` the launcher starts, flock-ed for the life of the launcher;
`launcher.json` records the run's processes, which carry FLWR_HOME. A home whose lock can be taken is a
dead launcher's: the watchdog or the next start stops its processes by pid and removes it."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from powerctl.errors import FileFormatError, PowerctlError
from powerctl.files.jsonfile import read_json, write_json
from powerctl.procs import environ, proc_table, search_path
from simulations.local_superlink import identity, stop_tree

PREFIX = "powerfed-flwr-home-"
MARKER = "launcher.json"
SCHEMA = "simulations.flower_home/1"
APP_DIR = Path(__file__).resolve().parents[1]


class FlowerHomeError(PowerctlError):
    """The private Flower home cannot be made or recorded (a full or read-only temp folder)."""


def _lock(path: Path, *, wait: bool = False) -> int | None:
    """An fd holding the exclusive flock of our folder `path`, still that folder once locked; None when a
    live process holds it, or `path` is gone, not a folder, or a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_uid == os.getuid():
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            here, held = os.stat(path, follow_symlinks=False), os.fstat(fd)
            if (here.st_dev, here.st_ino) == (held.st_dev, held.st_ino):
                return fd
    except OSError:  # held by a live process (BlockingIOError), or gone since
        pass
    os.close(fd)
    return None


def processes_of(home: Path, recorded: Iterable[tuple[int, int]] = ()) -> list[int]:
    """The live processes of `home`'s run, recorded (same start time) or marked FLWR_HOME=`home`; not
    this one."""
    table = proc_table()
    found = {p for p, ticks in recorded if identity(p, table) == (p, ticks)}
    for pid, st in table.items():
        if st.running and (env := environ(pid)) is not None and env.get("FLWR_HOME") == str(home):
            found.add(pid)
    found.discard(os.getpid())
    return sorted(found)


def _recorded(home: Path) -> tuple[int | None, list[tuple[int, int]]]:
    """The launcher's pid and the processes `launcher.json` records; nothing from a bad file."""
    try:
        data = read_json(home / MARKER, SCHEMA)
        launcher = data["launcher"][0]
        procs = [(int(p), int(t)) for p, t in data["processes"]]
    except (FileFormatError, KeyError, TypeError, ValueError, IndexError):
        return None, []
    return (launcher if isinstance(launcher, int) else None), procs


class FlowerHome:
    """A locked private Flower home: what runs with it is stopped and the folder removed by `close`."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self._fd = path, fd
        self._launcher = list(identity(os.getpid()) or ()) or None
        self._procs: dict[int, int] = {}
        self._watchdog: subprocess.Popen[bytes] | None = None

    @classmethod
    def create(cls, base: Path | None = None) -> FlowerHome:
        """A new home under `base` (default: the temp folder), locked by this process and recorded."""
        for _ in range(5):  # a clean-up elsewhere may take a brand-new folder's lock: make another
            try:
                path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
            except OSError as exc:
                raise FlowerHomeError(
                    f"cannot make a private Flower home in {base or tempfile.gettempdir()} "
                    f"({exc.strerror or exc}); set TMPDIR to a writable folder"
                ) from None
            if (fd := _lock(path)) is not None:
                home = cls(path, fd)
                home.record([])
                return home
        raise FlowerHomeError(f"cannot lock a private Flower home in {base or tempfile.gettempdir()}")

    def record(self, pids: Iterable[int]) -> None:
        """Add `pids` (with their start times) to `launcher.json`, atomically."""
        for pid in pids:
            if pid not in self._procs and (ident := identity(pid)) is not None:
                self._procs[pid] = ident[1]
        data: dict[str, Any] = {
            "schema": SCHEMA,
            "launcher": self._launcher,
            "processes": [[p, t] for p, t in sorted(self._procs.items())],
        }
        try:
            write_json(self.path / MARKER, data)
        except OSError as exc:
            raise FlowerHomeError(
                f"cannot record the run's processes in {self.path} ({exc.strerror or exc})"
            ) from None

    def start_watchdog(self, stderr: IO[Any] | int | None = None) -> None:
        """A process in a session of its own that takes the home's lock once this one is gone and
        cleans up what is left (after a SIGKILL: the whole run)."""
        path = search_path(APP_DIR, rest=os.environ.get("PYTHONPATH", ""))
        env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"} | {"PYTHONPATH": path}
        argv = [sys.executable, "-m", "simulations.flower_home", str(self.path)]
        quiet = subprocess.DEVNULL
        self._watchdog = subprocess.Popen(
            argv, cwd=APP_DIR, env=env, stdin=quiet, stdout=quiet, stderr=stderr, start_new_session=True
        )

    def close(self) -> list[int]:
        """Stop every process of the run, remove and unlock the home, wait for the watchdog; returns
        the pids stopped. Idempotent."""
        if self._fd < 0:
            return []
        try:
            stopped = stop_tree(*processes_of(self.path, self._procs.items()))
            shutil.rmtree(self.path, ignore_errors=True)
        finally:
            os.close(self._fd)
            self._fd = -1
        if self._watchdog is not None:
            try:
                self._watchdog.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                stopped += stop_tree(self._watchdog.pid)
                self._watchdog.wait()
        return stopped


def clean_home(path: Path, *, wait: bool = False) -> tuple[int | None, list[int]] | None:
    """When the launcher of home `path` is gone (its lock taken; `wait`: once it can be): stop its run's
    processes, remove the folder; (that launcher's pid, the pids stopped). None: not ours to clean."""
    if (fd := _lock(path, wait=wait)) is None:
        return None
    try:
        launcher, recorded = _recorded(path)
        stopped = stop_tree(*processes_of(path, recorded))
        shutil.rmtree(path, ignore_errors=True)
        return launcher, stopped
    finally:
        os.close(fd)


def clean_stale_homes(base: Path | None = None) -> list[tuple[Path, int | None, list[int]]]:
    """`clean_home` every home under `base` (default: the temp folder); (home, launcher, stopped) each."""
    cleaned = []
    for path in sorted(Path(base or tempfile.gettempdir()).glob(PREFIX + "*")):
        if (done := clean_home(path)) is not None:
            cleaned.append((path, *done))
    return cleaned


def describe_cleaned(home: Path, launcher: int | None, stopped: list[int]) -> str:
    """One line saying what a dead launcher left and what was done about it."""
    who = f"pid {launcher}" if launcher is not None else "a launcher"
    what = f"stopped pids {', '.join(map(str, stopped))}" if stopped else "no process was left"
    return f"{who} died without stopping its run: {what}; removed {home}"


def main(argv: list[str]) -> int:
    """The watchdog: `python -m simulations.flower_home HOME`."""
    if len(argv) != 1:
        print("usage: python -m simulations.flower_home HOME", file=sys.stderr)
        return 2
    home = Path(argv[0])
    done = clean_home(home, wait=True)
    if done is not None:
        print(f"powerfed watchdog: {describe_cleaned(home, *done)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
