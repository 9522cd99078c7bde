"""Stop the local SuperLink that `flwr run .` leaves running, by process id, and nothing else
(`superlink_home`): anything else on its port is refused in one line; `stop_tree` never stops our own
session or ancestors."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path

from powerctl.errors import PowerctlError
from powerctl.procs import (
    PROC,
    ProcStat,
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


def stop_tree(*pids: int, grace_s: float = 5.0) -> list[int]:
    """Stop `pids`, their descendants and the members of the sessions they lead: SIGTERM, then SIGKILL
    after `grace_s`, each pid only while it names the process first seen there. Returns the pids."""
    protected = _protected()
    seen: dict[int, int] = {}  # pid -> start ticks
    for sig in (signal.SIGTERM, signal.SIGKILL):
        table = proc_table()
        roots = (
            {p for p, t in seen.items() if p in table and table[p].start_ticks == t} if seen else set(pids)
        )
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
    return stop_tree(*ours)


def free_port() -> int:
    """A local TCP port free now, with the control port two above it (the kernel picks it)."""
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
