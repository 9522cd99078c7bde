"""Estimate the relation vector on proxy data (docs/design/method.md, docs/reference/files.md).

For every batch size (and seed), the SAME starting weights are fine-tuned on a proxy dataset of the
task until the target accuracy, with the learning rate scaled from the largest batch size by the run's
rule (`lr_rule`, the square-root rule by default). Samples to target is the interpolated crossing of
the target on a run evaluated densely enough that every batch size crosses after several evaluations
(`powerfed.training.crossing`). `samples_to_target[b]` is the mean over seeds (or the batch-efficiency model
fitted to them, `vector="fitted"`); `relation[b]` divides it by the largest batch size's; the file keeps
every seed's samples, their mean and spread beside it. Seeds can be added, one at a time up to
`max_seeds`, until the ranking of batch sizes by samples to target no longer changes (the file says
how many were needed). A batch size that cannot reach the target within the budget is an error (the
relation file needs a positive number for every batch size, and a made-up one would mislead the
selection): the message names it and says what to change.

Results are cached on disk, keyed by a hash of everything that determines them (model, weights,
proxy spec and proxy bytes, target, batch sizes, seeds, rates, budgets, code version, and what the
floats depend on: torch's version and intra-op thread count, the CPU). The torch device (`device`: auto,
cpu, cuda[:INDEX]) is not in the key: a GPU reaches the same samples to target up to floating-point
nondeterminism (the order of reductions), as a run with another thread count or on another CPU does,
which is why those are in the key (a vector made elsewhere was silently reused: issue 31). Runs can go
in parallel as Ray tasks, one CPU thread each (and a share of the GPU where the device is one).

The same estimator serves user code: a model factory or a name registered with
`powerfed.training.models.register_model`, proxy data as a torch Dataset, a DataLoader or tensors (x, y)
of any shape, a loss and a metric, the user's own training step (`make_step`, as a `PowerSession` takes
it) — or a `train_to_target(batch_size, lr, seed[, target])` callable for a user's own loop. The project
cannot version user code, so its results are cached only under a `cache_key` the user gives (and changes
with the code), together with the data's bytes and every setting above.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import json
import logging
import math
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fl_server.relation_data import ProxyData, file_digest, load_proxy, spec_digest
from fl_server.weights import load_weights, weights_hash
from powerctl.cache import CACHE_ENV, cache_dir
from powerctl.cliutil import MAX_SEED
from powerctl.devices.host import HostDevice
from powerctl.devices.torchdev import resolve_torch_device
from powerctl.errors import ArgumentError, FileFormatError, PowerctlError
from powerctl.mapping import FolderPath, Integer, Kind, Number, check_arguments
from powerctl.relation import VECTORS, RelationVector
from powerfed.training.crossing import DEFAULT_MIN_EVALUATIONS, run_dense
from powerfed.training.data import Dataset
from powerfed.training.errors import DataError, ModelError
from powerfed.training.finetune import (
    FineTuneCallbacks,
    FineTuneConfig,
    LossFn,
    MakeStep,
    MetricFn,
    UserFunctions,
    fine_tune,
)
from powerfed.training.lr import LR_RULES, scaled_lr
from powerfed.training.models import (
    ModelSpec,
    build_spec,
    check_input_shape,
    get_model_spec,
    model_fingerprint,
    model_spec,
)
from powerfed.training.numerics import numerics_key
from strategies.settings import run_default

log = logging.getLogger(__name__)
"""`fl_server.relation`: a relation cache that could not be written (WARNING)."""

__all__ = [
    "CACHE_ENV",
    "CACHE_VERSION",
    "ModelFactory",
    "RelationError",
    "RelationRequest",
    "TrainToTarget",
    "default_cache_dir",
    "estimate_relation",
    "file_digest",
]

ModelFactory = Callable[[], nn.Module]
"""A user's model: called with no argument (or `num_classes=` where it takes it), a fresh nn.Module."""
TrainToTarget = Callable[..., float | None]
"""A user's own loop: (batch_size, lr, seed[, target_accuracy]) → samples to the target, None when it was
not reached (a callable that takes a fourth argument is given the target)."""

