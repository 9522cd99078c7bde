"""Stop the local SuperLink that `flwr run .` leaves running, by process id, never by name.

`flwr run .` starts a detached `flower-superlink --simulation` on fixed local ports and keeps it after
the run (FLOWER-1.41 notes). We find the process that LISTENS on the given port (Linux /proc: the
socket's inode → the process holding it), take it and all its descendants (superexec, the simulation
process, orphaned app processes), and end each process group: SIGTERM, then SIGKILL after a grace.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_LISTEN = "0A"


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


def pids_listening_on(port: int) -> list[int]:
    """Processes holding a listening TCP socket on `port` (only those this user may inspect)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
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


@dataclass(frozen=True)
class ProcStat:
    """What /proc/PID/stat says of a process that we need to follow a process tree."""

    ppid: int
    sid: int
    start_ticks: int
    """Start time in clock ticks since boot: with the pid, it names one process, not a reused pid."""
    state: str

    @property
    def running(self) -> bool:
        return self.state not in ("Z", "X")  # a zombie waiting to be reaped counts as gone


def proc_stat(pid: int) -> ProcStat | None:
    """The process's stat line, or None once it is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    f = stat.rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
    return ProcStat(ppid=int(f[1]), sid=int(f[3]), start_ticks=int(f[19]), state=f[0])


def proc_table() -> dict[int, ProcStat]:
    """Every process this user can see, by pid."""
    table = {}
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (st := proc_stat(int(entry.name))) is not None:
            table[int(entry.name)] = st
    return table


def descendants(pid: int) -> list[int]:
    """Every process below `pid` in the process tree (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for child, st in proc_table().items():
        children.setdefault(st.ppid, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as gone)."""
    st = proc_stat(pid)
    return st is not None and st.running


def stop_tree(pid: int, grace_s: float = 5.0) -> list[int]:
    """SIGTERM `pid`, its descendants and their process groups; SIGKILL what is left after `grace_s`."""
    tree = [pid, *descendants(pid)]
    groups = set()
    for p in tree:
        with contextlib.suppress(OSError):
            groups.add(os.getpgid(p))
    own = os.getpgrp()
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for g in groups - {own}:
            with contextlib.suppress(OSError):
                os.killpg(g, sig)
        for p in tree:
            with contextlib.suppress(OSError):
                os.kill(p, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(alive(p) for p in tree):
            time.sleep(0.1)
        if not any(alive(p) for p in tree):
            break
    return tree


def stop_local_superlink(port: int, grace_s: float = 5.0) -> list[int]:
    """Stop whatever listens on `port` (the local SuperLink's port) with all it started."""
    stopped: list[int] = []
    for pid in pids_listening_on(port):
        stopped += stop_tree(pid, grace_s)
    return stopped


def free_port() -> int:
    """A local TCP port nobody listens on now (the kernel picks it: never Flower's defaults)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


FLOWER_ENV = {
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0",
}
"""What every `flwr run` this project starts sets (see the Makefile): no telemetry, no installs at run
time, no update check, and Ray leaving CUDA_VISIBLE_DEVICES alone on a CPU-only node."""


def flower_env(port: int, control_port: int, **extra: str) -> dict[str, str]:
    """The environment for a `flwr run` with its own local SuperLink on `port` (HTTP API) and
    `control_port`, the running interpreter's bin folder first on PATH (flower-superlink must be found)."""
    bin_dir = Path(sys.executable).parent
    return {
        **os.environ,
        **FLOWER_ENV,
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control_port),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        **extra,
    }


def flwr_run_command(app: str | Path, federation: str, run_config: str) -> list[str]:
    """`flwr run APP --stream` with a federation config and a run config: the running interpreter's
    `flwr` (the venv's), so the SuperLink it starts runs the same Flower and the same project."""
    flwr = Path(sys.executable).parent / "flwr"
    return [
        str(flwr if flwr.exists() else "flwr"),
        "run",
        str(app),
        "--stream",
        "--federation-config",
        federation,
        "--run-config",
        run_config,
    ]
