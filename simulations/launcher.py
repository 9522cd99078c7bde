"""One `flwr run` of this app whose whole life this process owns: `make run` and the fleet runner.

`flwr run .` starts a detached local SuperLink (a session of its own) that runs the simulation and Ray
and outlives `flwr run` itself (FLOWER-1.41 notes): Ctrl-C on `flwr run`, or on a Makefile line that
runs it, stops none of them, and the orphaned run goes on to write its results. Here:

- everything is checked before anything starts: the number of virtual nodes, and the run config, parsed
  by Flower's own parser, its keys against the app's `[tool.flwr.app.config]` (an unknown key names the
  nearest known one) and its values by the ServerApp's own `parse_server_config`;
- `flwr run` gets a private Flower home and its own ports, runs in its own process group, and its output
  is copied to the terminal and to a log as it comes;
- on every way out (the end, an error, Ctrl-C, SIGTERM) the SuperLink and everything below it are
  stopped by process id and process group (`local_superlink.stop_tree`, never by name), and so is any
  process orphaned below this one: the CLI makes itself a child subreaper, so a process whose parent
  died before it was seen is still found.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from powerctl.errors import PowerctlError
from simulations.local_superlink import (
    alive,
    descendants,
    flower_env,
    flwr_run_command,
    free_port,
    pids_listening_on,
    stop_local_superlink,
    stop_tree,
)
from simulations.ray_cluster import preflight
from strategies.fleet import MAX_BOARDS

APP_DIR = Path(__file__).resolve().parents[1]
INFRA_LINE = re.compile(r"^\(\w+ pid=\d+\)|^(INFO|WARNING|DEBUG|ERROR)\s*:|^\s*$")
"""Lines the ServerApp did not print: Flower's log records and what Ray forwards from actors."""
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SERVER_ERROR = "powerfed server: error:"
"""How the ServerApp says it stopped on an error (`fl_server.app.main`)."""

MAX_NODES = MAX_BOARDS
"""Most virtual nodes one simulation may have (as many as a fleet has boards)."""

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h


class LaunchError(PowerctlError):
    """A run that cannot start as asked (bad nodes, bad run config) or that failed; one line."""


# --- the run config, as Flower reads it -------------------------------------------------------------
def app_config(app_dir: Path = APP_DIR) -> dict[str, Any]:
    """The app's `[tool.flwr.app.config]`, flattened as Flower flattens it: the keys a run may set."""
    from flwr.common.config import flatten_dict, get_project_config

    return flatten_dict(get_project_config(app_dir)["tool"]["flwr"]["app"].get("config", {}))


def parse_run_config(text: str) -> dict[str, Any]:
    """`--run-config TEXT` as `flwr run` parses it (Flower's own parser: ``key=value`` pairs, strings
    quoted as TOML strings, ``model="cnn-tiny"`` or ``model='cnn-tiny'``); one line when it cannot."""
    import click
    from flwr.common.config import parse_config_args

    try:
        parsed = dict(parse_config_args([text]))
    except (click.ClickException, ValueError, OSError) as exc:
        for pair in text.split():  # name the pair Flower cannot read, when one alone is the problem
            key, eq, value = pair.partition("=")
            try:
                parse_config_args([pair])
            except (click.ClickException, ValueError, OSError):
                if eq and key and value and value[0] not in "'\"":
                    raise LaunchError(
                        f"run config {pair!r}: {value!r} is not a number or true/false, and a string "
                        f'is quoted: {key}="{value}"'
                    ) from None
                raise LaunchError(
                    f"run config {pair!r} is not key=value as Flower reads it; e.g. "
                    "RUN_CONFIG='num-server-rounds=3 model=\"cnn-tiny\"'"
                ) from None
        detail = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        raise LaunchError(f"run config {text!r}: {detail.splitlines()[0]}") from None
    with contextlib.suppress(ValueError):  # Flower skips what is not key=value: a typo must not pass
        for word in shlex.split(text):
            if word.partition("=")[0] not in parsed:
                raise LaunchError(
                    f"run config {word!r} is not key=value (Flower would ignore it); "
                    "e.g. RUN_CONFIG='num-server-rounds=3 model=\"cnn-tiny\"'"
                )
    return parsed


