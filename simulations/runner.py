"""`python -m simulations run FLEET.yaml --out DIR`: a fleet on Flower's simulation engine (Ray).

One `flwr run` of this app runs every method one after another in the same ServerApp, from the same
pre-trained weights, relation vector, fleet, data partition and seeds (`fl_server.app`). The run gets
its own Flower home (a temporary folder) and two free local ports, so it neither reuses nor leaves
behind anybody's SuperLink: the SuperLink `flwr run` starts is stopped by process id afterwards, with
everything it started (Ray included), on every way out. The ServerApp writes one results file per
method under DIR/flwr/; the runner merges them (`simulations.fleet_results`) and draws the plots.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from powerctl.errors import PowerctlError
from simulations.fleet import FleetSpec
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
from strategies.methods import trains_real_model

APP_DIR = Path(__file__).resolve().parents[1]
INFRA_LINE = re.compile(r"^\(\w+ pid=\d+\)|^(INFO|WARNING|DEBUG|ERROR)\s*:|^\s*$")
"""Lines the ServerApp did not print: Flower's log records and what Ray forwards from actors."""
ANSI = re.compile(r"\x1b\[[0-9;]*m")


class FleetRunError(PowerctlError):
    """The Flower run failed or ended without its results; the text says where its log is."""


def _toml(value: Any) -> str:
    if isinstance(value, str):
        if "'" in value:
            raise FleetRunError(f"a run config value cannot hold a single quote: {value!r}")
        return f"'{value}'"
    return repr(value)


def run_config_text(config: dict[str, Any]) -> str:
    """`--run-config` text: key=value pairs, strings in single quotes (TOML literal strings)."""
    return " ".join(f"{k}={_toml(v)}" for k, v in config.items())


def flwr_command(spec: FleetSpec, config: dict[str, Any], cpus_per_client: int) -> list[str]:
    federation = f"num-supernodes={len(spec.boards)} client-resources-num-cpus={cpus_per_client}"
    return flwr_run_command(APP_DIR, federation, run_config_text(config))


def run_flower(
    spec: FleetSpec,
    out: Path,
    methods: list[str],
    *,
    echo: Callable[[str], None] = print,
    verbose: bool = False,
    cpus_per_client: int = 1,
    port: int | None = None,
) -> tuple[Path, list[int]]:
    """Run the fleet under `flwr run`; returns (the ServerApp's results folder, every pid it started).

    Every process started is stopped before this returns (SuperLink tree by port, `flwr` by pid)."""
    preflight()  # a Ray cluster recorded but dead makes `flwr run` hang: check it first
    flwr_out = out / "flwr"
    profiles = out / "profiles"
    for folder in (flwr_out, profiles):  # a fresh run: nothing measured before is reused or mixed in
        shutil.rmtree(folder, ignore_errors=True)
    flwr_out.mkdir(parents=True)
    config = spec.run_config(flwr_out, methods, profiles)
    home = Path(tempfile.mkdtemp(prefix="powerfed-flwr-home-"))
    port, control = port or free_port(), free_port()
    env = flower_env(
        port,
        control,
        FLWR_HOME=str(home),
        PYTHONPATH=os.pathsep.join(p for p in (str(APP_DIR), os.environ.get("PYTHONPATH", "")) if p),
    )
    log_path = out / "flwr.log"
    cmd = flwr_command(spec, config, cpus_per_client)
    started: list[int] = []
    results_line = error_line = None
    proc = None
    old_term = _raise_on_sigterm()
    try:
        with log_path.open("w", encoding="utf-8") as log:
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
            started.append(proc.pid)
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = ANSI.sub("", raw.rstrip("\n"))
                log.write(line + "\n")
                log.flush()
                if not started[1:]:
                    started += _tree(port)
                if line.startswith("results: "):
                    results_line = line
                elif "powerfed server: error:" in line:
                    error_line = line.split("powerfed server: error:", 1)[1].strip()
                if verbose or not INFRA_LINE.match(line):
                    echo(line)
            proc.wait()
    except KeyboardInterrupt:
        echo("interrupted: stopping the simulation")
        raise
    finally:
        started += _tree(port)
        stop_local_superlink(port)
        if proc is not None and alive(proc.pid):
            stop_tree(proc.pid)
        shutil.rmtree(home, ignore_errors=True)
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    if error_line:
        raise FleetRunError(f"the ServerApp stopped: {error_line} (log: {log_path})")
    if results_line is None:
        raise FleetRunError(f"the Flower run ended without its results line; see {log_path}")
    return flwr_out, sorted(set(started))


def _raise_on_sigterm() -> Any:
    """SIGTERM (how a job is stopped) ends the run like Ctrl-C: the clean-up below then runs. Returns
    the previous handler (None off the main thread, where handlers cannot be set)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, interrupt)


def _tree(port: int) -> list[int]:
    """The SuperLink on `port` and everything below it (SuperExec, the simulation, Ray)."""
    pids: list[int] = []
    for pid in pids_listening_on(port):
        pids += [pid, *descendants(pid)]
    return pids


def run_fleet(
    spec: FleetSpec,
    out: Path,
    methods: list[str],
    *,
    echo: Callable[[str], None] = print,
    verbose: bool = False,
    plots: bool = True,
    port: int | None = None,
) -> dict[str, Any]:
    """Run, merge and report: DIR/results.json, DIR/summary.txt, DIR/plots/*.png."""
    from simulations.fleet_results import build_results, summary_text, write_results

    out = out.expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for note in spec.notes:
        echo(f"note: {note}")
    run = spec.settings
    echo(
        f"fleet {spec.name}: {len(spec.boards)} boards, {run.num_server_rounds} round(s), "
        f"methods {', '.join(methods)}, model {run.model}; Flower simulation on Ray, 1 CPU per client"
    )
    if spec.scale_mode:
        real = sum(trains_real_model(i, run.real_share) for i in range(len(spec.boards)))
        echo(
            f"scale mode: profiles {run.profile_source}; {real} of {len(spec.boards)} boards fine-tune "
            f"{run.model}, the other {len(spec.boards) - real} run the stand-in (no training)"
        )
    flwr_out, pids = run_flower(spec, out, methods, echo=echo, verbose=verbose, port=port)
    results = build_results(spec, flwr_out, methods, wall_seconds=time.perf_counter() - started)
    results["processes"] = {"started": pids, "alive_after": [p for p in pids if alive(p)]}
    write_results(out / "results.json", results)
    text = summary_text(results)
    (out / "summary.txt").write_text(text + "\n", encoding="utf-8")
    if plots:
        from simulations.fleet_plots import plot_fleet

        results["plots"] = [str(p.relative_to(out)) for p in plot_fleet(results, out / "plots")]
        write_results(out / "results.json", results)
    with contextlib.suppress(OSError):
        shutil.rmtree(out / "profiles")
    return results