CACHE_VERSION = 2
"""Bump when a code change alters what a relation estimate would be: old cache entries then miss."""
INIT_SEED = 0
"""Seed of the starting weights when no pre-trained weights are given (same for every run)."""


class RelationError(PowerctlError):
    """The relation vector cannot be estimated as asked (a batch size never reached the target, ...)."""


def default_cache_dir() -> Path:
    return cache_dir("relation")


class NotCached(RelationError):
    """`estimate_relation(compute=False)` found no cached vector for its settings."""


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
    threads: int = 1
    """torch's intra-op thread count the runs train with: another count sums in another order, and its
    samples to target differ in the last digits, enough to move a crossing by an evaluation."""
    user_key: str | None = None
    """The user's `cache_key` where user code is involved (None for the project's own models)."""
    model_entry: dict[str, Any] = field(default_factory=dict)
    """The registry entry's variant (its defaults, input shape and task): a name registered again with
    other defaults (`register_model(..., replace=True)`) is another model, estimated afresh."""

    def cache_key(self) -> str:
        fields = dict(self.__dict__)
        if self.user_key is None:
            del fields["user_key"]  # the project's own models: the keys they always had
        fields["batch_sizes"] = list(self.batch_sizes)
        fields["seeds"] = list(self.seeds)
        fields["cache_version"] = CACHE_VERSION
        fields.update(numerics_key(self.threads))
        blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=repr)
        return hashlib.sha256(blob.encode()).hexdigest()


_NUMBERS: dict[str, Kind] = {
    "target_accuracy": Number(0.0, 1.0, above=True),
    "lr_max": Number(0.0, 10.0, above=True),
    "max_samples": Integer(1),
    "eval_every_samples": Integer(1),
    "min_evaluations": Integer(1),
    "data_seed": Integer(0, MAX_SEED),
}
_OPTIONAL_COUNTS = ("eval_max_samples", "limit", "seq_len", "max_seeds", "num_cpus")


def _check_numbers(given: dict[str, Any]) -> dict[str, Any]:
    """`estimate_relation`'s numbers, each where the call is made: one ArgumentError line (a NaN budget,
    a string target, `limit=-1` would otherwise fail deep inside, or silently drop samples); then its
    overrides, callables and cache folder. Returns the numbers as plain ints and floats (numpy's
    converted: they go into the cache key and the vector's file), the seeds and batch sizes as lists."""
    where = "estimate_relation"
    checked = check_arguments(where, **{name: (given[name], kind) for name, kind in _NUMBERS.items()})
    for name in _OPTIONAL_COUNTS:
        kind = Integer(0 if name == "max_seeds" else 1)
        checked[name] = (
            None if given[name] is None else check_arguments(where, **{name: (given[name], kind)})[name]
        )
    for name, kind in (("seeds", Integer(0, MAX_SEED)), ("batch_sizes", Integer(1))):
        values = given[name]
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            what = "integers ≥ 0" if name == "seeds" else "integers ≥ 1"
            raise ArgumentError(f"{where}: {name!r} must be a list of {what}, got {values!r}")
        checked[name] = [check_arguments(where, **{name: (v, kind)})[name] for v in values]
    overrides = given["overrides"]
    if overrides is not None and not isinstance(overrides, dict):
        raise ArgumentError(
            f"estimate_relation: 'overrides' must be a dict of the model's options, got {overrides!r}"
        )
    for name in ("loss", "metric", "make_step", "train_to_target"):
        if given[name] is not None and not callable(given[name]):
            raise ArgumentError(f"estimate_relation: {name!r} must be callable, got {given[name]!r}")
    if given["cache_dir"] is not None:  # '' is the working directory, not the default cache (None)
        folder = FolderPath("a folder path (leave it out, or None, for the default cache)")
        check_arguments(where, cache_dir=(given["cache_dir"], folder))
    return checked


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
    spec: ModelSpec,
    num_classes: int,
    overrides: dict[str, Any],
    train: Dataset,
    test: Dataset,
    loss: LossFn | None,
    metric: MetricFn | None,
    make_step: MakeStep | None,
    batch_size: int,
    seed: int,
    lr: float,
    target_accuracy: float,
    max_samples: int,
    eval_every_samples: int,
    eval_max_samples: int | None,
    min_evaluations: int,
    progress: bool,
    threads: int,
    device: str = "cpu",
) -> dict[str, Any]:
    """One fine-tuning run from the shared starting weights, run again with denser evaluation if it
    crossed too early (`powerfed.training.crossing.run_dense`); a plain dict so it crosses Ray. The model
    comes from its registry entry itself (a Ray worker has not run the user's `register_model`) and
    trains on the torch `device` (batches, optimizer state and evaluation follow it: `fine_tune`)."""
    host = HostDevice(device, torch_device=device)
    config = FineTuneConfig(
        batch_size=batch_size,
        lr=lr,
        target_accuracy=target_accuracy,
        max_samples=max_samples,
        eval_every_samples=eval_every_samples,
        eval_max_samples=eval_max_samples,
        seed=seed,
    )
    callbacks = FineTuneCallbacks(progress=progress, desc=f"b={batch_size} seed={seed}")
    user = UserFunctions(loss=loss, metric=metric, make_step=make_step)

    def run(every: int) -> Any:
        model = build_spec(spec, num_classes, **overrides)
        model.load_state_dict(state)
        return fine_tune(
            model.to(host.torch_device()),
            train,
            test,
            replace(config, eval_every_samples=every),
            device=host,
            callbacks=callbacks,
            user=user,
        )

    with _torch_threads(threads):
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


