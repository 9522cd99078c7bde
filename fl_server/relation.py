"""Estimate the relation vector on proxy data (docs/design/method.md, docs/reference/files.md).

For every batch size (and seed), the SAME starting weights are fine-tuned on a proxy dataset of the
task until the target accuracy, with the learning rate scaled from the largest batch size by the run's
rule (`lr_rule`, the square-root rule by default). Samples to target is the interpolated crossing of
the target on a run evaluated densely enough that every batch size crosses after several evaluations
(`training.crossing`). `samples_to_target[b]` is the mean over seeds (or the batch-efficiency model
fitted to them, `vector="fitted"`); `relation[b]` divides it by the largest batch size's; the file keeps
every seed's samples, their mean and spread beside it. Seeds can be added, one at a time up to
`max_seeds`, until the ranking of batch sizes by samples to target no longer changes (the file says
how many were needed). A batch size that cannot reach the target within the budget is an error (the
relation file needs a positive number for every batch size, and a made-up one would mislead the
selection): the message names it and says what to change.

Results are cached on disk, keyed by a hash of everything that determines them (model, weights,
proxy spec and proxy bytes, target, batch sizes, seeds, rates, budgets, code version), so asking again
is instant. Runs can go in parallel as Ray tasks, one CPU thread each; the numbers are the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fl_server.weights import load_weights, weights_hash
from powerctl.cache import CACHE_ENV, cache_dir
from powerctl.devices.host import HostDevice
from powerctl.errors import FileFormatError, PowerctlError
from powerctl.relation import VECTORS, RelationVector
from strategies.settings import run_default
from training.crossing import DEFAULT_MIN_EVALUATIONS, run_dense
from training.data import Dataset, load_dataset, train_test_split
from training.errors import DataError, ModelError
from training.finetune import fine_tune
from training.lr import LR_RULES, scaled_lr
from training.models import build_model, get_model_spec

log = logging.getLogger(__name__)
"""`fl_server.relation`: a relation cache that could not be written (WARNING)."""

__all__ = [
    "CACHE_ENV",
    "CACHE_VERSION",
    "RelationError",
    "RelationRequest",
    "default_cache_dir",
    "estimate_relation",
    "file_digest",
]

CACHE_VERSION = 2
"""Bump when a code change alters what a relation estimate would be: old cache entries then miss."""
INIT_SEED = 0
"""Seed of the starting weights when no pre-trained weights are given (same for every run)."""


class RelationError(PowerctlError):
    """The relation vector cannot be estimated as asked (a batch size never reached the target, ...)."""


def default_cache_dir() -> Path:
    return cache_dir("relation")


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes, or of a folder's files (relative names and bytes, sorted)."""
    p = Path(path)
    h = hashlib.sha256()
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    for f in files:
        if p.is_dir():
            h.update(f"{f.relative_to(p).as_posix()}\0".encode())
        with f.open("rb") as fh:
            for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                h.update(chunk)
        h.update(b"\0")
    return h.hexdigest()


def _spec_digest(spec: str) -> str | None:
    """Digest of the file/folder a dataset spec points at (`kind:PATH`); None for generated data."""
    _, sep, rest = spec.partition(":")
    if not sep or not rest:
        return None
    if not Path(rest).exists():
        raise DataError(f"dataset {spec!r}: {rest} does not exist")
    return file_digest(rest)


