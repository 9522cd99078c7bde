"""The ServerApp: weights (given, shipped or pre-trained) + relation vector (given, shipped or estimated)
→ power-aware rounds, each printed and written to results.json; ends with ``results: /ABSOLUTE/PATH``."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import queue
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp

from fl_server.progress import Heartbeat, ProgressGrid, SampleProgress
from fl_server.results import ResultsWriter, client_table, evaluation_line, over_budget_lines, summary_lines
from fl_server.resume import GLOBAL_FILE, RESULTS_FILE, move_aside, resume_point, run_fingerprint
from fl_server.run_config import RESULTS_DIR, ServerConfig, given_relation, parse_server_config
from fl_server.shipped import WRITE_COMMAND, shipped_bytes, unpacked_weights
from powerctl.cli.util import say
from powerctl.errors import PowerctlError
from powerctl.files.cache import cache_dir, xdg_home
from powerctl.files.outputs import check_output_dir
from powerctl.progress import Say
from powerctl.records.relation import INTERVAL_STANDARD_ERRORS, RelationVector
from powerctl.selection.methods import run_method_named
from strategies.fedavg import PowerAwareFedAvg
from strategies.fleet import app_path_of
from strategies.objectives import NodeWaits, objective_named
from strategies.population import (
    POPULATION_FILE,
    Population,
    PopulationSampled,
    run_population,
)
from strategies.power_aware import for_method
from strategies.protocol import TrainInstructions
from strategies.rounds import NoClientReported, NodeInfo, RoundRecord

if TYPE_CHECKING:
    from torch import nn

    from fl_server.relation import RelationSettings

app = ServerApp()

PRETRAIN_CACHE_VERSION = 1


class InjectedServerStop(RuntimeError):
    """A crash on purpose (run config inject-server-stop-round, soak tests only)."""


def default_results_dir(run_id: int) -> Path:
    return xdg_home("data") / "powerfed" / "runs" / str(run_id)


def pretrain_recipe(cfg: ServerConfig) -> dict[str, Any]:
    """What the pre-trained weights depend on, less the CPU and thread count: the shipped weights' key."""
    return {
        "model": cfg.model,
        "data": cfg.pretrain_data,
        "samples": cfg.pretrain_samples,
        "seed": cfg.pretrain_seed,
        "version": PRETRAIN_CACHE_VERSION,
    }


def weights_path(cfg: ServerConfig) -> Path:
    """The given file, or the shipped weights, or the cache entry (keyed by `numerics_key`: not device)."""
    if cfg.weights:
        return app_path_of(cfg.weights)
    if (path := unpacked_weights(pretrain_recipe(cfg), cache_dir("weights"))) is not None:
        return path
    import torch

    from powerfed.training.numerics import numerics_key

    recipe = {**pretrain_recipe(cfg), **numerics_key(torch.get_num_threads())}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir("weights") / f"pretrain-{cfg.model}-{key}.safetensors"


def is_shipped(path: Path) -> bool:
    return path.name.startswith("shipped-") and path.parent == cache_dir("weights")


def quiet(_: str) -> None:
    """Hears nothing: `say` for a caller that wants no progress lines."""


def train_weights(cfg: ServerConfig, path: Path, *, say: Say = quiet) -> Path:
    """Pre-train the run's model on the embedded task into `path`; `say` hears how it goes."""
    from fl_server.pretrain import PretrainSettings, pretrain

    started = time.perf_counter()
    say(f"pre-training {cfg.model} on {cfg.pretrain_data}: {cfg.pretrain_samples} samples ...")
    pretrain(
        cfg.model,
        cfg.pretrain_data,
        out=path,
        settings=PretrainSettings(samples=cfg.pretrain_samples, seed=cfg.pretrain_seed),
        device=cfg.server_device,
        progress=False,
        on_step=SampleProgress(say, "pre-training", cfg.pretrain_samples),
    )
    say(f"pre-trained in {time.perf_counter() - started:.0f} s (cached: {path})")
    return path


def pretrained_weights(cfg: ServerConfig, *, say: Say = quiet) -> Path:
    """`weights_path`, pre-trained when neither shipped nor cached; `say` hears which."""
    path = weights_path(cfg)
    if not path.is_file():
        return train_weights(cfg, path, say=say)
    if is_shipped(path):
        say(f"shipped weights of {cfg.model} (made by `{WRITE_COMMAND}`, SHA-256 checked): {path}")
    return path


