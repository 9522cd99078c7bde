"""`python -m simulations`: `demo` (the method on one simulated board), `run` (a fleet file, every method),
`flwr-run` (what `make run` runs), `stop-superlink` and `ray-check`."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from powerctl.cli.util import (
    OneLineParser,
    accuracy,
    add_command,
    bounded_int,
    kind_type,
    one_line_errors,
    power_cap_w,
    run_command,
    tcp_port,
)
from powerctl.files.outputs import check_name_lengths, check_output_dir, output_path
from powerctl.procs import become_subreaper, descendants
from powerctl.selection.methods import METHODS, RUN_METHODS
from simulations.demo_config import DEMO_RUN, DemoConfig
from simulations.fleet import MAX_SEEDS, load_fleet_spec
from simulations.launcher import APP_DIR, check_launch, launch, uninterrupted
from simulations.local_superlink import pids_listening_on, stop_local_superlink, stop_tree
from simulations.ray_cluster import find_target
from strategies.settings import SETTINGS

PROG = "python -m simulations"


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG, description="Simulations of power-aware fine-tuning on simulated edge boards."
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    d = DemoConfig()
    model = DEMO_RUN["model"]
    s = add_command(sub, "demo", demo_command)
    s.add_argument("--out", type=output_path, required=True, help="output folder (results.json, plots/)")
    s.add_argument("--device", default=d.device, help=f"simulated board (default {d.device})")
    s.add_argument("--model", default=model, help=f"model name (default {model})")
    s.add_argument(
        "--power-cap", type=power_cap_w, default=d.power_cap_w, help=f"W (default {d.power_cap_w:g})"
    )
    s.add_argument(
        "--target-accuracy", type=accuracy, default=None, help="default: the run config's target-accuracy"
    )
    s.add_argument("--quiet", action="store_true", help="no progress lines")

    r = add_command(sub, "run", fleet_command)
    r.add_argument("fleet", type=Path, help="the fleet file (see simulations/fleets/default.yaml)")
    r.add_argument(
        "--out", type=output_path, help="output folder (default: runs/fleet-NAME, NAME the fleet file's)"
    )
    r.add_argument(
        "--methods",
        type=_methods,
        default=None,
        help=f"comma-separated, from {','.join(RUN_METHODS)} (default: the fleet file's methods, "
        f"else {','.join(METHODS)})",
    )
    bounded_int(1, MAX_SEEDS).add(
        r,
        "--seeds",
        "run the fleet N times, seed K with run and data seeds moved by K - 1 (DIR/seed-K/), and summarise "
        "them paired by seed against state-of-practice (default: the fleet file's seeds.count, else 1)",
        metavar="N",
    )
    r.add_argument("--verbose", action="store_true", help="also print Flower's and Ray's own log lines")
    r.add_argument("--no-plots", action="store_true", help="skip the plots")

    f = add_command(sub, "flwr-run", flwr_run_command)
    f.add_argument("--nodes", type=int, default=4, help="virtual nodes (default 4)")
    f.add_argument(
        "--run-config",
        default="",
        help="key=value pairs as `flwr run --run-config` takes them, strings quoted: "
        "'num-server-rounds=3 model=\"cnn-tiny\"'",
    )
    f.add_argument(
        "--out", type=output_path, default=Path("runs/flwr"), help="results folder (default runs/flwr)"
    )
    f.add_argument("--log", type=output_path, default=Path("runs/flwr.log"), help="default runs/flwr.log")
    f.add_argument(
        "--port",
        type=tcp_port,
        help="the local SuperLink's HTTP port (default: a free one); the control API uses PORT+2",
    )
    f.add_argument(
        "--app",
        type=Path,
        help="run another Flower app folder (e.g. examples/quickstart-powerfed): its run config is its own "
        "(checked by Flower), --out is not used, and the app prints its own 'results: PATH' line",
    )
    stop = add_command(sub, "stop-superlink", stop_superlink)
    stop.add_argument("--port", type=tcp_port, default=39091, help="default 39091")
    add_command(sub, "ray-check", ray_check)
    return p


def stop_superlink(args: argparse.Namespace) -> int:
    """stop the local SuperLink that `flwr run .` leaves running (by process id)

    Find the process listening on --port (the local SuperLink's HTTP port, 39091 unless
    FLWR_LOCAL_SUPERLINK_HTTP_API_PORT moves it) and, when it is a local SuperLink that `flwr run` started
    (a Python running flower-superlink --simulation with its log in its own Flower home), stop it with
    every process it started, by process id. Anything else on the port is one line naming it (exit 2),
    nothing stopped. Nothing listening is not an error.
    """
    stopped = stop_local_superlink(args.port)
    if stopped:
        print(f"stopped the local SuperLink on port {args.port} (pids {', '.join(map(str, stopped))})")
    else:
        print(f"nothing listens on port {args.port}: nothing to stop")
    return 0


def ray_check(_args: argparse.Namespace) -> int:
    """say which Ray cluster `flwr run` would join; exit 2 if it is dead

    Resolve the cluster Ray's `ray.init()` joins (RAY_ADDRESS, else the address the last `ray start --head`
    recorded in RAY_TMPDIR/ray/ray_current_cluster, default /tmp/ray) and try a TCP connect to it (1 s).
    Prints the cluster that will be used, or one line saying what is dead and what to do (exit 2): Ray
    would otherwise wait for a dead cluster forever.
    """
    print(find_target().describe())
    port = os.environ.get("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "39091")
    if port.isdigit() and (running := pids_listening_on(int(port))):
        print(
            f"note: a local SuperLink already listens on port {port} (pid {running[0]}); `flwr run` "
            f"reuses it with the Ray cluster it was started with: `{PROG} stop-superlink --port {port}` first"
        )
    return 0


def _methods(text: str) -> list[str]:
    """`--methods`: checked as the run setting `methods`, in their run order (as a fleet file's)."""
    names = kind_type(SETTINGS["methods"].kind, "methods")(text)
    return [m for m in RUN_METHODS if m in names]


def default_fleet_out(fleet: Path) -> Path:
    """Where a fleet's results go unless --out says: runs/fleet-NAME (`make fleet`'s folder)."""
    return check_name_lengths(Path("runs") / f"fleet-{fleet.stem}", "the default --out", hint="give --out")


def fleet_command(args: argparse.Namespace) -> int:
    """a fleet file on Flower's simulation engine (Ray), every method side by side

    Run the fleet of FLEET.yaml under each method (ours, state-of-practice, proxy-batch, oracle) from the
    same weights, data and seeds, on Flower's simulation engine on Ray. Writes DIR/results.json,
    DIR/summary.txt and DIR/plots/. With N seeds (--seeds, or the file's seeds.count), once per seed into
    DIR/seed-K/, and DIR/results.json and DIR/summary.txt summarise the seeds.
    """
    from simulations.runner import check_before_flower, run_fleet, run_seeds

    started = time.perf_counter()
    if args.out is None:
        args.out = default_fleet_out(args.fleet)
    spec = load_fleet_spec(args.fleet)
    methods = args.methods or spec.settings.methods
    count = spec.seed_count if args.seeds is None else spec.check_seed_count(args.seeds, "--seeds")
    out = args.out.expanduser().resolve()
    if count > 1:
        with owning_every_process():
            results = run_seeds(spec, args.out, methods, count, verbose=args.verbose, plots=not args.no_plots)
        plots = f" and {out / 'plots' / 'seed-ratios.png'}" if results.get("plots") else ""
        wrote = f"{out / 'summary.txt'}{plots}; each seed's own in {out}/seed-K/"
    else:
        check_before_flower(spec, check_output_dir(out), methods)  # before owning
        with owning_every_process():
            results = run_fleet(spec, args.out, methods, verbose=args.verbose, plots=not args.no_plots)
        wrote = f"{out / 'summary.txt'}" + (f" and {out / 'plots'}/" if not args.no_plots else "")
    print("\n" + (out / "summary.txt").read_text(encoding="utf-8"), end="")  # as the runner wrote it
    print(f"\nwall time {time.perf_counter() - started:.0f} s; wrote {out / 'results.json'}, {wrote}")
    if results.get("summary_figure"):  # drawn with a single run's plots (`run_fleet`)
        print(f"summary figure: {out / results['summary_figure']}")
    return 0


@contextlib.contextmanager
def owning_every_process() -> Iterator[None]:
    """This command's main process adopts what is orphaned below it and, on every way out, stops
    whatever is still running there (by process id and group) and reaps it."""
    become_subreaper()
    try:
        yield
    finally:
        with uninterrupted():
            stop_tree(*descendants(os.getpid()))
            with contextlib.suppress(ChildProcessError):  # reap the adopted ones that ended
                while os.waitpid(-1, os.WNOHANG)[0] > 0:
                    pass


def flwr_run_command(args: argparse.Namespace) -> int:
    """what `make run` runs: `flwr run .` on N virtual nodes, checked first, stopped whole at exit

    Check the number of nodes and the run config (Flower's own syntax, keys and values as the ServerApp
    reads them) before anything starts, then run `flwr run . --stream` with a private Flower home, its
    output copied to --log. On every way out (the end, an error, Ctrl-C, SIGTERM) the local SuperLink, the
    simulation and Ray are stopped by process id and group. Exit 0 only when the run ended with its
    results line, which is repeated last.
    """
    # the results line last (Flower and Ray may log after the ServerApp); another app's: no figure
    plan = check_launch(args.nodes, args.run_config, args.out, args.log, args.port, args.app)
    with owning_every_process():
        path = launch(plan)
    if plan.app_dir == APP_DIR:
        print("drawing the summary figure ...", flush=True)  # matplotlib's import and drawing take seconds
        from simulations.summary_figure import draw_or_say, run_figure

        if (figure := draw_or_say(lambda: run_figure(path), print)) is not None:
            print(f"summary figure: {figure}")
    print(f"results: {path}")
    return 0


def demo_command(args: argparse.Namespace) -> int:
    """one simulated board: the method against state-of-practice, proxy-batch and oracle

    Pre-train, estimate the relation vector on proxy data, profile a simulated board, select (batch size,
    frequency) under the cap, then fine-tune the target data with the method and each baseline and compare
    measured device time. Writes results.json and plots into --out.
    """
    from fl_server.app import quiet
    from simulations.demo import run_demo, say_on_stderr, summary_table

    run = {"model": args.model}  # run settings by their attribute (DemoConfig.run_config: their keys)
    if args.target_accuracy is not None:
        run["target_accuracy"] = args.target_accuracy
    cfg = DemoConfig(device=args.device, power_cap_w=args.power_cap, run=run)
    results = run_demo(cfg, args.out, quiet if args.quiet else say_on_stderr)
    print(summary_table(results))
    print(
        f"\nprofiling cost {results['profiling_s']:.1f} device seconds; wrote {args.out}/results.json "
        f"and {args.out}/plots/"
    )
    return 0


@one_line_errors(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    return run_command(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