def checked_run_config(overrides: dict[str, Any], app_dir: Path = APP_DIR) -> dict[str, Any]:
    """The run config the ServerApp will see (the app's defaults, then `overrides`), checked whole by the
    ServerApp's own parser before anything starts (an unknown key is named with the nearest known one,
    a fleet file is read); returns it merged as Flower merges it."""
    from flwr.common.config import fuse_dicts

    from fl_client.node import load_fleet_file
    from fl_server.run_config import parse_server_config

    known = app_config(app_dir)
    parse_server_config({**known, **overrides}, load_fleet_file=load_fleet_file)
    try:
        return fuse_dicts(known, overrides)
    except ValueError as exc:  # a declared key pyproject.toml lacks: Flower would refuse the run
        raise LaunchError(f"run config: {exc} (keys of [tool.flwr.app.config] in pyproject.toml)") from None


def toml_value(value: Any, key: str) -> str:
    """One run config value as Flower's `--run-config` parser reads it back unchanged."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if not isinstance(value, str):
        raise LaunchError(f"run config {key!r}: a value must be a string, number or boolean, got {value!r}")
    if "'" not in value:
        return f"'{value}'"  # a TOML literal string: backslashes and double quotes as they are
    if '"' not in value and "\\" not in value:
        return f'"{value}"'
    raise LaunchError(f"run config {key!r}: a string cannot hold both quote kinds, got {value!r}")


def run_config_text(config: dict[str, Any]) -> str:
    """`--run-config` text: key=value pairs, strings quoted as TOML strings."""
    return " ".join(f"{k}={toml_value(v, k)}" for k, v in config.items())


def check_nodes(nodes: int) -> int:
    """The number of virtual nodes: 0 would wait for nodes for ever, a huge one exhaust the machine."""
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        raise LaunchError(f"NODES: the number of virtual nodes must be from 1 to {MAX_NODES}, got {nodes!r}")
    return nodes


# --- owning the processes -------------------------------------------------------------------------
def adopt_orphans() -> bool:
    """Make this process a child subreaper (Linux): a process below it whose parent dies is re-parented
    to it, not to init, so `descendants(os.getpid())` still finds it. For a command's main process
    only (it then reaps what it adopted, `reap_adopted`). False where the kernel does not offer it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def stop_everything_below(pid: int | None = None) -> list[int]:
    """Stop every process below `pid` (default: this one), by pid and process group; returns them."""
    pid = os.getpid() if pid is None else pid
    stopped: list[int] = []
    for child in descendants(pid):
        if alive(child):  # not already stopped with an earlier one's tree
            stopped += stop_tree(child)
    return stopped


def reap_adopted() -> None:
    """Collect the exit status of adopted processes that ended (they would stay zombies)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    """SIGTERM (how a job is stopped, and what `make` passes on) ends the run like Ctrl-C, so the
    clean-up runs; off the main thread, where handlers cannot be set, nothing changes."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """A second Ctrl-C or SIGTERM during the clean-up must not cut it short (it is bounded: SIGKILL
    after a grace); both are ignored until it is done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@dataclass
class FlowerRun:
    """How a `flwr run` ended: its results line, the ServerApp's error line, every pid it started."""

    results_line: str | None = None
    error_line: str | None = None
    pids: list[int] = field(default_factory=list)

    @property
    def results_path(self) -> Path | None:
        return Path(self.results_line.removeprefix("results: ").strip()) if self.results_line else None


def _tree(port: int) -> list[int]:
    """The SuperLink on `port` and everything below it (SuperExec, the simulation, Ray)."""
    pids: list[int] = []
    for pid in pids_listening_on(port):
        pids += [pid, *descendants(pid)]
    return pids