@contextlib.contextmanager
def _torch_threads(threads: int) -> Any:
    """torch's intra-op thread count `threads` for the block, the caller's put back after (a run one at
    a time must not leave the caller's process with another count)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _takes_four(fn: Callable[..., Any]) -> bool:
    """Whether `fn` can be called with four positional arguments (then it is given the target)."""
    try:
        inspect.signature(fn).bind(0, 0.0, 0, 0.5)
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): the documented three
        return False
    return True


def _run_user_job(
    train_to_target: TrainToTarget,
    batch_size: int,
    seed: int,
    lr: float,
    threads: int,
    target_accuracy: float,
    **_: Any,
) -> dict[str, Any]:
    """One run of the user's own loop; its answer checked, as a run record like `_run_job`'s (the
    device is the user's loop's own business)."""
    started = time.perf_counter()
    args: tuple[Any, ...] = (batch_size, lr, seed)
    if _takes_four(train_to_target):
        args = (*args, target_accuracy)
    with _torch_threads(threads):
        samples = train_to_target(*args)
    ok = samples is None or (
        isinstance(samples, (int, float)) and not isinstance(samples, bool) and not math.isnan(samples)
    )
    if not ok or (samples is not None and samples < 0):
        raise RelationError(
            f"train_to_target({batch_size}, {lr:g}, {seed}) returned {samples!r}: it must return the "
            "samples it trained until the target (a number ≥ 0), or None when it missed the target"
        )
    reached = samples is not None and math.isfinite(samples)
    return {
        "batch_size": batch_size,
        "seed": seed,
        "lr": lr,
        "reached": reached,
        "samples": float(samples) if reached else math.inf,
        "wall_seconds": time.perf_counter() - started,
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


def _picklable(shared: dict[str, Any]) -> bool:
    """Whether what every run needs can cross to a Ray worker (a lambda in a user's script can; a
    local object holding a lock or an open file cannot)."""
    from ray import cloudpickle

    try:
        cloudpickle.dumps({k: v for k, v in shared.items() if not isinstance(v, (Dataset, dict))})
    except Exception as exc:  # what cannot be pickled fails in many ways
        log.warning("relation runs one at a time: the model or callables cannot go to Ray workers (%s)", exc)
        return False
    return True


def _run_parallel(
    fn: Callable[..., dict[str, Any]],
    jobs: list[dict[str, Any]],
    shared: dict[str, Any],
    num_cpus: int | None,
    progress: bool,
    finished: Callable[[dict[str, Any]], None],
) -> list:
    """Each job a Ray task with one torch thread; Ray is started locally (and stopped) if needed. Jobs
    on a GPU (`device` cuda:...) ask Ray for an equal share of one GPU each, as many as run at once,
    and train on the GPU Ray gives them (their cuda:0: Ray sets CUDA_VISIBLE_DEVICES)."""
    import ray

    started_here = not ray.is_initialized()
    cpus = num_cpus or min(len(jobs), os.cpu_count() or 1)
    if started_here:
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # CPU tasks: leave CUDA env alone
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        gpu = str(jobs[0].get("device", "cpu")).startswith("cuda")
        options = {"num_cpus": 1, **({"num_gpus": gpu_share(cpus, len(jobs))} if gpu else {})}
        if gpu:
            _check_ray_gpus()
            jobs = [{**job, "device": "cuda:0"} for job in jobs]
        remote = ray.remote(**options)(fn)
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
            if (module := _MISSING_MODULE.search(str(exc))) is not None:
                raise PowerctlError(
                    f"estimate_relation: a Ray worker cannot import module {module[1]!r}, which the model or "
                    "a callable given comes from: put it on the workers' path (PYTHONPATH, or installed in "
                    "the venv; a folder added to sys.path here or a script's __main__ is not), or pass "
                    "parallel=False"
                ) from None
            raise
    finally:
        if started_here:
            ray.shutdown()


_MISSING_MODULE = re.compile(r"No module named '([^']+)'")
"""What a Ray worker says when it cannot unpickle an object from a module only the driver can import."""


def gpu_share(cpus: int, jobs: int) -> float:
    """The share of one GPU each Ray task asks for: as many tasks as run at once (one per CPU, at most
    one per job) fit on one GPU together, rounded down to Ray's resolution (1/10000)."""
    return math.floor(10_000 / max(1, min(cpus, jobs))) / 10_000