def relation_recipe(cfg: ServerConfig, weights: Path) -> dict[str, Any]:
    """What the run's relation vector depends on, less the CPU and thread count: the shipped vector's key."""
    from fl_server.relation import CACHE_VERSION
    from fl_server.weights import weights_hash

    return {
        "model": cfg.model,
        "weights": weights_hash(weights),  # the tensors (as the relation cache keys them), not the file
        "proxy": cfg.proxy_data,
        "target_accuracy": cfg.target_accuracy,
        "batch_sizes": cfg.batch_sizes,
        "settings": asdict(relation_settings(cfg)),
        "version": CACHE_VERSION,
    }


def relation_vector(
    cfg: ServerConfig, weights: Path, *, say: Say = quiet, compute: bool = True, shipped: bool = True
) -> RelationVector:
    """The given file, the shipped vector for this recipe (unless `shipped=False`), or estimated on the
    proxy data (`compute=False`: only a cached one, else `NotCached`)."""
    if cfg.relation:
        return given_relation(cfg)
    if shipped and (data := shipped_bytes("relation", relation_recipe(cfg, weights))) is not None:
        say(f"shipped relation vector of {cfg.model} (made by `{WRITE_COMMAND}`, SHA-256 checked)")
        return RelationVector.from_dict(json.loads(data), "the shipped relation vector")
    from fl_server.relation import RelationCompute, estimate_relation

    how = RelationCompute(compute=compute, device=cfg.server_device, progress=False, say=say)
    return estimate_relation(
        cfg.model,
        weights,
        cfg.proxy_data,
        target_accuracy=cfg.target_accuracy,
        batch_sizes=cfg.batch_sizes,
        settings=relation_settings(cfg),
        how=how,
    )


def relation_settings(cfg: ServerConfig) -> RelationSettings:
    """The run's `RelationSettings`: each field that is a run setting (`RUN_SETTING`) takes its value."""
    from fl_server.relation.request import RUN_SETTING, RelationSettings

    run = [f for f in fields(RelationSettings) if RUN_SETTING in f.metadata]
    return RelationSettings(**{f.name: getattr(cfg, f.metadata[RUN_SETTING]) for f in run})


def prepare(cfg: ServerConfig, lines: Any = None) -> tuple[Path, dict[str, Any]]:
    """The starting weights and the relation vector (as a dict, so it crosses a process boundary); its
    progress lines go to `lines` (a queue the parent prints from), else to this process's output."""
    tell = say if lines is None else lines.put
    weights = pretrained_weights(cfg, say=tell)
    return weights, relation_vector(cfg, weights, say=tell).to_dict()


def prepare_apart(cfg: ServerConfig) -> tuple[Path, RelationVector]:
    """`prepare` in a spawned interpreter: in a simulation the ServerApp shares the engine's GIL, and
    its training loops run many times slower there (docs/design/federation.md)."""
    if cfg.relation:
        given_relation(cfg)  # a file for another model is refused here, not after a spawned pre-training
    if (ready := cached_preparation(cfg)) is not None:
        shipped = "shipped with the package" if is_shipped(ready[0]) else f"cached under {cache_dir('')}"
        say(f"prepared ({shipped}): weights {ready[0]}")
        return ready
    what = [
        f"weights {cfg.weights}" if cfg.weights else f"pre-training {cfg.model} on {cfg.pretrain_data}",
        f"relation {cfg.relation}"
        if cfg.relation
        else f"relation vector on proxy {cfg.proxy_data} with {len(cfg.relation_seeds)} seeds",
    ]
    say(f"preparing: {'; '.join(what)} (cached under {cache_dir('')}) ...")
    started = time.perf_counter()
    ctx = multiprocessing.get_context("spawn")
    beat = Heartbeat(say, "preparing", started)
    # the child's progress lines come back through a queue: what it prints itself is not in the run's log
    with ctx.Manager() as manager, ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        lines = manager.Queue()
        future = pool.submit(prepare, cfg, lines)
        while not (future.done() and lines.empty()):
            try:
                beat.heard(f"  {lines.get(timeout=0.5)}")
            except queue.Empty:
                beat.tick()
        weights, relation = future.result()
    say(f"prepared in {time.perf_counter() - started:.0f} s: weights {weights}")
    return weights, RelationVector.from_dict(relation)