def run_flwr(
    federation: str,
    run_config: str,
    log_path: Path,
    *,
    echo: Callable[[str], None] = print,
    verbose: bool = False,
    port: int | None = None,
    control_port: int | None = None,
) -> FlowerRun:
    """`flwr run APP_DIR --stream` with a private Flower home on `port` (default: free ports).

    Lines go to `log_path` and, unless `verbose` is off and they are Flower's or Ray's own, to `echo`.
    Every process it started is stopped before this returns or raises (KeyboardInterrupt included)."""
    preflight()  # a Ray cluster recorded but dead makes `flwr run` hang: check it first
    home = Path(tempfile.mkdtemp(prefix="powerfed-flwr-home-"))
    port = port or free_port()
    control = control_port or free_port()
    env = flower_env(
        port,
        control,
        FLWR_HOME=str(home),
        PYTHONPATH=os.pathsep.join(p for p in (str(APP_DIR), os.environ.get("PYTHONPATH", "")) if p),
    )
    cmd = flwr_run_command(APP_DIR, federation, run_config)
    run = FlowerRun()
    proc = None
    try:
        with signals_as_interrupt(), log_path.open("w", encoding="utf-8") as log:
            log.write(" ".join(cmd) + "\n")
            proc = subprocess.Popen(
                cmd,
                cwd=APP_DIR,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            run.pids.append(proc.pid)
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = ANSI.sub("", raw.rstrip("\n"))
                log.write(line + "\n")
                log.flush()
                if not run.pids[1:]:
                    run.pids += _tree(port)
                if line.startswith("results: "):
                    run.results_line = line
                elif SERVER_ERROR in line:
                    run.error_line = line.split(SERVER_ERROR, 1)[1].strip()
                if verbose or not INFRA_LINE.match(line):
                    echo(line)
            proc.wait()
    except KeyboardInterrupt:
        echo("interrupted: stopping the SuperLink, the simulation and Ray")
        raise
    finally:
        with uninterrupted():
            run.pids += _tree(port)
            stop_local_superlink(port)
            if proc is not None:
                run.pids += [p for p in descendants(proc.pid) if p not in run.pids]
                if alive(proc.pid):
                    stop_tree(proc.pid)
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    proc.wait(timeout=5)
            shutil.rmtree(home, ignore_errors=True)
    run.pids = sorted(set(run.pids))
    return run


# --- `make run` -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Launch:
    """A checked `make run`: everything `launch` needs, nothing started yet."""

    nodes: int
    overrides: dict[str, Any]
    """The run config given, with the results folder added (every key the app's, every value checked)."""
    log_path: Path
    port: int | None


def check_launch(nodes: int, run_config: str, out: Path, log_path: Path, port: int | None = None) -> Launch:
    """Every input of `make run`, checked before anything starts: one LaunchError (or other
    PowerctlError) line naming what is wrong."""
    from powerctl.outputs import check_output_dir, check_output_file

    check_nodes(nodes)
    overrides = parse_run_config(run_config)
    if "results-dir" not in overrides:  # a results-dir in the run config wins (the ServerApp checks it)
        out = check_output_dir(out.expanduser().resolve(), "results folder")
        overrides = {"results-dir": str(out), **overrides}
    checked_run_config(overrides)
    log_path = log_path.expanduser().resolve()
    check_output_dir(log_path.parent, "log folder")
    if log_path.parent.is_dir():  # else it is created at the start, as the results folder is
        check_output_file(log_path, "log")
    return Launch(nodes, overrides, log_path, port)


def launch(plan: Launch, *, echo: Callable[[str], None] = print) -> Path:
    """Run the app's default federation on `plan.nodes` virtual nodes; stop everything it started.

    Returns the results file; LaunchError (one line) when the run failed."""
    plan.log_path.parent.mkdir(parents=True, exist_ok=True)
    port = plan.port
    if port is not None and (stale := stop_local_superlink(port)):
        echo(f"stopped what listened on port {port} before this run (pids {', '.join(map(str, stale))})")
    run = run_flwr(
        f"num-supernodes={plan.nodes}",
        run_config_text(plan.overrides),
        plan.log_path,
        echo=echo,
        verbose=True,
        port=port,
        control_port=port + 2 if port is not None and port + 2 < 65536 else None,
    )
    if run.error_line:
        raise LaunchError(f"the ServerApp stopped: {run.error_line} (log: {plan.log_path})")
    if run.results_path is None:
        raise LaunchError(f"the run ended without its results line; see {plan.log_path}")
    return run.results_path
