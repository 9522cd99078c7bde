"""One `flwr run` of this app whose whole life this process owns (`make run`, the fleet runner): checked
before it starts, in a private Flower home on its own ports, and stopped by process id on every way out
(`flwr run .` alone leaves its SuperLink, simulation and Ray running: FLOWER-1.41 notes)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Callable
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
from powerctl.errors import ANSI, PowerctlError
from powerctl.files.cache import cache_root
from powerctl.files.outputs import check_output_dir, check_output_file
from powerctl.procs import descendants, handling, search_path
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
from strategies.fleet import MAX_BOARDS, load_fleet, load_fleet_file, not_simulated
from strategies.setting_kinds import DATASET
from strategies.settings import SETTINGS, key_of

APP_DIR = Path(__file__).resolve().parents[1]
INFRA_LINE = re.compile(r"^\(\w+ pid=\d+\)|^(INFO|WARNING|DEBUG|ERROR)\s*:|^\s*$")
"""Lines the ServerApp did not print: Flower's log records and what Ray forwards from actors."""
SERVER_ERROR = "powerfed server: error:"
"""How the ServerApp says it stopped on an error (`fl_server.app.main`)."""


class LaunchError(PowerctlError):
    """A run that cannot start as asked (bad nodes, bad run config) or that failed; one line."""


# --- the run config, and what it names --------------------------------------------------------------
def check_simulation(
    cfg: ServerConfig, overrides: dict[str, Any], app_dir: Path = APP_DIR, nodes: int = 0
) -> dict[str, Any]:
    """What a local simulation needs of this machine: simulated boards only, every dataset file there
    (passed on absolute), the profile cache writable, and a population that `nodes` virtual nodes can
    serve. The first problem is one RunConfigError line; returns the overrides to pass on."""
    from powerfed.training.data.load import existing_dataset_path
    from powerfed.training.errors import DataError
    from strategies.population import PopulationError, check_population, run_population

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
        population = run_population(cfg)
        check_population(population, nodes, cfg.num_server_rounds)
    except PopulationError as exc:
        raise RunConfigError(f"run config: population: {exc}") from None
    return passed


# --- owning the processes -------------------------------------------------------------------------
def uninterrupted() -> contextlib.AbstractContextManager[None]:
    """Ctrl-C and SIGTERM ignored, so they cannot cut the (bounded) clean-up short."""
    return handling(signal.SIG_IGN, signal.SIGINT, signal.SIGTERM)


@dataclass
class FlowerRun:
    """How a `flwr run` ended: its results line, the ServerApp's error line, every pid it started."""

    results_line: str | None = None
    error_line: str | None = None
    pids: list[int] = field(default_factory=list)


def _tree(port: int, home: Path) -> list[int]:
    """The SuperLink of Flower home `home` on `port` and everything below it."""
    pids: list[int] = []
    for pid in pids_listening_on(port):
        if superlink_home(pid) == home:
            pids += [pid, *descendants(pid)]
    return pids


def _clear_ports(ports: list[int], echo: Callable[[str], None]) -> None:
    """Clean up what killed launchers left; then a port still held by anything is one
    NotOurProcessError line naming it, nothing signalled: a run never joins nor stops another's."""
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
"""The fleet runner's apps, by the built-in components' pyproject lines they replace."""


def with_fleet_apps(staged: Path, app_dir: Path) -> Path:
    """`staged`, this app's staged copy, running the fleet's apps (`FLEET_APPS`); another app as it is."""
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
    """`flwr run APP_DIR --stream` with a private Flower home on `port`, its control API on `port` + 2
    (default: free ports), the simulation through `simulations.linkstate_index`'s wrapper. Lines go to
    `log_path` and, unless they are Flower's or Ray's own and not `verbose`, to `echo`. Every process it
    started is stopped before this returns or raises. Its callers checked the Flower version."""
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
            PYTHONPATH=search_path(APP_DIR, rest=os.environ.get("PYTHONPATH", "")),
        )
        # the SuperExec finds `flwr-simulation` on PATH: ours first, in the home
        env["PATH"] = search_path(install_script(home.path / "bin").parent, rest=env["PATH"])
        env[INDEX_ENV] = "1" if index_messages else "0"
        # SIGTERM (how a job, or `make`, stops it) ends the run like Ctrl-C, so the clean-up runs
        with (
            handling(signal.default_int_handler, signal.SIGTERM),
            log_path.open("w", encoding="utf-8") as log,
        ):
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
            run.pids += home.close()  # every process marked with the home or recorded in it, then the folder
            if proc is not None:
                if proc.poll() is None:  # not stopped with the home's: a signal came before its record
                    run.pids += stop_tree(proc.pid)
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
    """The run config given, checked, with the results folder added."""
    log_path: Path
    port: int | None
    app_dir: Path = APP_DIR
    """The Flower app run: this one, or a user's (`--app`)."""


def check_launch(
    nodes: int, run_config: str, out: Path, log_path: Path, port: int | None = None, app: Path | None = None
) -> Launch:
    """Every input of `make run` and what its run config names, checked before anything starts or is
    written (as the ServerApp, then `check_simulation`): one PowerctlError line. Another `app` checks its
    own run config and prints its own results line (`out` unused)."""
    check_flower_version()
    app_dir = APP_DIR if app is None else app.expanduser().resolve()
    if not (app_dir / "pyproject.toml").is_file():
        raise LaunchError(f"--app {app}: not a Flower app folder (no pyproject.toml in it); give the folder")
    # a fleet's most; 0 would wait for ever, a huge one exhaust the machine
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_BOARDS:
        raise LaunchError(f"NODES: the number of virtual nodes must be from 1 to {MAX_BOARDS}, got {nodes!r}")
    overrides = parse_run_config(run_config)
    if app is None and (results_dir := key_of("results_dir")) not in overrides:  # the run config's wins
        out = check_output_dir(out.expanduser().resolve(), "results folder")
        overrides = {results_dir: str(out), **overrides}
    if app is None:
        cfg, _ = check_before_start(overrides, APP_DIR, load_fleet_file=load_fleet_file)
        overrides = check_simulation(cfg, overrides, APP_DIR, nodes)
    log_path = log_path.expanduser().resolve()
    check_output_dir(log_path.parent, "log folder")
    if log_path.parent.is_dir():  # else it is created at the start, as the results folder is
        check_output_file(log_path, "log")
    return Launch(nodes, overrides, log_path, port, app_dir)


def federation(nodes: int) -> str:
    """A local simulation's federation config: `nodes` virtual nodes, one Ray CPU each (not Flower's two:
    as many clients train at once as there are cores)."""
    return f"num-supernodes={nodes} client-resources-num-cpus=1"


def launch(plan: Launch, *, echo: Callable[[str], None] = print) -> Path:
    """Run the checked plan, stopping all it started: the results file, or one LaunchError line."""
    plan.log_path.parent.mkdir(parents=True, exist_ok=True)
    run = run_flwr(
        federation(plan.nodes),
        run_config_text(plan.overrides),
        plan.log_path,
        echo=echo,
        verbose=True,
        port=plan.port,
        app_dir=plan.app_dir,
    )
    if run.error_line:
        raise LaunchError(f"the ServerApp stopped: {run.error_line} (log: {plan.log_path})")
    if not run.results_line:
        raise LaunchError(f"the run ended without its results line; see {plan.log_path}")
    return Path(run.results_line.removeprefix("results: ").strip())