def _check_ray_gpus() -> None:
    """A task asking for a GPU that Ray does not have waits forever: one line instead."""
    import ray

    if not ray.cluster_resources().get("GPU", 0):
        raise RelationError(
            "the relation runs train on a GPU but Ray sees none (it counts CUDA_VISIBLE_DEVICES' GPUs); "
            "run without --parallel, or start Ray with --num-gpus"
        )


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


def _model_entry(model: str | ModelFactory | ModelSpec) -> ModelSpec | None:
    """The registry entry of a name, an entry as given, or None for a factory (wrapped once the data
    says its input shape)."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return get_model_spec(model)
    if not callable(model):
        raise ModelError(
            f"model must be a registered name or a factory returning an nn.Module, got {type(model).__name__}"
        )
    return None


def _factory_name(factory: Callable[..., Any]) -> str:
    """The relation file's model name for an unregistered factory: its own name (a lambda has none)."""
    name = getattr(factory, "__name__", None) or type(factory).__name__
    return name if name != "<lambda>" else "user-model"


def _probe(
    spec: ModelSpec,
    state: dict[str, torch.Tensor],
    num_classes: int,
    overrides: dict[str, Any],
    train: Dataset,
    loss: LossFn | None,
    proxy: str,
    device: str = "cpu",
) -> dict[str, Any]:
    """One forward and loss on two proxy samples, on the runs' torch device, before any run: a model
    and data that do not fit together are one line, not a traceback from inside a Ray task. Returns
    the model's fingerprint (`model_fingerprint`), which the vector records."""
    from powerfed.training.models import loss_fn

    model = build_spec(spec, num_classes, **overrides)
    model.load_state_dict(state)
    model = model.to(device)
    try:
        with torch.no_grad():
            model.eval()
            x, y = train.x[:2].to(device), train.y[:2].to(device)
            float((loss or loss_fn(spec.task))(model(x), y))
    except Exception as exc:  # the user's model, loss or data: any error means they do not fit
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(
            f"model {spec.name!r} cannot train on {proxy} (inputs {tuple(train.x.shape[1:])}, targets "
            f"{tuple(train.y.shape[1:]) or 'one per sample'}): {first}"
        ) from None
    return model_fingerprint(model)


