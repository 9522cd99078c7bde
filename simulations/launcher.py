"""One `flwr run` of this app whose whole life this process owns: `make run` and the fleet runner.

`flwr run .` starts a detached local SuperLink (a session of its own) that runs the simulation and Ray
and outlives `flwr run` itself (FLOWER-1.41 notes): Ctrl-C on `flwr run`, or on a Makefile line that
runs it, stops none of them, and the orphaned run goes on to write its results. Here:

- everything is checked before anything starts: the number of virtual nodes, and the run config, parsed
  by Flower's own parser, its keys against the app's `[tool.flwr.app.config]` (an unknown key names the
  nearest known one) and its values by the ServerApp's own `parse_server_config`, and what it names: the
  results folder (probed by writing), the task's files, simulated boards, dataset files that exist;
- `flwr run` gets a private Flower home (`simulations.flower_home`: locked while this process lives,
  every process of the run marked by it) and its own ports, runs in its own session, and its output is
  copied to the terminal and to a log as it comes; a home left by a launcher that was killed is cleaned
  up first (its processes stopped, the folder removed), and a port held by anything but a local
  SuperLink of `flwr run` is refused in one line, nothing signalled;
- the app runs the fleet runner's ServerApp and ClientApp (`simulations.fleet_server`,
  `simulations.fleet_client`: the built-in ones with the fleet's own steps and record, `with_fleet_apps`),
  so a simulated run can ask for scale mode or the oracle;
- on every way out (the end, an error, Ctrl-C, SIGTERM) the processes of the run are stopped by process
  id (`local_superlink.stop_tree`, never by name or port alone), and so is any process orphaned below
  this one: the CLI makes itself a child subreaper, so a process whose parent died before it was seen
  is still found. A SIGKILL skips all that: a watchdog in a session of its own then does it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_server.fab import staged_app
from fl_server.run_config import (  # the run config as Flower reads it (`run_config_text`: the runner's)
    RunConfigError,
    ServerConfig,
    check_before_start,
    parse_run_config,
    run_config_text,
)
from powerctl.errors import PowerctlError
from powerctl.files.cache import cache_root
from powerctl.procs import alive, descendants
from simulations.flower_home import FlowerHome, clean_stale_homes, describe_cleaned
from simulations.linkstate_index import INDEX_ENV, check_flower_version, install_script
from simulations.local_superlink import (
    NotOurProcessError,
    flower_env,
    flwr_run_command,
    free_port,
    pids_listening_on,
    port_holder,
    stop_tree,
    superlink_home,
)
from simulations.ray_cluster import preflight
from strategies.fleet import MAX_BOARDS
from strategies.settings import key_of

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


# --- the run config, and what it names --------------------------------------------------------------
def checked_run_config(overrides: dict[str, Any], app_dir: Path = APP_DIR, nodes: int = 0) -> dict[str, Any]:
    """The run config the ServerApp will see (the app's defaults, then `overrides`), checked whole
    before anything starts: what any submitted run is checked for (`run_config.check_before_start`:
    the ServerApp's own parser, a fleet file read by the ClientApp's reader, the results folder, the
    task's files), then what a simulation on this machine needs of it (`check_simulation`). Returns the
    overrides to pass on, relative dataset paths made absolute (from the app folder)."""
    from fl_client.node import load_fleet_file

    cfg, _ = check_before_start(overrides, app_dir, load_fleet_file=load_fleet_file)
    return check_simulation(cfg, overrides, app_dir, nodes)


def check_simulation(
    cfg: ServerConfig, overrides: dict[str, Any], app_dir: Path = APP_DIR, nodes: int = 0
) -> dict[str, Any]:
    """What a local simulation's virtual nodes need of this machine, where they run: every board of
    the fleet a simulated one (a real board joins a deployment as a SuperNode with its own device), every
    dataset file there (relative paths from the app folder, passed on absolute), the profile cache
    writable, and a population under which one of the `nodes` virtual nodes is available in some round
    (`strategies.population.check_population`). The first problem is one RunConfigError line; returns
    the overrides to pass on."""
    from fl_client.node import load_fleet
    from powerctl.files.outputs import check_output_dir
    from powerfed.training.data.load import existing_dataset_path
    from powerfed.training.errors import DataError
    from strategies.fleet import fleet_availability, not_simulated
    from strategies.population import PopulationError, check_population, run_population
    from strategies.setting_kinds import DATASET
    from strategies.settings import SETTINGS

    for entry in load_fleet(cfg.fleet):
        if problem := not_simulated(entry.device):
            raise RunConfigError(
                f"run config: 'fleet' entry {entry.label()!r}: {problem}; a local simulation runs simulated "
                "boards, a real board joins a deployment as a SuperNode with its own device "
                "(docs/deployment.md)"
            )
    passed = dict(overrides)
    for setting in (s for s in SETTINGS.values() if s.kind is DATASET):
        spec = getattr(cfg, setting.attr)
        try:
            path = existing_dataset_path(spec, base=app_dir)
        except DataError as exc:
            raise RunConfigError(f"run config: {setting.key!r}: {exc}") from None
        if path is not None and setting.key in passed:
            passed[setting.key] = f"{spec.partition(':')[0]}:{path}"
    if cfg.profile_cache:
        try:
            check_output_dir(Path(cfg.profile_cache).expanduser(), "run config: 'profile-cache'")
        except PowerctlError as exc:
            raise RunConfigError(str(exc)) from None
    try:
        population = run_population(cfg, fleet_availability(cfg.fleet))
        check_population(population, nodes, cfg.num_server_rounds)
    except PopulationError as exc:
        raise RunConfigError(f"run config: population: {exc}") from None
    return passed


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
    """Stop every process below `pid` (default: this one), by pid (`stop_tree`); returns them."""
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


def _tree(port: int, home: Path) -> list[int]:
    """The SuperLink of Flower home `home` on `port` and everything below it (SuperExec, the
    simulation, Ray); nothing that merely listens there."""
    pids: list[int] = []
    for pid in pids_listening_on(port):
        if superlink_home(pid) == home:
            pids += [pid, *descendants(pid)]
    return pids


def _clear_ports(ports: list[int], echo: Callable[[str], None]) -> None:
    """What a killed launcher left is stopped (its home says it is ours: `clean_stale_homes`); then a
    port asked for that anything still holds — another run's SuperLink, a bare `flwr run`'s, any other
    program — is one NotOurProcessError line naming the process, and nothing is signalled: a run never
    joins, nor stops, a SuperLink it did not start."""
    for home, launcher, stopped in clean_stale_homes():
        echo(f"cleaned up an earlier run: {describe_cleaned(home, launcher, stopped)}")
    for port in ports:
        if (what := port_holder(port)) is not None:
            raise NotOurProcessError(
                f"port {port} is held by {what}: this run starts its own SuperLink; give another port "
                f"(SUPERLINK_PORT=, --port; none: a free one), or stop that process if it is yours "
                f"(a SuperLink `flwr run .` left: python -m simulations stop-superlink --port {port})"
            )


FLEET_APPS = {
    'serverapp = "fl_server.app:app"': 'serverapp = "simulations.fleet_server:app"',
    'clientapp = "fl_client.app:app"': 'clientapp = "simulations.fleet_client:app"',
}
"""The apps a run started here runs: the fleet runner's (the built-in ones with the fleet's steps and
the record they send beside the report), by the built-in components' lines they replace."""


def with_fleet_apps(staged: Path, app_dir: Path) -> Path:
    """`staged`, where it is this app's staged copy, naming the fleet runner's ServerApp and ClientApp in
    its `pyproject.toml` (scale mode, predicted profiles and the oracle's search are the fleet's own,
    not a deployed board's); another app's folder, or one not staged, as it is."""
    pyproject = staged / "pyproject.toml"
    if staged == app_dir or app_dir != APP_DIR or not pyproject.is_file():
        return staged
    text = pyproject.read_text(encoding="utf-8")
    for built_in, fleet in FLEET_APPS.items():
        text = text.replace(built_in, fleet, 1)
    pyproject.write_text(text, encoding="utf-8")
    return staged


def run_flwr(
    federation: str,
    run_config: str,
    log_path: Path,
    *,
    echo: Callable[[str], None] = print,
    verbose: bool = False,
    port: int | None = None,
    app_dir: Path = APP_DIR,
    index_messages: bool = True,
) -> FlowerRun:
    """`flwr run APP_DIR --stream` (or another Flower app's folder, `app_dir`) with a private Flower home
    on `port` and its control API on `port` + 2 (default: free ports).

    Lines go to `log_path` and, unless `verbose` is off and they are Flower's or Ray's own, to `echo`.
    The simulation runs through `simulations.linkstate_index`'s `flwr-simulation` wrapper, first on the
    run's PATH: it records the virtual nodes for a population's sampling and, with `index_messages`,
    dispatches messages in O(messages) a pass, not O(nodes × messages); on a Flower it was not written
    for, one line and nothing started.
    Every process it started is stopped before this returns or raises (KeyboardInterrupt included)."""
    check_flower_version()  # the simulation runs through our wrapper (simulations.linkstate_index)
    preflight()  # a Ray cluster recorded but dead makes `flwr run` hang: check it first
    cache_root()  # $POWERFED_CACHE set to a file would fail only after Flower started: check it first
    control_port = port + 2 if port is not None and port + 2 < 65536 else None
    _clear_ports([p for p in (port, control_port) if p is not None], echo)
    port = port or free_port()
    control = control_port or free_port()
    run = FlowerRun()
    proc = None
    home = FlowerHome.create()  # a killed launcher's home is cleaned by the next start (above)
    try:
        staged = with_fleet_apps(staged_app(app_dir, home.path / "app"), app_dir)
        cmd = flwr_run_command(staged, federation, run_config)
        env = flower_env(
            port,
            control,
            FLWR_HOME=str(home.path),
            PYTHONPATH=os.pathsep.join(p for p in (str(APP_DIR), os.environ.get("PYTHONPATH", "")) if p),
        )
        # the SuperExec finds `flwr-simulation` on PATH: ours first, in the home
        env["PATH"] = f"{install_script(home.path / 'bin').parent}{os.pathsep}{env['PATH']}"
        env[INDEX_ENV] = "1" if index_messages else "0"
        with signals_as_interrupt(), log_path.open("w", encoding="utf-8") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            home.start_watchdog(stderr=log)
            proc = subprocess.Popen(
                cmd,
                cwd=app_dir,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            run.pids.append(proc.pid)
            home.record(run.pids)
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = ANSI.sub("", raw.rstrip("\n"))
                log.write(line + "\n")
                log.flush()
                if not run.pids[1:] and (tree := _tree(port, home.path)):
                    run.pids += tree
                    home.record(tree)
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
            run.pids += _tree(port, home.path) + home.processes()
            if proc is not None:
                run.pids += descendants(proc.pid)
            home.close()  # every process marked with the home or recorded in it, then the folder
            if proc is not None:
                if alive(proc.pid):
                    stop_tree(proc.pid)
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    proc.wait(timeout=5)
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
    app_dir: Path = APP_DIR
    """The Flower app run: this one, or a user's (`--app`, e.g. examples/quickstart-powerfed)."""


def check_app(app: Path) -> Path:
    """`--app`: a Flower app folder (one with a pyproject.toml), made absolute."""
    folder = app.expanduser().resolve()
    if not (folder / "pyproject.toml").is_file():
        raise LaunchError(f"--app {app}: not a Flower app folder (no pyproject.toml in it); give the folder")
    return folder


def check_launch(
    nodes: int, run_config: str, out: Path, log_path: Path, port: int | None = None, app: Path | None = None
) -> Launch:
    """Every input of `make run`, and everything its run config names, checked before anything starts
    (`checked_run_config`): one LaunchError (or other PowerctlError) line naming what is wrong; nothing
    is started or written. Another app (`app`) has run config keys of its own: Flower checks them, and
    the app prints its own `results: PATH` line (`out` is not used)."""
    from powerctl.files.outputs import check_output_dir, check_output_file

    check_flower_version()  # the run's simulation uses the message index (`run_flwr`)
    app_dir = APP_DIR if app is None else check_app(app)
    check_nodes(nodes)
    overrides = parse_run_config(run_config)
    if app is None and (results_dir := key_of("results_dir")) not in overrides:  # the run config's wins
        out = check_output_dir(out.expanduser().resolve(), "results folder")
        overrides = {results_dir: str(out), **overrides}
    if app is None:
        overrides = checked_run_config(overrides, nodes=nodes)
    log_path = log_path.expanduser().resolve()
    check_output_dir(log_path.parent, "log folder")
    if log_path.parent.is_dir():  # else it is created at the start, as the results folder is
        check_output_file(log_path, "log")
    return Launch(nodes, overrides, log_path, port, app_dir)


def federation(nodes: int, cpus_per_client: int = 1) -> str:
    """Flower's federation config of a local simulation: `nodes` virtual nodes, each client actor given
    `cpus_per_client` of Ray's CPUs. One (Flower's default is two) runs as many clients at once as the
    machine has cores, each with one torch thread (Ray's OMP_NUM_THREADS): on 2 cores, two clients train
    side by side instead of one with two threads (docs/results/first_contact.md). The fleet runner's
    clients run so too (`simulations.runner`)."""
    return f"num-supernodes={nodes} client-resources-num-cpus={cpus_per_client}"


def launch(plan: Launch, *, echo: Callable[[str], None] = print) -> Path:
    """Run the app's default federation on `plan.nodes` virtual nodes; stop everything it started.

    Returns the results file; LaunchError (one line) when the run failed."""
    plan.log_path.parent.mkdir(parents=True, exist_ok=True)
    port = plan.port
    run = run_flwr(
        federation(plan.nodes),
        run_config_text(plan.overrides),
        plan.log_path,
        echo=echo,
        verbose=True,
        port=port,
        app_dir=plan.app_dir,
    )
    if run.error_line:
        raise LaunchError(f"the ServerApp stopped: {run.error_line} (log: {plan.log_path})")
    if run.results_path is None:
        raise LaunchError(f"the run ended without its results line; see {plan.log_path}")
    return run.results_path
