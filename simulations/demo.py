"""One simulated board, end to end: the ServerApp's own preparation, then the client's own round
(`fl_client.round.run_round`) for ours and each baseline on the same board, cap and data."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from fl_client.local_data import data_plan, load_local_data
from fl_client.node import NodeSettings
from fl_client.round import (
    CapRule,
    MethodRule,
    Profiled,
    RoundOutcome,
    RoundSteps,
    RoundWork,
    Trained,
    fine_tune_step,
    measured_profile_step,
    method_step,
    model_seq_len,
    node_device_seed,
    run_round,
    usable_relation,
)
from fl_server.app import pretrained_weights, quiet, relation_vector
from fl_server.results import cell
from fl_server.run_config import ServerConfig
from fl_server.weights import load_model
from powerctl.devices import open_device
from powerctl.devices.boards import board_model
from powerctl.files.jsonfile import write_json
from powerctl.files.outputs import check_output_dir
from powerctl.progress import Say
from powerctl.selection.baselines import board_fixed_frequency, predict
from powerctl.selection.methods import METHODS, method_named
from powerctl.selection.names import OURS
from powerfed.training.models import get_model_spec
from simulations.bench_steps import full_oracle_search
from simulations.demo_config import DEMO_NODE, DemoConfig
from simulations.fleet_results import table
from strategies.protocol import TrainInstructions

DEMO_SCHEMA = "simulations.demo/3"
ORDER = tuple(sorted(METHODS, key=lambda m: not method_named(m).searches_own_data))
"""The oracle first: its search measures the pairs the others most often pick."""


def say_on_stderr(text: str) -> None:
    """Progress of the long phases, on stderr (the table goes to stdout)."""
    print(f"demo: {text}", file=sys.stderr, flush=True)


class SharedRuns:
    """The train step, run once per (b, f) and evaluation interval and reused by every method that picks
    it (the same seeded work gives the same run)."""

    def __init__(self, say: Say = quiet) -> None:
        self.runs: dict[tuple[int, int, int], Trained] = {}
        self.say = say

    def __call__(self, work: RoundWork, rule: CapRule) -> Trained:
        choice = rule(work.cap_at_start)
        pair = (choice.batch_size, choice.frequency_hz, work.instr.eval_every_samples)
        if pair not in self.runs:
            self.say(
                f"fine-tuning at b={pair[0]}, {pair[1] / 1e6:.1f} MHz, evaluating every {pair[2]} samples "
                f"(run {len(self.runs) + 1}) ..."
            )
            started = time.perf_counter()
            self.runs[pair] = fine_tune_step(work, rule)
            r = self.runs[pair].result
            self.say(
                f"  {'reached' if r.reached else 'missed'} the target after {r.samples} samples, "
                f"{r.device_s:.1f} simulated s ({time.perf_counter() - started:.0f} s wall)"
            )
        return replace(self.runs[pair], choice=choice)


def check_demo(cfg: DemoConfig, out: Path) -> ServerConfig:
    """Every input checked before pre-training (minutes): the output folder, the run settings, the
    device, and a state-of-practice frequency under the cap."""
    check_output_dir(out)
    get_model_spec(cfg.run_config()["model"])  # "unknown model", before the run config says it its way
    settings = cfg.settings()
    with open_device(cfg.device, seed=settings.seed) as dev:
        board = dev.board
    board_fixed_frequency(board_model(board), cfg.power_cap_w)
    return settings


def demo_work(cfg: DemoConfig, settings: ServerConfig, say: Say = quiet) -> RoundWork:
    """The one node's round: the server's weights, relation vector and instructions, the board and the
    run's `client-data`."""
    weights = pretrained_weights(settings, say=say)
    model, meta = load_model(weights, expect_model=settings.model)
    say(
        f"relation vector on proxy {settings.proxy_data}: {len(settings.batch_sizes)} batch sizes × "
        f"{len(settings.relation_seeds)} seed(s) to accuracy {settings.target_accuracy:g} "
        "(cached after the first run) ..."
    )
    relation = relation_vector(settings, weights, say=say)
    node = NodeSettings(device=cfg.device, power_cap_w=cfg.power_cap_w, data=settings.client_data,
                        partition_id=None, num_partitions=None, key=DEMO_NODE)  # fmt: skip
    plan = data_plan(node, cfg.run_config(), model_seq_len(settings.model, {}))
    return RoundWork(
        node,
        TrainInstructions.for_run(
            settings, num_classes=meta.num_classes, model_overrides=meta.overrides, relation=relation
        ),
        {k: v.clone() for k, v in model.state_dict().items()},
        load_local_data(plan),
        device_seed=node_device_seed(node, settings.seed),
    )