def estimate_relation(
    model: str | ModelFactory | ModelSpec,
    weights: str | Path | None = None,
    proxy: ProxyData = None,
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
    loss: LossFn | None = None,
    metric: MetricFn | None = None,
    make_step: MakeStep | None = None,
    train_to_target: TrainToTarget | None = None,
    cache_key: str | None = None,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    compute: bool = True,
    parallel: bool = False,
    num_cpus: int | None = None,
    device: str = "auto",
    progress: bool = True,
    say: Say | None = None,
) -> RelationVector:
    """The relation vector of `model` from `weights` (None: a seeded fresh init) on `proxy`; what is not
    given is the run config's default (`strategies.settings`), as the ServerApp estimates.

    `model` is a registered name (`powerfed.training.models.register_model`: the seven built-ins and the
    user's), or a factory returning an nn.Module (given `num_classes=` where it takes it). `proxy` is a
    dataset spec (`powerfed.training.data.load_dataset`), a torch Dataset, a DataLoader (its dataset) or
    tensors (x, y) of any sample shape and channel count. `loss(outputs, targets)` and `metric(outputs,
    targets)` replace the task's cross entropy and top-1 accuracy. `make_step(model)` → `step(x, y)`
    replaces the training step (the one a `PowerSession` takes: the user's optimizer, loss, proximal
    term), so that the vector is the user's optimizer's; the crossing, seeds, stopping rule, cache and
    Ray are the project's, and `lr_max`/`lr_rule` are the step's business (its own rate). Instead of all
    these, a user whose loop is their own gives `train_to_target(batch_size, lr, seed[, target])` →
    samples to the target (None: not reached), given the target where it takes a fourth argument;
    `model` then only names the file's model and `proxy` (optional) its data, whose bytes the key holds.

    The proxy dataset is split into train/test (powerfed.training.data defaults, `data_seed`); each run trains
    on the train part with the rate `scaled_lr(lr_max, b, largest b, lr_rule)` and evaluates every
    `eval_every_samples` samples on the test part — again more often if it crossed within fewer than
    `min_evaluations` evaluations — and its samples to target is the interpolated crossing
    (`powerfed.training.crossing`). With `max_seeds` (0 or None: none, as in the run config) above the number
    of `seeds`, further seeds (the next integers) are run one at a time until adding one leaves the
    ranking of batch sizes unchanged, or the budget is spent (`seeds_needed`, `ranking_stable` in the
    file). Returns the vector (also stored in the cache, `cache_dir` or $POWERFED_CACHE/relation or
    ~/.cache/powerfed/relation). User code (a model not built into the project, a loss, a metric or
    `train_to_target`) is cached only with a `cache_key`, which must change when that code does; the key
    also holds the data's bytes and every setting. With `compute=False` nothing trains: the cached vector,
    else `NotCached` (a look-up that costs reading the weights and the proxy data). `parallel` runs go to
    Ray where the model and callables can be pickled, else one at a time (logged). `say` gets a line per
    finished run (what it measured, an estimate of the time left): long estimates show progress where no
    terminal shows a bar (a ServerApp's log). `device` (auto, cpu, cuda[:INDEX];
    `powerctl.devices.torchdev`) is where the runs train; it is not in the cache key, torch's intra-op
    thread count the runs use is (1 per Ray task with `parallel`, else this process's).
    """
    n = _check_numbers(locals())  # plain ints and floats from here on (numpy's converted)
    target_accuracy, lr_max, data_seed, seeds = n["target_accuracy"], n["lr_max"], n["data_seed"], n["seeds"]
    max_samples, min_evaluations, batch_sizes = n["max_samples"], n["min_evaluations"], n["batch_sizes"]
    eval_every_samples, eval_max_samples = n["eval_every_samples"], n["eval_max_samples"]
    limit, seq_len, max_seeds, num_cpus = n["limit"], n["seq_len"], n["max_seeds"], n["num_cpus"]
    bs, sd = _validate(target_accuracy, batch_sizes, seeds, lr_max, max_samples, lr_rule, vector, max_seeds)
    if cache_key is not None and (not isinstance(cache_key, str) or not cache_key.strip()):
        raise RelationError(f"cache_key must be a non-empty string naming the user code, got {cache_key!r}")
    budget = max(len(sd), max_seeds or 0)
    lrs = [scaled_lr(lr_max, b, bs[-1], lr_rule) for b in bs]
    threads = 1 if parallel else torch.get_num_threads()
    if train_to_target is not None:
        return _estimate_own_loop(
            model, weights, proxy, train_to_target, bs, sd, lrs, budget, locals(), cache_dir, use_cache
        )
    if proxy is None:
        raise RelationError("proxy data is needed: a dataset spec, a torch Dataset, a DataLoader or (x, y)")
    spec = _model_entry(model)
    if spec is None and weights is not None:
        raise ModelError(
            "weights files name their model: register the factory with register_model and give its name"
        )
    user_code = not (spec is not None and spec.builtin) or any(
        f is not None for f in (loss, metric, make_step)
    )
    if spec is not None:
        state, overrides, num_classes, weights_id = _starting_weights(spec.name, weights, overrides)
        if spec.task == "text" and seq_len is None:
            seq_len = int(overrides.get("seq_len", spec.input_shape[0]))
    else:
        state, overrides, num_classes, weights_id = None, dict(overrides or {}), None, f"init:{INIT_SEED}"
    task = spec.task if spec is not None else None
    torch_device = resolve_torch_device(device)  # a GPU that is not here: one line before the data is read
    request_for = functools.partial(
        RelationRequest,
        overrides=overrides,
        weights_sha256=weights_id,
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
        threads=threads,
        user_key=cache_key if user_code else None,
    )
    data = None
    if spec is not None and isinstance(proxy, str):  # a spec's digest is its file's: looked up unread
        label, digest = proxy, spec_digest(proxy)
    else:
        data = load_proxy(proxy, task=task, seq_len=seq_len or 64, limit=limit, seed=data_seed)
        if spec is None:
            shape = data.whole.x.shape[1:]
            spec = model_spec(_factory_name(model), model, task=data.whole.task, input_shape=shape)
        label, digest = data.label, data.sha256
    text_len = seq_len if spec.task == "text" else None
    entry = {"defaults": dict(spec.defaults), "input_shape": list(spec.input_shape), "task": spec.task}
    request = request_for(
        model=spec.name, proxy_spec=label, proxy_sha256=digest, seq_len=text_len, model_entry=entry
    )
    cache_file = _cache_file(request, cache_dir, use_cache, user_code)
    if cache_file is not None and (cached := _cached(cache_file, request.cache_key())) is not None:
        return cached
    if not compute:
        raise NotCached(f"no cached relation vector of {spec.name} for these settings")
    if data is None:
        data = load_proxy(proxy, task=task, seq_len=seq_len or 64, limit=limit, seed=data_seed)
    dataset, train, test = data.whole, data.train, data.test

    if dataset.task != spec.task:
        raise DataError(f"model {spec.name} is a {spec.task} model but {data.label} is {dataset.task} data")
    check_input_shape(spec, tuple(dataset.x.shape[1:]), data.label)
    if len(train) < bs[-1]:
        raise DataError(f"proxy train split has {len(train)} samples, fewer than batch size {bs[-1]}")
    if num_classes is not None and num_classes != dataset.num_classes:
        raise DataError(
            f"{weights}: weights have {num_classes} outputs, {data.label} has {dataset.num_classes} classes"
        )
    if num_classes is None:
        num_classes = dataset.num_classes
        state = build_spec(spec, num_classes, seed=INIT_SEED, **overrides).state_dict()
    fingerprint = _probe(spec, state, num_classes, overrides, train, loss, data.label, torch_device)
    shared = {
        "state": state,
        "spec": spec,
        "num_classes": num_classes,
        "overrides": overrides,
        "train": train,
        "test": test,
        "loss": loss,
        "metric": metric,
        "make_step": make_step,
    }
    common = {
        "target_accuracy": float(target_accuracy),
        "max_samples": int(max_samples),
        "eval_every_samples": int(eval_every_samples),
        "eval_max_samples": eval_max_samples,
        "min_evaluations": int(min_evaluations),
        "device": torch_device,
    }
    run_seeds = _seed_runner(_run_job, shared, common, bs, lrs, data.label, locals())
    return _finish(
        request,
        run_seeds,
        cache_file,
        lrs=lrs,
        samples_rule="interpolated crossing, isotonic curve (powerfed.training.crossing)",
        overrides=overrides,
        model_fingerprint=fingerprint,
        **({"training_step": "the user's make_step"} if make_step is not None else {}),
    )