@dataclass(frozen=True)
class RelationRequest:
    """Everything that determines a relation estimate; its `cache_key` is the cache's file name."""

    model: str
    overrides: dict[str, Any]
    weights_sha256: str
    """Hash of the starting weights' tensors, or ``init:SEED`` for a seeded fresh initialisation."""
    proxy_spec: str
    proxy_sha256: str | None
    seq_len: int | None
    limit: int | None
    data_seed: int
    target_accuracy: float
    batch_sizes: tuple[int, ...]
    seeds: tuple[int, ...]
    lr_max: float
    lr_rule: str
    max_samples: int
    eval_every_samples: int
    eval_max_samples: int | None
    min_evaluations: int
    max_seeds: int
    vector: str

    def cache_key(self) -> str:
        fields = dict(self.__dict__)
        fields["batch_sizes"] = list(self.batch_sizes)
        fields["seeds"] = list(self.seeds)
        fields["cache_version"] = CACHE_VERSION
        fields["torch"] = ".".join(torch.__version__.split(".")[:2])
        blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def _validate(
    target_accuracy: float,
    batch_sizes: Sequence[int],
    seeds: Sequence[int],
    lr_max: float,
    max_samples: int,
    lr_rule: str = "sqrt",
    vector: str = "raw",
    max_seeds: int | None = None,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if not 0.0 < target_accuracy <= 1.0:
        raise RelationError(f"target accuracy must be in (0, 1], got {target_accuracy}")
    bs = tuple(batch_sizes)
    if not bs or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in bs):
        raise RelationError(f"batch sizes must be positive integers, got {list(bs)}")
    if len(set(bs)) != len(bs):
        raise RelationError(f"batch sizes must be distinct, got {list(bs)}")
    sd = tuple(seeds)
    if not sd or len(set(sd)) != len(sd):
        raise RelationError(f"seeds must be a non-empty list of distinct integers, got {list(sd)}")
    if not lr_max > 0:
        raise RelationError(f"lr_max must be > 0, got {lr_max}")
    if lr_rule not in LR_RULES:
        raise RelationError(f"unknown learning-rate rule {lr_rule!r}; use one of {', '.join(LR_RULES)}")
    if vector not in VECTORS:
        raise RelationError(f"unknown relation vector {vector!r}; use one of {', '.join(VECTORS)}")
    if max_seeds and max_seeds < len(seeds):
        raise RelationError(f"max_seeds ({max_seeds}) is fewer than the {len(seeds)} seeds given")
    if max_samples < 1:
        raise RelationError(f"max_samples must be ≥ 1, got {max_samples}")
    return tuple(sorted(bs)), sd


def _run_job(
    state: dict[str, torch.Tensor],
    model_name: str,
    num_classes: int,
    overrides: dict[str, Any],
    train: Dataset,
    test: Dataset,
    batch_size: int,
    seed: int,
    lr: float,
    target_accuracy: float,
    max_samples: int,
    eval_every_samples: int,
    eval_max_samples: int | None,
    min_evaluations: int,
    progress: bool,
    threads: int | None,
) -> dict[str, Any]:
    """One fine-tuning run from the shared starting weights, run again with denser evaluation if it
    crossed too early (`training.crossing.run_dense`); a plain dict so it crosses Ray."""
    if threads is not None:
        torch.set_num_threads(threads)

    def run(every: int) -> Any:
        model = build_model(model_name, num_classes, **overrides)
        model.load_state_dict(state)
        return fine_tune(
            model,
            train,
            test,
            device=HostDevice(),
            batch_size=batch_size,
            lr=lr,
            target_accuracy=target_accuracy,
            max_samples=max_samples,
            eval_every_samples=every,
            eval_max_samples=eval_max_samples,
            seed=seed,
            progress=progress,
            desc=f"b={batch_size} seed={seed}",
        )

    result, crossing, every = run_dense(
        run,
        batch_size=batch_size,
        eval_every_samples=eval_every_samples,
        target=target_accuracy,
        min_evaluations=min_evaluations,
    )
    return {
        "batch_size": batch_size,
        "seed": seed,
        "lr": lr,
        "reached": result.reached,
        "samples": float(crossing) if crossing is not None else float(result.samples),
        "samples_at_evaluation": result.samples,
        "eval_every_samples": every,
        "evaluations": len(result.curve) - 1,
        "steps": result.steps,
        "final_accuracy": result.final_accuracy,
        "best_accuracy": max(p.accuracy for p in result.curve),
        "initial_accuracy": result.curve[0].accuracy,
        "wall_seconds": result.wall_seconds,
    }


Say = Callable[[str], None]


