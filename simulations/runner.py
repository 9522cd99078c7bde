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
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from powerctl.errors import PowerctlError
from simulations.fleet import FleetFileError, FleetSpec
from simulations.launcher import run_config_text, run_flwr
from simulations.linkstate_index import check_flower_version
from simulations.local_superlink import alive
from strategies.methods import trains_real_model


class FleetRunError(PowerctlError):
    """The Flower run failed or ended without its results; the text says where its log is."""


def federation_config(spec: FleetSpec, cpus_per_client: int) -> str:
    return f"num-supernodes={len(spec.boards)} client-resources-num-cpus={cpus_per_client}"


def run_flower(
    spec: FleetSpec,
    out: Path,
    methods: list[str],
    *,
    echo: Callable[[str], None] = print,
    verbose: bool = False,
    cpus_per_client: int = 1,
    port: int | None = None,
    index_messages: bool = True,
) -> tuple[Path, list[int]]:
    """Run the fleet under `flwr run`; returns (the ServerApp's results folder, every pid it started).

    Every process started is stopped before this returns (`simulations.launcher.run_flwr`)."""
    flwr_out = out / "flwr"
    profiles = out / "profiles"
    for folder in (flwr_out, profiles):  # a fresh run: nothing measured before is reused or mixed in
        shutil.rmtree(folder, ignore_errors=True)
    flwr_out.mkdir(parents=True)
    config = spec.run_config(flwr_out, methods, profiles)
    log_path = out / "flwr.log"
    run = run_flwr(
        federation_config(spec, cpus_per_client),
        run_config_text(config),
        log_path,
        echo=echo,
        verbose=verbose,
        port=port,
        index_messages=index_messages,
    )
    if run.error_line:
        raise FleetRunError(f"the ServerApp stopped: {run.error_line} (log: {log_path})")
    if run.results_line is None:
        raise FleetRunError(f"the Flower run ended without its results line; see {log_path}")
    return flwr_out, run.pids


def check_before_flower(spec: FleetSpec, out: Path, methods: list[str]) -> None:
    """What the ServerApp would refuse only once the SuperLink and Ray are up (about 25 s in): the run
    config, and the task's weights and relation vector files — by the ServerApp's own checks; and a
    Flower the message index was not written for (`simulations.linkstate_index`)."""
    from fl_server.run_config import check_task_files, parse_server_config

    check_flower_version()  # the simulation runs through simulations.linkstate_index's wrapper
    cfg = parse_server_config(spec.run_config(out / "flwr", methods, out / "profiles"))
    check_task_files(cfg, lambda key: f"{spec.path.name}: task.{key}", FleetFileError)


def run_fleet(
    spec: FleetSpec,
    out: Path,
    methods: list[str],
    *,
    echo: Callable[[str], None] = print,
    verbose: bool = False,
    plots: bool = True,
    port: int | None = None,
    index_messages: bool = True,
) -> dict[str, Any]:
    """Run, merge and report: DIR/results.json, DIR/summary.txt, DIR/plots/*.png.

    `index_messages=False` runs Flower's own per-node scan (`simulations.linkstate_index`): the
    before of `bench/fleet_scale.py` and of the equivalence test; the results are the same."""
    from powerctl.files.cache import cache_root
    from powerctl.files.outputs import check_output_dir, replacing
    from simulations.fleet_results import build_results, summary_text, write_results

    cache_root()  # a $POWERFED_CACHE that cannot be a folder: one line before --out is created
    check_flower_version()  # before --out is created or anything in it removed
    out = check_output_dir(out.expanduser().resolve())
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
    check_before_flower(spec, out, methods)
    flwr_out, pids = run_flower(
        spec, out, methods, echo=echo, verbose=verbose, port=port, index_messages=index_messages
    )
    results = build_results(spec, flwr_out, methods, wall_seconds=time.perf_counter() - started)
    results["processes"] = {"started": pids, "alive_after": [p for p in pids if alive(p)]}
    write_results(out / "results.json", results)
    text = summary_text(results)
    with replacing(out / "summary.txt") as tmp:  # never over a device or FIFO
        tmp.write_text(text + "\n", encoding="utf-8")
    if plots:
        from simulations.fleet_plots import plot_fleet

        results["plots"] = [str(p.relative_to(out)) for p in plot_fleet(results, out / "plots")]
        write_results(out / "results.json", results)
    with contextlib.suppress(OSError):
        shutil.rmtree(out / "profiles")
    return results