def run_demo(cfg: DemoConfig, out: Path, say: Say = say_on_stderr) -> dict[str, Any]:
    """Run every method's round on the board; then (all at the end) write `out/results.json`,
    `profile.json`, `relation.json` and plots."""
    settings = check_demo(cfg, out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    work = demo_work(cfg, settings, say)
    relation = usable_relation(work.instr, len(work.split()[0]))
    say(f"profiling {cfg.device} under {_cap(cfg.power_cap_w)} (cached after the first run) ...")
    # one whole profile for every method (no profiling budget): the baselines read every batch size
    profiled = measured_profile_step(replace(work, instr=replace(work.instr, profiling_budget=0.0)), relation)
    shared = SharedRuns(say)
    outcomes: dict[str, RoundOutcome] = {}
    for method in ORDER:
        say(f"{method}:")
        steps = RoundSteps(
            profile=lambda _w, _r: profiled,
            choose=full_oracle_search if method_named(method).searches_own_data else method_step,
            train=shared,
        )
        outcomes[method] = run_round(replace(work, instr=replace(work.instr, method=method)), steps)
    rows = [_row(m, outcomes[m], profiled, relation) for m in METHODS]
    sop = next(r for r in rows if method_named(r["strategy"]).reference)
    for r in rows:
        r["speedup_vs_state_of_practice"] = (
            sop["device_s"] / r["device_s"] if r["reached"] and sop["reached"] else None
        )
    oracle = next(o.chosen.rule for m, o in outcomes.items() if method_named(m).searches_own_data)
    assert isinstance(oracle, MethodRule) and oracle.own_data is not None  # the relation it searched
    results = {
        "schema": DEMO_SCHEMA,
        "config": {"device": cfg.device, "power_cap_w": cfg.power_cap_w, "run": cfg.run_config()},
        "relation": relation.to_dict(),
        "own_data_relation": oracle.own_data.to_dict(),
        "profiling_s": profiled.profile.profiling_s,
        "strategies": rows,
        "all_runs": [{**_run(t), "eval_every_samples": every} for (_, _, every), t in shared.runs.items()],
        "wall_s": time.perf_counter() - started,
    }
    work.instr.relation_vector.save(out / "relation.json")
    profiled.profile.save(out / "profile.json")
    write_json(out / "results.json", results)
    from powerctl.cli.plot import plot_profile
    from powerctl.selection.joint import select
    from simulations.fleet_plots import plot_strategies

    chosen = select(profiled.profile, relation, cfg.power_cap_w)  # ours' pick, as the profile map marks it
    ours = outcomes[OURS].report
    assert (chosen.batch_size, chosen.frequency_hz) == (ours.batch_size, ours.frequency_hz)
    plot_profile(
        profiled.profile, out / "plots", power_cap_w=cfg.power_cap_w, relation=relation, selection=chosen
    )
    title = f"{settings.model} on {cfg.device}, {_cap(cfg.power_cap_w)}"
    plot_strategies(
        rows, out / "plots" / "strategies.png", title=title, target_accuracy=settings.target_accuracy
    )
    return results


def _cap(cap: float | None) -> str:
    return "no cap" if cap is None else f"a {cap:g} W cap"


def _run(t: Trained) -> dict[str, Any]:
    r = t.result
    return dict(batch_size=t.choice.batch_size, frequency_hz=t.choice.frequency_hz, reached=r.reached,
                samples=r.samples, device_s=r.device_s, energy_j=r.energy_j,
                peak_power_w=r.peak_power_w, final_accuracy=r.final_accuracy,
                curve=[asdict(p) for p in r.curve])  # fmt: skip


def _row(method: str, o: RoundOutcome, profiled: Profiled, relation: Any) -> dict[str, Any]:
    """A method's row: its measured run, and what the profile and the proxy's relation predict for it."""
    b, hz = o.report.batch_size, o.report.frequency_hz
    point = profiled.profile.point(b, hz)
    return {
        "strategy": method,
        **_run(o.trained),
        "predicted_s": predict(profiled.profile, relation, b, hz),
        "profiled_peak_power_w": None if point is None else point.peak_power_w,
    }


def summary_table(results: dict[str, Any]) -> str:
    """The table of the methods printed at the end of the demo."""
    head = (
        f"{'method':<18} {'b':>4} {'MHz':>7} {'pred s':>8} {'device s':>9} {'samples':>8} "
        f"{'energy J':>9} {'peak W':>7} {'acc':>6} {'speedup':>8}"
    )
    rows = [
        f"{r['strategy']:<18} {r['batch_size']:>4} {r['frequency_hz'] / 1e6:>7.1f} "
        f"{cell(r['predicted_s']):>8} {r['device_s']:>9.1f} {r['samples']:>8} "
        f"{cell(r['energy_j'], '.0f'):>9} {cell(r['peak_power_w'], '.2f'):>7} {r['final_accuracy']:>6.3f} "
        f"{cell(r['speedup_vs_state_of_practice'], '.2f', 'x'):>8}"
        + ("" if r["reached"] else " (target not reached)")
        for r in results["strategies"]
    ]
    return "\n".join(table(head, rows))
