"""`python -m simulations run FLEET.yaml --out DIR`: a fleet on Flower's simulation engine (Ray).

One `flwr run` of this app runs every method one after another in the same ServerApp, from the same
pre-trained weights, relation vector, fleet, data partition and seeds (`fl_server.app`). The run gets
its own Flower home (a temporary folder) and two free local ports, so it neither reuses nor leaves
behind anybody's SuperLink: the SuperLink `flwr run` starts is stopped by process id afterwards, with
everything it started (Ray included), on every way out. The ServerApp writes one results file per
method under DIR/flwr/; the runner merges them (`simulations.fleet_results`) and draws the plots.

Over N seeds (`run_seeds`), one such run per seed into DIR/seed-K/, its run and data seeds moved by
K - 1, then the summary over seeds (`simulations.fleet_seeds`); a seed that fails is reported and left
out.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fl_server.run_config import run_config_text
from powerctl.errors import PowerctlError
from powerctl.procs import alive
from simulations.fleet import FleetFileError, FleetSpec
from simulations.launcher import federation, run_flwr
from simulations.linkstate_index import check_flower_version
from strategies.methods import trains_real_model


class FleetRunError(PowerctlError):
    """The Flower run failed or ended without its results; the text says where its log is, `pids` every
    process the run started (all stopped by then)."""

    def __init__(self, message: str, pids: list[int] | None = None) -> None:
        super().__init__(message)
        self.pids = list(pids or [])


def federation_config(spec: FleetSpec, cpus_per_client: int) -> str:
    return federation(len(spec.boards), cpus_per_client)


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
    federation, run_config = federation_config(spec, cpus_per_client), run_config_text(config)
    run = run_flwr(
        federation, run_config, log_path, echo=echo, verbose=verbose, port=port, index_messages=index_messages
    )
    if run.error_line:
        raise FleetRunError(f"the ServerApp stopped: {run.error_line} (log: {log_path})", run.pids)
    if run.results_line is None:
        crash = last_exception(log_path)
        said = f" (the last exception in its log: {crash})" if crash else ""
        raise FleetRunError(f"the Flower run ended without its results line{said}; see {log_path}", run.pids)
    return flwr_out, run.pids


LOG_TAIL_BYTES = 256 * 1024
"""How much of a run's log's end `last_exception` reads."""


def last_exception(log_path: Path, limit: int = 300) -> str | None:
    """The exception line of the last traceback in a run's log (one the ServerApp raised rather than
    refused with its one line): so that the reason of a run without its results line names the cause.
    Ray's forwarded lines (`(pid=…) Traceback`) are a client's, not the run's, and are left out."""
    try:
        with log_path.open("rb") as f:
            f.seek(max(0, log_path.stat().st_size - LOG_TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    found, inside = None, False
    for line in text.splitlines():
        if line.startswith("Traceback (most recent call last):"):
            inside = True
        elif inside and line and not line[0].isspace():
            found, inside = line.strip()[:limit], False
    return found


def check_before_flower(spec: FleetSpec, out: Path, methods: list[str]) -> None:
    """What the ServerApp would refuse only once the SuperLink and Ray are up (tens of seconds in): the run
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
    from simulations.fleet_results import build_results, missing_methods, summary_text, write_results

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
    if missing := missing_methods(flwr_out, methods):
        log = out / "flwr.log"
        raise FleetRunError(f"the run's results miss method(s) {', '.join(missing)}; see {log}", pids)
    results = build_results(spec, flwr_out, methods, wall_seconds=time.perf_counter() - started)
    results["processes"] = {"started": pids, "alive_after": [p for p in pids if alive(p)]}
    write_results(out / "results.json", results)
    text = summary_text(results)
    with replacing(out / "summary.txt") as tmp:  # never over a device or FIFO
        tmp.write_text(text + "\n", encoding="utf-8")
    if plots:
        from simulations.fleet_plots import plot_fleet
        from simulations.summary_figure import draw_or_say, fleet_figure

        results["plots"] = [str(p.relative_to(out)) for p in plot_fleet(results, out / "plots")]
        if (figure := draw_or_say(lambda: fleet_figure(results, out), echo)) is not None:
            results["summary_figure"] = str(figure.relative_to(out))
        write_results(out / "results.json", results)
    with contextlib.suppress(OSError):
        shutil.rmtree(out / "profiles")
    return results


SeedSpec = Callable[[FleetSpec, int], FleetSpec]
"""How seed K's fleet is made from the file's, given the offset K - 1 (`FleetSpec.for_seed`)."""


def preparation_cached(spec: FleetSpec, out: Path, methods: list[str]) -> bool:
    """Whether the run's pre-trained weights and relation vector are cached already (looked up as the
    ServerApp will: `fl_server.app.cached_preparation`)."""
    from fl_server.app import cached_preparation
    from fl_server.run_config import parse_server_config

    cfg = parse_server_config(spec.run_config(out / "flwr", methods, out / "profiles"))
    return cached_preparation(cfg) is not None


def run_seeds(
    spec: FleetSpec,
    out: Path,
    methods: list[str],
    count: int,
    *,
    echo: Callable[[str], None] = print,
    verbose: bool = False,
    plots: bool = True,
    seed_spec: SeedSpec = FleetSpec.for_seed,
) -> dict[str, Any]:
    """Run the fleet once per seed into DIR/seed-K/ (K = 1..count, `run_fleet`), then write the summary
    over seeds: DIR/results.json, DIR/summary.txt, DIR/plots/seed-ratios.png (`simulations.fleet_seeds`).

    A seed whose run fails (FleetRunError) is reported and left out of the summary; FleetRunError when
    every seed failed. Anything else (Ctrl-C included) stops the whole run, as a single run does."""
    from powerctl.files.cache import cache_root
    from powerctl.files.outputs import check_output_dir, replacing
    from simulations.fleet_results import write_results
    from simulations.fleet_seeds import SeedRun, build_seed_results, seeds_summary_text

    cache_root()  # as run_fleet: one line before --out is created
    check_flower_version()
    out = check_output_dir(out.expanduser().resolve())
    spec.check_seed_count(count, "--seeds")
    specs = [seed_spec(spec, k) for k in range(count)]
    for k, one in enumerate(specs, start=1):  # every seed's run config refused now, not after some ran
        check_before_flower(one, out / f"seed-{k}", methods)
    started = time.perf_counter()
    runs: list[SeedRun] = []
    for k, one in enumerate(specs, start=1):
        folder = out / f"seed-{k}"
        run = SeedRun(k, one.settings.seed, one.settings.client_data_seed, folder, False)
        run.prepared_cached = preparation_cached(one, folder, methods)
        echo(
            f"=== seed {k} of {count}: run seed {run.run_seed}, data seed {run.data_seed}; pre-trained "
            "weights and relation vector "
            + ("cached" if run.prepared_cached else "not cached yet (this seed prepares them)")
        )
        t0 = time.perf_counter()
        try:
            run.results = run_fleet(one, folder, methods, echo=echo, verbose=verbose, plots=plots)
        except FleetRunError as exc:
            run.error, run.pids = str(exc), exc.pids
        run.wall_seconds = time.perf_counter() - t0
        runs.append(run)
        ended = (
            f"done in {run.wall_seconds:.0f} s: {folder}"
            if run.ok
            else f"FAILED after {run.wall_seconds:.0f} s: "
        )
        echo(f"=== seed {k} of {count} {ended}{run.error or ''}")
    results = build_seed_results(spec, methods, runs, wall_seconds=time.perf_counter() - started)
    write_results(out / "results.json", results)
    with replacing(out / "summary.txt") as tmp:
        tmp.write_text(seeds_summary_text(results) + "\n", encoding="utf-8")
    if plots and results["summary"] and results["reference"]:
        from simulations.fleet_plots import plot_seed_ratios

        results["plots"] = [
            str(plot_seed_ratios(results, out / "plots" / "seed-ratios.png").relative_to(out))
        ]
        write_results(out / "results.json", results)
    if not any(r.ok for r in runs):
        raise FleetRunError(f"every one of the {count} seeds failed; see {out / 'summary.txt'}")
    return results
