"""The processes of a local `flwr run`, stopped by process id, never our own session or ancestors: the
SuperLink `flwr run .` leaves (anything else on its port is refused in one line), and each launcher's
private Flower home, locked for its life; a dead launcher's is cleaned by its watchdog or the next start."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from powerctl.errors import FileFormatError, PowerctlError
from powerctl.files.jsonfile import read_json, write_json
from powerctl.procs import (
    PROC,
    ProcStat,
    alive,
    cmdline,
    descendants,
    describe,
    environ,
    option_value,
    proc_stat,
    proc_table,
    search_path,
)

_LISTEN = "0A"
_PYTHON = re.compile(r"python[0-9.]*$")
SUPERLINK_SCRIPT = "flower-superlink"
LOG_FILE = Path("local-superlink") / "superlink.log"
"""Where `flwr run`'s local SuperLink logs, under its Flower home (flwr/cli/local_superlink.py)."""


class NotOurProcessError(PowerctlError):
    """What holds a port is not ours to stop: nothing was signalled."""


def _listening_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("net/tcp", "net/tcp6"):
        try:
            lines = (PROC / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state == _LISTEN and int(local.rsplit(":", 1)[1], 16) == port:
                inodes.add(inode)
    return inodes


def _holders(port: int) -> list[int] | None:
    """`pids_listening_on`, but None when no socket listens on `port` at all (not even one we cannot see)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    found = []
    for proc in PROC.iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    found.append(int(proc.name))
                    break
        except OSError:
            continue
    return sorted(found)


def pids_listening_on(port: int) -> list[int]:
    """Processes holding a listening TCP socket on `port` (only those this user may inspect)."""
    return _holders(port) or []


def port_holder(port: int) -> str | None:
    """Who listens on `port`, in words (None: nobody)."""
    if (holders := _holders(port)) is None:
        return None
    return describe(holders[0]) if holders else "a process this user cannot see (another user's)"


def superlink_home(pid: int) -> Path | None:
    """The Flower home of `pid` when it is a local SuperLink that `flwr run` started (a Python running
    `flower-superlink --simulation`, logging to LOG_FILE in its environment's Flower home), else None."""
    args = cmdline(pid)
    if len(args) < 2 or not _PYTHON.match(Path(args[0]).name) or Path(args[1]).name != SUPERLINK_SCRIPT:
        return None
    log_file = option_value(args, "--log-file")
    env = environ(pid)
    if "--simulation" not in args or log_file is None or env is None:
        return None
    if env.get("FLWR_HOME"):
        home = Path(env["FLWR_HOME"])
    elif env.get("HOME"):
        home = Path(env["HOME"]) / ".flwr"
    else:
        return None
    return home if os.path.normpath(log_file) == os.path.normpath(home / LOG_FILE) else None


def identity(pid: int, table: dict[int, ProcStat] | None = None) -> tuple[int, int] | None:
    """(pid, its start time) while `pid` runs: what names one process even after its pid is reused."""
    st = proc_stat(pid) if table is None else table.get(pid)
    return (pid, st.start_ticks) if st is not None and st.running else None


def _protected() -> set[int]:
    """This process and its ancestors: never stopped by `stop_tree`, whoever asks."""
    out, pid = set(), os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        st = proc_stat(pid)
        pid = st.ppid if st is not None else 0
    return out


def _members(roots: set[int], table: dict[int, ProcStat], protected: set[int]) -> set[int]:
    """`roots`, their descendants, and every member of a session one of them leads."""
    members = set(roots)
    for root in roots:
        members.update(descendants(root, table))
    leaders = {p for p in members if (st := table.get(p)) is not None and st.sid == p}
    leaders -= {table[p].sid for p in protected if p in table}  # never our own session
    members.update(p for p, st in table.items() if st.sid in leaders)
    return members - protected


def stop_tree(pid: int, grace_s: float = 5.0) -> list[int]:
    """Stop `pid`, its descendants and the members of the sessions they lead: SIGTERM, then SIGKILL
    after `grace_s`, each pid only while it names the process first seen there. Returns the pids."""
    protected = _protected()
    seen: dict[int, int] = {}  # pid -> start ticks
    for sig in (signal.SIGTERM, signal.SIGKILL):
        table = proc_table()
        roots = {p for p, t in seen.items() if p in table and table[p].start_ticks == t} if seen else {pid}
        for p in _members(roots, table, protected):
            if (ident := identity(p, table)) is not None:
                seen.setdefault(*ident)
        for p, ticks in seen.items():
            if identity(p) == (p, ticks):
                with contextlib.suppress(OSError):
                    os.kill(p, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _any_alive(seen):
            time.sleep(0.1)
        if not _any_alive(seen):
            break
    return sorted(seen)


def stop_trees(pids: Iterable[int]) -> list[int]:
    """`stop_tree` each of `pids` still alive (not stopped with an earlier one's tree); every pid stopped."""
    stopped: list[int] = []
    for pid in pids:
        if pid not in stopped and alive(pid):
            stopped += stop_tree(pid)
    return sorted(set(stopped))


def _any_alive(procs: dict[int, int]) -> bool:
    return any(identity(p) == (p, ticks) for p, ticks in procs.items())


def stop_local_superlink(port: int) -> list[int]:
    """Stop the local SuperLink of `flwr run` on `port` with all it started; [] when nothing listens;
    anything else there is one NotOurProcessError line."""
    if (holders := _holders(port)) is None:
        return []
    if not holders:
        raise NotOurProcessError(
            f"port {port} is held by a process this user cannot see (another user's): nothing stopped"
        )
    homes = {pid: superlink_home(pid) for pid in holders}
    ours = {pid for pid, h in homes.items() if h is not None}
    below = {d for pid in ours for d in descendants(pid)}  # a child may hold the socket it inherited
    for pid in holders:
        if pid not in ours and pid not in below:
            what = "a SuperLink of another Flower home" if homes[pid] is not None else "not a local SuperLink"
            raise NotOurProcessError(
                f"port {port} is held by {describe(pid)}, {what} that `flwr run` started: nothing stopped; "
                "stop it yourself if it is yours, or give the SuperLink's own --port"
            )
    return stop_trees(sorted(ours))


def free_port() -> int:
    """A local TCP port free now, with the control port two above it (the kernel picks it)."""
    import socket

    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 2 <= 65535:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port + 2))
                except OSError:
                    continue
            return port
    return port


FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}
"""What every `flwr run` this project starts sets (as the Makefile does)."""