class _RunProgress:
    """One line per finished run: which, what it measured, time so far and an estimate of what is left
    (runs of one batch size take about as long as each other; the estimate is the mean so far)."""

    def __init__(self, say: Say | None, total: int) -> None:
        self.say, self.total, self.done = say, total, 0
        self.started = time.perf_counter()

    def __call__(self, run: dict[str, Any]) -> None:
        self.done += 1
        if self.say is None:
            return
        spent = time.perf_counter() - self.started
        left = spent / self.done * (self.total - self.done)
        what = f"target after {run['samples']:.0f} samples" if run["reached"] else "missed the target"
        self.say(
            f"relation vector: run {self.done} of {self.total} (b={run['batch_size']}, seed {run['seed']}): "
            f"{what}; {spent:.0f} s so far, about {left:.0f} s left"
        )


def _run_parallel(
    jobs: list[dict[str, Any]],
    shared: dict[str, Any],
    num_cpus: int | None,
    progress: bool,
    finished: Callable[[dict[str, Any]], None],
) -> list:
    """Each job a Ray task with one torch thread; Ray is started locally (and stopped) if needed."""
    import ray

    started_here = not ray.is_initialized()
    if started_here:
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # CPU tasks: leave CUDA env alone
        cpus = num_cpus or min(len(jobs), os.cpu_count() or 1)
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        remote = ray.remote(num_cpus=1)(_run_job)
        refs = {k: ray.put(v) for k, v in shared.items()}
        futures = [remote.remote(**refs, **job, progress=False, threads=1) for job in jobs]
        bar = None
        if progress and sys.stderr.isatty():
            from tqdm import tqdm

            bar = tqdm(total=len(futures), desc="relation runs", unit="run", leave=False, file=sys.stderr)
        pending = list(futures)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            if bar is not None:
                bar.update(len(done))
            for ref in done:
                with contextlib.suppress(ray.exceptions.RayTaskError):  # raised below, as one line
                    finished(ray.get(ref))
        if bar is not None:
            bar.close()
        try:
            return ray.get(futures)
        except ray.exceptions.RayTaskError as exc:  # a user error inside a task stays a one-line error
            if isinstance(exc.cause, PowerctlError):
                raise exc.cause from None
            raise
    finally:
        if started_here:
            ray.shutdown()


def _starting_weights(
    model_name: str, weights: str | Path | None, overrides: dict[str, Any] | None
) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any], int | None, str]:
    """(state or None, overrides, num_classes or None, weights id) without touching the data yet."""
    if weights is None:
        return None, dict(overrides or {}), None, f"init:{INIT_SEED}"
    state, meta = load_weights(weights)
    if meta.model != model_name:
        raise ModelError(f"{weights}: weights are for model {meta.model!r}, not {model_name!r}")
    if overrides and dict(overrides) != meta.overrides:
        raise ModelError(f"{weights}: weights were built with {meta.overrides}, not {overrides}")
    return state, dict(meta.overrides), meta.num_classes, weights_hash(state)