def _estimate_own_loop(
    model: Any,
    weights: Any,
    proxy: Any,
    train_to_target: TrainToTarget,
    bs: tuple[int, ...],
    sd: tuple[int, ...],
    lrs: list[float],
    budget: int,
    given: dict[str, Any],
    cache_dir: str | Path | None,
    use_cache: bool,
) -> RelationVector:
    """`estimate_relation` with the user's own loop: the seeds, the stopping rule, the cache and Ray
    as for the project's loop; the crossing is the user's."""
    if weights is not None:
        raise RelationError("train_to_target starts from the user's own weights: give weights=None")
    if not callable(train_to_target):
        raise RelationError(
            f"train_to_target must be callable (batch_size, lr, seed), got {train_to_target!r}"
        )
    name = model if isinstance(model, str) else (model.name if isinstance(model, ModelSpec) else None)
    name = name or (_factory_name(model) if callable(model) else "user-model")
    label = proxy if isinstance(proxy, str) else (type(proxy).__name__ if proxy is not None else "user data")
    request = RelationRequest(
        model=name,
        overrides={},
        weights_sha256="user",
        proxy_spec=label,
        proxy_sha256=_given_data_digest(proxy),
        seq_len=None,
        limit=None,
        data_seed=0,
        target_accuracy=float(given["target_accuracy"]),
        batch_sizes=bs,
        seeds=sd,
        lr_max=float(given["lr_max"]),
        lr_rule=given["lr_rule"],
        max_samples=0,
        eval_every_samples=0,
        eval_max_samples=None,
        min_evaluations=0,
        max_seeds=budget,
        vector=given["vector"],
        threads=given["threads"],
        user_key=given["cache_key"] or "",
    )
    cache_file = _cache_file(request, cache_dir, use_cache, True)
    if cache_file is not None and (cached := _cached(cache_file, request.cache_key())) is not None:
        return cached
    if not given["compute"]:
        raise NotCached(f"no cached relation vector of {name} for these settings")
    shared = {"train_to_target": train_to_target}
    common = {"target_accuracy": float(given["target_accuracy"])}
    run_seeds = _seed_runner(_run_user_job, shared, common, bs, lrs, label, {**given, "max_samples": 0})
    return _finish(
        request,
        run_seeds,
        cache_file,
        lrs=lrs,
        samples_rule="the user's train_to_target",
        overrides={},
    )