def flower_env(port: int, control_port: int, **extra: str) -> dict[str, str]:
    """The environment of a `flwr run` with its own local SuperLink on `port` and `control_port`, this
    interpreter's bin folder first on PATH."""
    return {
        **os.environ,
        **FLOWER_ENV,
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        "PATH": search_path(Path(sys.executable).parent),
        **extra,
    }


def flwr_run_command(app: str | Path, federation: str, run_config: str) -> list[str]:
    """`flwr run APP --stream` with this interpreter's `flwr`, so its SuperLink runs the same Flower."""
    flwr = Path(sys.executable).parent / "flwr"
    command = [str(flwr if flwr.exists() else "flwr"), "run", str(app), "--stream"]
    return [*command, "--federation-config", federation, "--run-config", run_config]


HOME_PREFIX = "powerfed-flwr-home-"
HOME_MARKER = "launcher.json"
HOME_SCHEMA = "simulations.flower_home/1"
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
        data = read_json(home / HOME_MARKER, HOME_SCHEMA)
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
                path = Path(tempfile.mkdtemp(prefix=HOME_PREFIX, dir=base))
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
            "schema": HOME_SCHEMA,
            "launcher": self._launcher,
            "processes": [[p, t] for p, t in sorted(self._procs.items())],
        }
        try:
            write_json(self.path / HOME_MARKER, data)
        except OSError as exc:
            raise FlowerHomeError(
                f"cannot record the run's processes in {self.path} ({exc.strerror or exc})"
            ) from None

    def processes(self) -> list[int]:
        """Every live process of this home's run (see `processes_of`)."""
        return processes_of(self.path, self._procs.items())

    def start_watchdog(self, stderr: IO[Any] | int | None = None) -> None:
        """A process in a session of its own that takes the home's lock once this one is gone and
        cleans up what is left (after a SIGKILL: the whole run)."""
        path = search_path(APP_DIR, rest=os.environ.get("PYTHONPATH", ""))
        env = {k: v for k, v in os.environ.items() if k != "FLWR_HOME"} | {"PYTHONPATH": path}
        argv = [sys.executable, "-m", "simulations.local_superlink", str(self.path)]
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
            stopped = stop_trees(processes_of(self.path, self._procs.items()))
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
        stopped = stop_trees(processes_of(path, recorded))
        shutil.rmtree(path, ignore_errors=True)
        return launcher, stopped
    finally:
        os.close(fd)


def clean_stale_homes(base: Path | None = None) -> list[tuple[Path, int | None, list[int]]]:
    """`clean_home` every home under `base` (default: the temp folder); (home, launcher, stopped) each."""
    cleaned = []
    for path in sorted(Path(base or tempfile.gettempdir()).glob(HOME_PREFIX + "*")):
        if (done := clean_home(path)) is not None:
            cleaned.append((path, *done))
    return cleaned


def describe_cleaned(home: Path, launcher: int | None, stopped: list[int]) -> str:
    """One line saying what a dead launcher left and what was done about it."""
    who = f"pid {launcher}" if launcher is not None else "a launcher"
    what = f"stopped pids {', '.join(map(str, stopped))}" if stopped else "no process was left"
    return f"{who} died without stopping its run: {what}; removed {home}"


def main(argv: list[str]) -> int:
    """The watchdog: `python -m simulations.local_superlink HOME`."""
    if len(argv) != 1:
        print("usage: python -m simulations.local_superlink HOME", file=sys.stderr)
        return 2
    home = Path(argv[0])
    done = clean_home(home, wait=True)
    if done is not None:
        print(f"powerfed watchdog: {describe_cleaned(home, *done)}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