def cached_preparation(cfg: ServerConfig) -> tuple[Path, RelationVector] | None:
    """The weights and relation vector when both are given or cached, looked up without spawning."""
    from fl_server.relation import NotCached

    weights = weights_path(cfg)
    if not weights.is_file():
        return None
    try:
        return weights, relation_vector(cfg, weights, compute=False)
    except NotCached:
        return None


def relation_line(relation: RelationVector) -> str:
    """The vector as the run prints it; with its seeds, each entry's interval (± two standard errors)."""
    half = relation.interval_halfwidths()
    pairs = ", ".join(
        f"{b}: {r:.3f}" + (f" ±{100 * half[b]:.0f}%" if half[b] > 0 else "")
        for b, r in relation.as_map().items()
    )
    seeds = relation.per_seed_samples()
    z = f"{INTERVAL_STANDARD_ERRORS:g}"
    spread = f"; ± {z} standard errors of {len(seeds[0])} seeds" if seeds and any(half.values()) else ""
    where = f"{relation.proxy_dataset}, target {relation.target_accuracy:g}{spread}"
    return f"relation vector r_b ({where}): {pairs}"


CLIENT_TABLE_MAX = 24  # rounds with more clients print only their summary (all are in results.json)


@dataclass
class RunSetup:
    """What every method of a run shares: the same weights, relation vector, fleet and seeds."""

    cfg: ServerConfig
    model: nn.Module
    meta: Any
    initial_state: dict[str, Any]
    run_info: dict[str, Any]
    base: TrainInstructions
    eval_config: ConfigRecord
    fingerprint: str
    population: Population  # which boards each round takes
    nodes: dict[int, NodeInfo] = field(default_factory=dict)  # node ids hold for the whole run: asked once
    reported: list[str] = field(default_factory=list)  # methods in which some client reported
    failures: list[str] = field(default_factory=list)  # why each other method failed


def run_method(method: str, grid: Grid, setup: RunSetup, out: Path, label: bool = True) -> None:
    """Every round of one method, from the initial weights or where this run stopped before; results
    and the model after each round in `out`. `label`: name the method in the round headers."""
    from fl_server.weights import save_weights

    cfg, model, meta = setup.cfg, setup.model, setup.meta
    fingerprint = f"{setup.fingerprint}:{method}"
    point, aside = resume_point(out, fingerprint, cfg.resume, cfg.num_server_rounds)
    model.load_state_dict(point.state if point is not None else setup.initial_state)
    writer = ResultsWriter(
        out / RESULTS_FILE,
        {**setup.run_info, "method": method, "fingerprint": fingerprint},
        rounds=point.rounds if point else None,
        nodes=point.nodes if point else None,
        held=aside,  # nothing over the earlier files before this run has a result
    )
    strategy: PowerAwareFedAvg
    tag = f"[{method}] " if label else ""

    def on_round(record: RoundRecord) -> None:
        writer.record_round(record, list(strategy.nodes.values()))
        if writer.held and record.clients:
            say(f"{tag}moved the earlier results to {move_aside(out)}")
            writer.release()
        if record.evaluation is None and record.round == cfg.inject_server_stop_round:
            raise InjectedServerStop(f"injected ServerApp stop in round {record.round} (soak test)")
        if record.evaluation is None:
            say(
                f"\n{tag}[round {record.round}] clients "
                "(device s = fine-tuning; prof s = profiling this round)"
            )
            if len(record.clients) + len(record.failed) <= CLIENT_TABLE_MAX:
                say(client_table(record))
            say(summary_lines(record))
            for line in over_budget_lines(record):
                say(line)
        else:
            say(evaluation_line(record))

    def save_global(server_round: int, arrays: ArrayRecord) -> None:
        if writer.held:
            return  # no client has reported yet: the earlier run's model stays
        model.load_state_dict(arrays.to_torch_state_dict())
        save_weights(
            out / GLOBAL_FILE,
            model,
            model_name=meta.model,
            num_classes=meta.num_classes,
            overrides=meta.overrides,
            extra={"round": str(server_round), "fingerprint": fingerprint},
        )

    population = setup.population  # active: larger than a round (simulation), each round's boards only
    sampled = partial(PopulationSampled, population=population, path=out / POPULATION_FILE)
    objective = run_method_named(method).objective(cfg.round_objective)  # the registry's name for it
    strategy = PowerAwareFedAvg(
        instructions=setup.base,
        first_round=point.last_round + 1 if point else 1,
        node_instructions=for_method(method, cfg.real_share),
        on_round=on_round,
        on_round_end=save_global,
        fraction_train=cfg.fraction_train,
        fraction_evaluate=cfg.fraction_evaluate,
        waits=NodeWaits(min_available_nodes=cfg.min_nodes, rejoin_wait_s=cfg.rejoin_wait_s),
        round_objective=objective_named(objective, cfg.round_deadline_s),
        inner=sampled if population.active else None,
    )
    strategy.nodes = setup.nodes
    try:
        strategy.start(
            grid=grid,
            initial_arrays=ArrayRecord.from_torch_state_dict(model.state_dict()),
            num_rounds=cfg.num_server_rounds,
            timeout=cfg.round_timeout,
            evaluate_config=setup.eval_config,
        )
    except NoClientReported as exc:  # the other methods still run; `run` fails if none reported
        setup.failures.append(str(exc))
    if not any(r["clients"] for r in writer.data["rounds"]):
        where = "nothing written: the earlier results stay" if writer.held else f"recorded in {writer.path}"
        say(f"{tag}no client reported in any round ({where}): the global model is the starting one")
    else:
        setup.reported.append(method)


