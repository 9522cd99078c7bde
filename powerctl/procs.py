"""Processes from Linux's /proc (pid and start time: a reused pid is never mistaken), subreaping, signals,
and whether a TCP port takes connections."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


def search_path(*first: str | Path | None, rest: str | None = None) -> str:
    """The folders `first` (None skipped) before `rest` (default: this process's PATH), as a child's PATH or
    PYTHONPATH; an empty `rest` adds no empty entry, which would name the current folder."""
    rest = os.environ.get("PATH", "") if rest is None else rest
    return os.pathsep.join([*(str(f) for f in first if f is not None), *([rest] if rest else [])])


@dataclass(frozen=True)
class ProcStat:
    """What /proc/PID/stat says of a process that we need to follow a process tree."""

    ppid: int
    sid: int
    start_ticks: int  # clock ticks since boot: with the pid, it names one process, not a reused pid
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


def become_subreaper() -> bool:
    """Make this (main) process a subreaper: orphans below come to it, to be stopped; else False."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


@contextlib.contextmanager
def handling(handler: Any, *signals: signal.Signals) -> Iterator[None]:
    """`handler` for `signals` in the block, the old ones put back after; nothing off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, handler) for s in signals}
    try:
        yield
    finally:
        for s, previous in old.items():
            signal.signal(s, previous)


def connect_error(host: str, port: int, timeout_s: float) -> OSError | None:
    """Why a TCP connection to host:port failed within `timeout_s` (refused, timed out, unresolved...);
    None: it was accepted."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        return exc
    return None


def seconds_since_start(pid: int) -> float | None:
    """Wall seconds since the process started, or None where /proc does not say (gone, not Linux)."""
    st = proc_stat(pid)
    try:
        uptime = float((PROC / "uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None if st is None else max(0.0, uptime - st.start_ticks / os.sysconf("SC_CLK_TCK"))


def proc_table() -> dict[int, ProcStat]:
    """Every process this user can see, by pid."""
    stats = {int(e.name): proc_stat(int(e.name)) for e in PROC.iterdir() if e.name.isdigit()}
    return {pid: st for pid, st in stats.items() if st is not None}


def descendants(pid: int, table: dict[int, ProcStat] | None = None) -> list[int]:
    """Every process below `pid` in the process tree (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for child, st in (proc_table() if table is None else table).items():
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


def cmdline(pid: int) -> list[str]:
    """The process's arguments ([] once it is gone, or for a kernel thread)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0")[:-1]] if raw else []


def environ(pid: int) -> dict[str, str] | None:
    """The environment the process was started with; None where this user may not read it."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {k: v for k, eq, v in pairs if eq}


def describe(pid: int, width: int = 120) -> str:
    """``pid N (its command line)``, shortened to `width` characters, for a one-line message."""
    cmd = " ".join(cmdline(pid)) or "?"
    return f"pid {pid} ({cmd if len(cmd) <= width else cmd[: width - 3] + '...'})"


def option_value(args: list[str], name: str) -> str | None:
    """The value of option `name` in a command line (``--name VALUE`` or ``--name=VALUE``); None if absent."""
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None