def _given_data_digest(proxy: Any) -> str | None:
    """The digest of the data a user's own loop names (`proxy`), so that its cache key holds the data's
    bytes: a spec's file, or the tensors of a Dataset, DataLoader or (x, y); None when none is given."""
    if proxy is None:
        return None
    if isinstance(proxy, str):
        return spec_digest(proxy) or proxy
    return load_proxy(proxy, task=None, seq_len=64, limit=None, seed=0).sha256


def _cache_file(
    request: RelationRequest, cache_dir: str | Path | None, use_cache: bool, user_code: bool
) -> Path | None:
    """Where this estimate is cached; None when it is not (asked not to, or user code without a
    `cache_key`: the project cannot tell when that code changes)."""
    if not use_cache:
        return None
    if user_code and not request.user_key:
        log.info("relation vector of %s not cached: user code needs a cache_key to be cached", request.model)
        return None
    return Path(cache_dir or default_cache_dir()) / f"relation-{request.cache_key()[:40]}.json"


def _cached(cache_file: Path, key: str) -> RelationVector | None:
    if cache_file.is_file():
        try:
            cached = RelationVector.load(cache_file)
            if cached.extra.get("cache_key") == key:
                return cached
        except FileFormatError:
            pass  # a damaged cache entry is recomputed and overwritten
    return None


