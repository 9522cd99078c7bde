"""`python -m simulations run FLEET.yaml --out DIR`: one `flwr run` runs every method from the same weights,
relation vector, data and seeds; the ServerApp's per-method results under DIR/flwr/ are merged here. Over
N seeds (`run_seeds`), one such run per seed into DIR/seed-K/, then the summary over seeds."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fl_server.run_config import check_task_files, parse_server_config, run_config_text
from powerctl.errors import PowerctlError
from powerctl.files.cache import cache_root
from powerctl.files.jsonfile import write_json
from powerctl.files.outputs import check_output_dir, replacing
from simulations.fleet import FleetFileError, FleetSpec
from simulations.launcher import federation, run_flwr
from simulations.linkstate_index import check_flower_version
from strategies.power_aware import trains_real_model


class FleetRunError(PowerctlError):
    """The Flower run failed or ended without its results (the text names its log); `pids`: every
    process it started, all stopped by then."""

    def __init__(self, message: str, pids: list[int] | None = None) -> None:
        super().__init__(message)
        self.pids = list(pids or [])


def run_flower(
    spec: FleetSpec,
    out: Path,
    methods: list[str],
    *,
    echo: Callable[[str], None] = print,
    verbose: bool = False,
    port: int | None = None,
    index_messages: bool = True,
) -> tuple[Path, list[int]]:
    """Run the fleet under `flwr run`, stopping all it started; (the ServerApp's results folder, the pids)."""
    flwr_out = out / "flwr"
    profiles = out / "profiles"
    for folder in (flwr_out, profiles):  # a fresh run: nothing measured before is reused or mixed in
        shutil.rmtree(folder, ignore_errors=True)
    flwr_out.mkdir(parents=True)
    log_path = out / "flwr.log"
    run = run_flwr(
        federation(len(spec.boards)),
        run_config_text(spec.run_config(flwr_out, methods, profiles)),
        log_path,
        echo=echo,
        verbose=verbose,
        port=port,
        index_messages=index_messages,
    )
    if run.error_line:
        raise FleetRunError(f"the ServerApp stopped: {run.error_line} (log: {log_path})", run.pids)
    if run.results_line is None:
        crash = last_exception(log_path)
        said = f" (the last exception in its log: {crash})" if crash else ""
        raise FleetRunError(f"the Flower run ended without its results line{said}; see {log_path}", run.pids)
    return flwr_out, run.pids


LOG_TAIL_BYTES = 256 * 1024


def last_exception(log_path: Path, limit: int = 300) -> str | None:
    """The exception line of the last traceback at the end of a run's log (not Ray's forwarded ones,
    a client's): the cause of a run without its results line."""
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
    """What the ServerApp would refuse only once the SuperLink and Ray are up, by its own checks: the
    run config and the task's files; and an unsupported Flower."""
    check_flower_version()
    cfg = parse_server_config(spec.run_config(out / "flwr", methods, out / "profiles"))
    check_task_files(cfg, lambda key: f"{spec.path.name}: task.{key}", FleetFileError)


def _fresh_out(out: Path) -> Path:
    """`out` checked, made absolute; first what would fail only once it was created."""
    cache_root()
    check_flower_version()
    return check_output_dir(out.expanduser().resolve())


def _write(out: Path, results: dict[str, Any], text: str) -> None:
    """DIR/results.json and DIR/summary.txt (never over a device or FIFO)."""
    write_json(out / "results.json", results)
    with replacing(out / "summary.txt") as tmp:
        tmp.write_text(text + "\n", encoding="utf-8")


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
    `index_messages=False`: Flower's own dispatch (`simulations.linkstate_index`), the same results."""
    from simulations.fleet_results import build_results, missing_methods, processes, summary_text

    out = _fresh_out(out)
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
    results = build_results(spec, flwr_out, methods, wall_s=time.perf_counter() - started)
    results["processes"] = processes(pids)
    _write(out, results, summary_text(results))
    if plots:
        from simulations.fleet_plots import plot_fleet
        from simulations.summary_figure import draw_or_say, fleet_figure

        results["plots"] = [str(p.relative_to(out)) for p in plot_fleet(results, out / "plots")]
        if (figure := draw_or_say(lambda: fleet_figure(results, out), echo)) is not None:
            results["summary_figure"] = str(figure.relative_to(out))
        write_json(out / "results.json", results)
    with contextlib.suppress(OSError):
        shutil.rmtree(out / "profiles")
    return results


def preparation_cached(spec: FleetSpec, out: Path, methods: list[str]) -> bool:
    """Whether the ServerApp will find the run's pre-trained weights and relation vector cached."""
    from fl_server.app import cached_preparation

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
    seed_spec: Callable[[FleetSpec, int], FleetSpec] = FleetSpec.for_seed,
) -> dict[str, Any]:
    """Run the fleet once per seed K into DIR/seed-K/ (`seed_spec(spec, K - 1)`), then write the summary
    over seeds: DIR/results.json, DIR/summary.txt, DIR/plots/seed-ratios.png. A seed whose run fails
    (FleetRunError) is reported and left out; FleetRunError when every seed failed."""
    from simulations.fleet_seeds import SeedRun, build_seed_results, seeds_summary_text

    out = _fresh_out(out)
    specs = [seed_spec(spec, k) for k in range(count)]
    for k, one in enumerate(specs, start=1):  # every seed's run config refused now, not after some ran
        check_before_flower(one, out / f"seed-{k}", methods)
    started = time.perf_counter()
    runs: list[SeedRun] = []
    for k, one in enumerate(specs, start=1):
        folder = out / f"seed-{k}"
        cached = preparation_cached(one, folder, methods)
        run = SeedRun(k, one.settings.seed, one.settings.client_data_seed, folder, cached)
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
        run.wall_s = time.perf_counter() - t0
        runs.append(run)
        ended = f"done in {run.wall_s:.0f} s: {folder}" if run.ok else f"FAILED after {run.wall_s:.0f} s: "
        echo(f"=== seed {k} of {count} {ended}{run.error or ''}")
    results = build_seed_results(spec, methods, runs, wall_s=time.perf_counter() - started)
    _write(out, results, seeds_summary_text(results))
    if plots and results["summary"] and results["reference"]:
        from simulations.fleet_plots import plot_seed_ratios

        results["plots"] = [
            str(plot_seed_ratios(results, out / "plots" / "seed-ratios.png").relative_to(out))
        ]
        write_json(out / "results.json", results)
    if not any(r.ok for r in runs):
        raise FleetRunError(f"every one of the {count} seeds failed; see {out / 'summary.txt'}")
    return results