def estimate_relation(
    model_name: str,
    weights: str | Path | None,
    proxy_spec: str,
    *,
    target_accuracy: float,
    batch_sizes: Sequence[int],
    seeds: Sequence[int] = tuple(run_default("relation-seeds")),
    lr_max: float = run_default("lr-max"),
    lr_rule: str = run_default("lr-rule"),
    max_samples: int = run_default("relation-max-samples"),
    eval_every_samples: int = run_default("eval-every-samples"),
    eval_max_samples: int | None = run_default("eval-max-samples"),
    min_evaluations: int = DEFAULT_MIN_EVALUATIONS,
    max_seeds: int | None = run_default("relation-max-seeds") or None,
    vector: str = run_default("relation-values"),
    seq_len: int | None = None,
    limit: int | None = None,
    data_seed: int = run_default("proxy-seed"),
    overrides: dict[str, Any] | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    parallel: bool = False,
    num_cpus: int | None = None,
    progress: bool = True,
    say: Say | None = None,
) -> RelationVector:
    """The relation vector of `model_name` from `weights` (None: a seeded fresh init) on `proxy_spec`;
    what is not given is the run config's default (`strategies.settings`), as the ServerApp estimates.

    The proxy dataset is split into train/test (training.data defaults, `data_seed`); each run trains
    on the train part with the rate `scaled_lr(lr_max, b, largest b, lr_rule)` and evaluates every
    `eval_every_samples` samples on the test part — again more often if it crossed within fewer than
    `min_evaluations` evaluations — and its samples to target is the interpolated crossing
    (`training.crossing`). With `max_seeds` (0 or None: none, as in the run config) above the number
    of `seeds`, further seeds (the next integers) are run one at a time until adding one leaves the
    ranking of batch sizes unchanged, or the budget is spent (`seeds_needed`, `ranking_stable` in the
    file). Returns the vector (also stored in the cache, `cache_dir` or $POWERFED_CACHE/relation or
    ~/.cache/powerfed/relation). `say` gets a line per finished run (what it measured, an estimate of
    the time left): long estimates show progress where no terminal shows a bar (a ServerApp's log).
    """
    bs, sd = _validate(target_accuracy, batch_sizes, seeds, lr_max, max_samples, lr_rule, vector, max_seeds)
    budget = max(len(sd), max_seeds or 0)
    spec = get_model_spec(model_name)
    state, overrides, num_classes, weights_id = _starting_weights(model_name, weights, overrides)
    if spec.task == "text" and seq_len is None:
        seq_len = int(overrides.get("seq_len", spec.input_shape[0]))
    request = RelationRequest(
        model=model_name,
        overrides=overrides,
        weights_sha256=weights_id,
        proxy_spec=proxy_spec,
        proxy_sha256=_spec_digest(proxy_spec),
        seq_len=seq_len if spec.task == "text" else None,
        limit=limit,
        data_seed=data_seed,
        target_accuracy=float(target_accuracy),
        batch_sizes=bs,
        seeds=sd,
        lr_max=float(lr_max),
        lr_rule=lr_rule,
        max_samples=int(max_samples),
        eval_every_samples=int(eval_every_samples),
        eval_max_samples=eval_max_samples,
        min_evaluations=int(min_evaluations),
        max_seeds=budget,
        vector=vector,
    )
    key = request.cache_key()
    cache_file = Path(cache_dir or default_cache_dir()) / f"relation-{key[:40]}.json"
    if use_cache and cache_file.is_file():
        try:
            cached = RelationVector.load(cache_file)
            if cached.extra.get("cache_key") == key:
                return cached
        except FileFormatError:
            pass  # a damaged cache entry is recomputed and overwritten

    dataset = load_dataset(proxy_spec, split="all", seq_len=seq_len or 64, limit=limit, seed=data_seed)
    if dataset.task != spec.task:
        raise DataError(f"model {model_name} is a {spec.task} model but {proxy_spec} is {dataset.task} data")
    train, test = train_test_split(dataset, seed=data_seed)
    if len(train) < bs[-1]:
        raise DataError(f"proxy train split has {len(train)} samples, fewer than batch size {bs[-1]}")
    if num_classes is not None and num_classes != dataset.num_classes:
        raise DataError(
            f"{weights}: weights have {num_classes} outputs, {proxy_spec} has {dataset.num_classes} classes"
        )
    if num_classes is None:
        num_classes = dataset.num_classes
        state = build_model(model_name, num_classes, seed=INIT_SEED, **overrides).state_dict()
    shared = {
        "state": state,
        "model_name": model_name,
        "num_classes": num_classes,
        "overrides": overrides,
        "train": train,
        "test": test,
    }
    common = {
        "target_accuracy": float(target_accuracy),
        "max_samples": int(max_samples),
        "eval_every_samples": int(eval_every_samples),
        "eval_max_samples": eval_max_samples,
        "min_evaluations": int(min_evaluations),
    }
    lrs = [scaled_lr(lr_max, b, bs[-1], lr_rule) for b in bs]

    def run_seeds(seed_list: Sequence[int]) -> list[dict[str, Any]]:
        jobs = [
            {"batch_size": b, "seed": s, "lr": lr, **common}
            for b, lr in zip(bs, lrs, strict=True)
            for s in seed_list
        ]
        finished = _RunProgress(say, len(jobs))
        if parallel and len(jobs) > 1:
            found = _run_parallel(jobs, shared, num_cpus, progress, finished)
        else:
            found = []
            for job in jobs:
                found.append(_run_job(**shared, **job, progress=progress, threads=None))
                finished(found[-1])
        _check_runs(found, proxy_spec, target_accuracy, max_samples)
        return found

    started = time.perf_counter()
    runs, used, stable = seeds_until_stable(bs, sd, budget, run_seeds)
    wall = time.perf_counter() - started

    per_seed = {
        b: [float(r["samples"]) for s in used for r in runs if r["batch_size"] == b and r["seed"] == s]
        for b in bs
    }
    relation = RelationVector.from_seeds(
        model_name,
        proxy_spec,
        float(target_accuracy),
        per_seed,
        vector=vector,
        seeds=used,
        seeds_needed=len(used),
        max_seeds=budget,
        ranking_stable=stable,
        lr_max=float(lr_max),
        lr=lrs,
        lr_rule=lr_rule,
        weights_sha256=weights_id,
        proxy_sha256=request.proxy_sha256,
        max_samples=int(max_samples),
        eval_every_samples=int(eval_every_samples),
        eval_max_samples=eval_max_samples,
        min_evaluations=int(min_evaluations),
        samples_rule="interpolated crossing, isotonic curve (training.crossing)",
        overrides=overrides,
        runs=runs,
        wall_seconds=wall,
        cache_key=key,
    )
    if use_cache:
        try:
            relation.save(cache_file)
        except OSError as exc:  # the cache is a convenience: an unwritable one must not lose the result
            log.warning("warning: relation cache not written (%s: %s)", cache_file, exc.strerror or exc)
    return relation