def _seed_runner(
    fn: Callable[..., dict[str, Any]],
    shared: dict[str, Any],
    common: dict[str, Any],
    bs: tuple[int, ...],
    lrs: list[float],
    label: str,
    given: dict[str, Any],
) -> Callable[[Sequence[int]], list[dict[str, Any]]]:
    """run_seeds for `seeds_until_stable`: every batch size × seed, on Ray or one after another."""
    parallel, progress, threads = given["parallel"], given["progress"], given["threads"]

    def run_seeds(seed_list: Sequence[int]) -> list[dict[str, Any]]:
        jobs = [
            {"batch_size": b, "seed": s, "lr": lr, **common}
            for b, lr in zip(bs, lrs, strict=True)
            for s in seed_list
        ]
        finished = _RunProgress(given["say"], len(jobs))
        if parallel and len(jobs) > 1 and _picklable(shared):
            found = _run_parallel(fn, jobs, shared, given["num_cpus"], progress, finished)
        else:
            found = []
            for job in jobs:
                found.append(fn(**shared, **job, progress=progress, threads=threads))
                finished(found[-1])
        _check_runs(found, label, given["target_accuracy"], given["max_samples"])
        return found

    return run_seeds


def _finish(
    request: RelationRequest,
    run_seeds: Callable[[Sequence[int]], list[dict[str, Any]]],
    cache_file: Path | None,
    **extra: Any,
) -> RelationVector:
    """The request's seeds run until the ranking is stable (`seeds_until_stable`), then the vector and
    its evidence, written to the cache (where there is one): one ending for every kind of run."""
    bs = request.batch_sizes
    started = time.perf_counter()
    runs, used, stable = seeds_until_stable(bs, request.seeds, request.max_seeds, run_seeds)
    wall = time.perf_counter() - started
    per_seed = {
        b: [float(r["samples"]) for s in used for r in runs if r["batch_size"] == b and r["seed"] == s]
        for b in bs
    }
    relation = RelationVector.from_seeds(
        request.model,
        request.proxy_spec,
        request.target_accuracy,
        per_seed,
        vector=request.vector,
        seeds=used,
        seeds_needed=len(used),
        max_seeds=request.max_seeds,
        ranking_stable=stable,
        lr_max=request.lr_max,
        lr=extra.pop("lrs"),
        lr_rule=request.lr_rule,
        weights_sha256=request.weights_sha256,
        proxy_sha256=request.proxy_sha256,
        max_samples=request.max_samples,
        eval_every_samples=request.eval_every_samples,
        eval_max_samples=request.eval_max_samples,
        min_evaluations=request.min_evaluations,
        **extra,
        runs=runs,
        wall_seconds=wall,
        cache_key=request.cache_key(),
    )
    if cache_file is not None:
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
        acc = already[0].get("initial_accuracy")
        where = f" (accuracy {acc:.3f})" if acc is not None else ""
        raise RelationError(
            f"the starting weights already reach target {target} on {proxy} before training{where}; "
            "choose a higher target"
        )
    failed = [r for r in runs if not r["reached"]]
    if failed:
        which = ", ".join(
            f"{r['batch_size']} (seed {r['seed']}"
            + (f", best {r['best_accuracy']:.3f})" if "best_accuracy" in r else ")")
            for r in failed
        )
        budget = f" within {max_samples} samples" if max_samples else ""
        raise RelationError(
            f"batch size {which} did not reach target accuracy {target}{budget} "
            f"on {proxy}; lower the target or raise the sample budget"
        )