def run(grid: Grid, context: Context) -> Path:
    """The whole server side of a run; returns the results file (several methods: their folder)."""
    from fl_server.weights import load_model, weights_hash

    cfg = parse_server_config(context.run_config)
    methods = cfg.methods
    out = Path(cfg.results_dir).expanduser() if cfg.results_dir else default_results_dir(context.run_id)
    check_output_dir(out, RESULTS_DIR)  # before the pre-training: a folder it cannot write is one line now
    weights, relation = prepare_apart(cfg)
    model, meta = load_model(weights, expect_model=cfg.model)
    say(relation_line(relation))
    if cfg.profile_source == "predicted" or cfg.real_share < 1:
        say(
            f"scale mode: profiles {cfg.profile_source}; {cfg.real_share:.0%} of the clients fine-tune "
            f"{cfg.model}, the others run the stand-in (no training: the board model charges the proxy's "
            "samples to target at the chosen pair; their weights go back unchanged)"
        )
    setup = RunSetup(
        cfg=cfg,
        model=model,
        meta=meta,
        initial_state={k: v.clone() for k, v in model.state_dict().items()},
        run_info={
            "config": dict(context.run_config),
            "relation": relation.to_dict(),
            "weights": str(weights),
        },
        base=TrainInstructions.for_run(
            cfg, num_classes=meta.num_classes, model_overrides=meta.overrides, relation=relation
        ),
        eval_config=ConfigRecord(
            {
                "model": cfg.model,
                "num-classes": meta.num_classes,
                "model-overrides": json.dumps(meta.overrides),
            }
        ),
        fingerprint=run_fingerprint(dict(context.run_config), weights_hash(model), relation.to_dict()),
        population=run_population(cfg),
    )
    progress = ProgressGrid(grid, say)
    several = len(methods) > 1
    for number, method in enumerate(methods, start=1):
        progress.label = method
        if several:
            say(f"\n=== method {method} ({number} of {len(methods)}) ===")
        # a Grid to the strategy: it forwards what it does not override
        run_method(method, cast(Grid, progress), setup, out / method if several else out, several)
        if several:
            say(f"results ({method}): {(out / method / RESULTS_FILE).resolve()}")
    if not setup.reported:
        raise NoClientReported(setup.failures[0] if setup.failures else "no client reported in any round")
    return out if several else out / RESULTS_FILE


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        path = run(grid, context)
    except PowerctlError as exc:
        say(f"powerfed server: error: {exc}")
        raise SystemExit(2) from None
    say(f"results: {path.resolve()}")