def seeds_until_stable(
    batch_sizes: Sequence[int],
    seeds: Sequence[int],
    max_seeds: int,
    run_seeds: Callable[[Sequence[int]], list[dict[str, Any]]],
) -> tuple[list[dict[str, Any]], list[int], bool | None]:
    """The stopping rule: run `seeds`, then one more seed at a time, up to `max_seeds` in all, until a
    seed leaves the batch sizes' `ranking` unchanged. Returns (every run, the seeds used, whether the
    ranking ended stable; None: no seed was added)."""
    runs = run_seeds(list(seeds))
    used = list(seeds)
    stable = None
    while len(used) < max_seeds:
        before = ranking(batch_sizes, runs)
        used.append(max(used) + 1)
        runs += run_seeds(used[-1:])
        stable = ranking(batch_sizes, runs) == before
        if stable:
            break
    return runs, used, stable


def ranking(batch_sizes: Sequence[int], runs: list[dict[str, Any]]) -> list[int]:
    """Batch sizes in order of mean samples to target over the runs so far (ties: the larger first)."""
    mean = {
        b: statistics.fmean(float(r["samples"]) for r in runs if r["batch_size"] == b) for b in batch_sizes
    }
    return sorted(batch_sizes, key=lambda b: (mean[b], -b))


def _check_runs(runs: list[dict[str, Any]], proxy: str, target: float, max_samples: int) -> None:
    """Every run must reach the target after > 0 samples, or the relation has no meaning."""
    already = [r for r in runs if r["reached"] and r["samples"] == 0]
    if already:
        acc = already[0]["initial_accuracy"]
        raise RelationError(
            f"the starting weights already reach target {target} on {proxy} before training "
            f"(accuracy {acc:.3f}); choose a higher target"
        )
    failed = [r for r in runs if not r["reached"]]
    if failed:
        which = ", ".join(
            f"{r['batch_size']} (seed {r['seed']}, best {r['best_accuracy']:.3f})" for r in failed
        )
        raise RelationError(
            f"batch size {which} did not reach target accuracy {target} within {max_samples} samples "
            f"on {proxy}; lower the target or raise the sample budget"
        )
