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
which is why those are in the key (else a vector made elsewhere would be reused silently). Runs can go
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
import hashlib
import json
import logging
import math
import os
import re
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fl_server.relation_data import ProxyData, file_digest, load_proxy, spec_digest
from fl_server.weights import load_weights, weights_hash
from powerctl.devices.base import Device
from powerctl.devices.host import HostDevice
from powerctl.devices.torchdev import resolve_torch_device
from powerctl.errors import ArgumentError, FileFormatError, PowerctlError
from powerctl.files.cache import CACHE_ENV, cache_dir
from powerctl.files.mapping import (
    MAX_SEED,
    Flag,
    FolderPath,
    Integer,
    Kind,
    Maybe,
    Number,
    Text,
    accepts,
    check_arguments,
    check_fields,
)
from powerctl.progress import progress_bar
from powerctl.records.relation import VECTORS, RelationVector
from powerctl.records.workload import Workload
from powerfed.training.crossing import DEFAULT_MIN_EVALUATIONS, run_dense
from powerfed.training.data import Dataset
from powerfed.training.errors import DataError, ModelError
from powerfed.training.evaluation import eval_subset
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import (
    FineTuneCallbacks,
    FineTuneConfig,
    FineTuneResult,
    TrainToTarget,
    UserFunctions,
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
from powerfed.training.trace import StepTrace
from strategies.settings import run_default

log = logging.getLogger(__name__)
"""`fl_server.relation`: a relation cache that could not be written (WARNING)."""

__all__ = [
    "CACHE_ENV",
    "CACHE_VERSION",
    "ModelFactory",
    "RelationError",
    "ProxyRuns",
    "RelationCompute",
    "RelationRequest",
    "RelationSettings",
    "TrainToTarget",
    "default_cache_dir",
    "estimate_relation",
    "file_digest",
    "run_to_target",
]

ModelFactory = Callable[[], nn.Module]
"""A user's model: called with no argument (or `num_classes=` where it takes it), a fresh nn.Module."""

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


WHERE = "estimate_relation"
"""What every refusal of an estimate's arguments names: the call the user made."""
Say = Callable[[str], None]


def _integers(name: str, values: Any, kind: Kind, what: str) -> list[int]:
    """A list of integers, each checked: one ArgumentError line naming the argument."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ArgumentError(f"{WHERE}: {name!r} must be a list of {what}, got {values!r}")
    return [check_arguments(WHERE, **{name: (v, kind)})[name] for v in values]


def _optional_count(name: str, value: Any, least: int = 1) -> int | None:
    return None if value is None else check_arguments(WHERE, **{name: (value, Integer(least))})[name]


_SETTING_NUMBERS: dict[str, Kind] = {
    "lr_max": Number(0.0, 10.0, above=True),
    "max_samples": Integer(1),
    "eval_every_samples": Integer(1),
    "min_evaluations": Integer(1),
    "data_seed": Integer(0, MAX_SEED),
}


@dataclass(frozen=True)
class RelationSettings:
    """What a relation estimate is, beside its model, weights, proxy, target and batch sizes: how the
    proxy runs run. The defaults are the run config's (`strategies.settings`), as the ServerApp
    estimates. Checked when made, before any data is read: one ArgumentError line naming
    estimate_relation and the setting (a NaN budget or `limit=-1` would otherwise fail deep inside, or
    silently drop samples); numpy's numbers become plain ones (they go into the cache key and the file)."""

    seeds: Sequence[int] = tuple(run_default("relation-seeds"))
    """The runs' seeds per batch size (the vector is their mean); kept as a tuple."""
    lr_max: float = run_default("lr-max")
    """The rate at the largest batch size; the others' by `lr_rule` (`powerfed.training.lr.scaled_lr`)."""
    lr_rule: str = run_default("lr-rule")
    max_samples: int = run_default("relation-max-samples")
    """One run's budget: a batch size that misses the target within it is an error."""
    eval_every_samples: int = run_default("eval-every-samples")
    eval_max_samples: int | None = run_default("eval-max-samples")
    min_evaluations: int = DEFAULT_MIN_EVALUATIONS
    """Evaluations before the crossing; a run that crossed sooner runs again, denser (`run_dense`)."""
    max_seeds: int | None = run_default("relation-max-seeds") or None
    """Further seeds, one at a time up to this many in all, until the ranking is stable (0, None: none)."""
    vector: str = run_default("relation-values")
    """raw (the means) or fitted (the batch-efficiency model; `powerctl.records.relation.VECTORS`)."""
    seq_len: int | None = None
    """A text model's sequence length (None: the model's)."""
    limit: int | None = None
    """Proxy samples to use at most (None: all)."""
    data_seed: int = run_default("proxy-seed")
    """Seed of the proxy's train/test split, the same for every run."""
    overrides: dict[str, Any] | None = None
    """The model's options; with weights, those they were built with."""

    def __post_init__(self) -> None:
        checked = check_arguments(WHERE, **{n: (getattr(self, n), k) for n, k in _SETTING_NUMBERS.items()})
        for name in ("eval_max_samples", "limit", "seq_len"):
            checked[name] = _optional_count(name, getattr(self, name))
        checked["max_seeds"] = _optional_count("max_seeds", self.max_seeds, least=0)
        seeds = tuple(_integers("seeds", self.seeds, Integer(0, MAX_SEED), "integers ≥ 0"))
        if self.overrides is not None and not isinstance(self.overrides, dict):
            raise ArgumentError(
                f"{WHERE}: 'overrides' must be a dict of the model's options, got {self.overrides!r}"
            )
        if not seeds or len(set(seeds)) != len(seeds):
            raise RelationError(f"seeds must be a non-empty list of distinct integers, got {list(seeds)}")
        if self.lr_rule not in LR_RULES:
            raise RelationError(
                f"unknown learning-rate rule {self.lr_rule!r}; use one of {', '.join(LR_RULES)}"
            )
        if self.vector not in VECTORS:
            raise RelationError(f"unknown relation vector {self.vector!r}; use one of {', '.join(VECTORS)}")
        if checked["max_seeds"] and checked["max_seeds"] < len(seeds):
            raise RelationError(
                f"max_seeds ({checked['max_seeds']}) is fewer than the {len(seeds)} seeds given"
            )
        for name, value in {**checked, "seeds": seeds}.items():
            object.__setattr__(self, name, value)


_COMPUTE_KINDS: dict[str, Kind] = {
    "use_cache": Flag(),
    "compute": Flag(),
    "parallel": Flag(),
    "num_cpus": Maybe(Integer(1)),
    "device": Text(what="a torch device: auto, cpu or cuda[:INDEX]"),
    "progress": Flag(),
}


@dataclass(frozen=True)
class RelationCompute:
    """Where a relation estimate is cached and how it is computed and shown: nothing here changes the
    vector (the thread count that `parallel` implies is in the cache key). Checked when made, as
    `RelationSettings` is."""

    cache_key: str | None = None
    """Names the version of the user's code (a model not built into the project, a loss, a metric, a
    step or a loop): only then is such an estimate cached, and it must change when that code does."""
    cache_dir: str | Path | None = None
    """The cache's folder (None: $POWERFED_CACHE/relation or $XDG_CACHE_HOME/powerfed/relation)."""
    use_cache: bool = True
    compute: bool = True
    """False: nothing trains; the cached vector, else `NotCached`."""
    parallel: bool = False
    """The runs as Ray tasks with one torch thread each, where the model and callables can be pickled
    (else one at a time, logged)."""
    num_cpus: int | None = None
    """CPUs of the Ray started here (None: one per run, at most this machine's)."""
    device: str = "auto"
    """Where the runs train (auto, cpu, cuda[:INDEX]; `powerctl.devices.torchdev`); not in the key."""
    progress: bool = True
    """A bar on stderr where it is a terminal."""
    say: Say | None = None
    """Hears a line per finished run (what it measured, the time left): progress where no terminal
    shows a bar (a ServerApp's log)."""

    def __post_init__(self) -> None:
        check_fields(self, WHERE, _COMPUTE_KINDS)  # a flag is a bool: compute="no" must not train
        if self.cache_dir is not None:  # '' is the working directory, not the default cache (None)
            folder = FolderPath("a folder path (leave it out, or None, for the default cache)")
            check_arguments(WHERE, cache_dir=(self.cache_dir, folder))
        key = self.cache_key
        if key is not None and (not isinstance(key, str) or not key.strip()):
            raise RelationError(f"cache_key must be a non-empty string naming the user code, got {key!r}")


@dataclass(frozen=True)
class _Estimate:
    """One call's arguments, checked: what every step of the estimate reads."""

    target_accuracy: float
    batch_sizes: tuple[int, ...]
    """Sorted: the largest last (the vector's denominator)."""
    settings: RelationSettings
    user: UserFunctions
    how: RelationCompute
    threads: int
    """torch's intra-op threads per run: 1 per Ray task, else this process's (in the cache key)."""

    @property
    def budget(self) -> int:
        """Seeds at most: those given, or `max_seeds` where it is more."""
        return max(len(self.settings.seeds), self.settings.max_seeds or 0)

    @property
    def lrs(self) -> list[float]:
        s, largest = self.settings, self.batch_sizes[-1]
        return [scaled_lr(s.lr_max, b, largest, s.lr_rule) for b in self.batch_sizes]

    @property
    def user_code(self) -> bool:
        """Whether the user's functions take part (then the cache needs a `cache_key`)."""
        u = self.user
        return any(f is not None for f in (u.loss, u.metric, u.make_step, u.train_to_target))

    def request(self, **what: Any) -> RelationRequest:
        """The cache's request: these settings, and `what` names the model, weights and data."""
        s = self.settings
        own = {"limit": s.limit, "data_seed": s.data_seed, "max_samples": s.max_samples}
        runs = {"eval_every_samples": s.eval_every_samples, "eval_max_samples": s.eval_max_samples}
        return RelationRequest(
            **{**own, **runs, "min_evaluations": s.min_evaluations, **what},
            target_accuracy=self.target_accuracy,
            batch_sizes=self.batch_sizes,
            seeds=tuple(s.seeds),
            lr_max=s.lr_max,
            lr_rule=s.lr_rule,
            max_seeds=self.budget,
            vector=s.vector,
            threads=self.threads,
        )

    def jobs(self, seeds: Sequence[int]) -> list[FineTuneConfig]:
        """Every batch size × seed, each with its scaled rate."""
        s = self.settings
        return [
            FineTuneConfig(
                batch_size=b,
                lr=lr,
                target_accuracy=self.target_accuracy,
                max_samples=s.max_samples,
                eval_every_samples=s.eval_every_samples,
                eval_max_samples=s.eval_max_samples,
                seed=seed,
            )
            for b, lr in zip(self.batch_sizes, self.lrs, strict=True)
            for seed in seeds
        ]


def _estimate(
    target_accuracy: Any,
    batch_sizes: Any,
    settings: RelationSettings | None,
    user: UserFunctions | None,
    how: RelationCompute | None,
) -> _Estimate:
    """`estimate_relation`'s arguments, each refused where the call is made, in one line."""
    for name, value, kind in (
        ("settings", settings, RelationSettings),
        ("user", user, UserFunctions),
        ("how", how, RelationCompute),
    ):
        if value is not None and not isinstance(value, kind):
            raise ArgumentError(f"{WHERE}: {name!r} must be a {kind.__name__} or None, got {value!r}")
    target = check_arguments(WHERE, target_accuracy=(target_accuracy, Number(0.0, 1.0, above=True)))
    sizes = tuple(_integers("batch_sizes", batch_sizes, Integer(1), "integers ≥ 1"))
    if not sizes:
        raise RelationError(f"batch sizes must be positive integers, got {list(sizes)}")
    if len(set(sizes)) != len(sizes):
        raise RelationError(f"batch sizes must be distinct, got {list(sizes)}")
    user = user or UserFunctions()  # a UserFunctions checks its functions where it is made
    how = how or RelationCompute()
    return _Estimate(
        target_accuracy=target["target_accuracy"],
        batch_sizes=tuple(sorted(sizes)),
        settings=settings or RelationSettings(),
        user=user,
        how=how,
        threads=1 if how.parallel else torch.get_num_threads(),
    )


@dataclass(frozen=True)
class ProxyRuns:
    """What every run of one estimate shares: the model and its starting weights, the train/test split,
    how densely a crossing is read, the user's functions, where it trains. The paper tables' runs
    (bench/paper_tables.py) are this too, so that the product and the tables cannot drift apart."""

    spec: ModelSpec
    """The model's registry entry (a Ray worker has not run the user's `register_model`)."""
    num_classes: int
    state: dict[str, torch.Tensor]
    """The starting weights, the same for every run."""
    train: Dataset
    test: Dataset
    overrides: dict[str, Any] = field(default_factory=dict)
    min_evaluations: int = DEFAULT_MIN_EVALUATIONS
    """A run that crossed within fewer evaluations runs again, denser (`run_dense`)."""
    user: UserFunctions = field(default_factory=UserFunctions)
    device: str = "cpu"
    """The torch device the runs train on (batches, optimizer state and evaluation follow it)."""
    workload: Workload | None = None
    """What the device charges per step (None: measured from the model, `fine_tune`'s default)."""


def run_to_target(
    runs: ProxyRuns, config: FineTuneConfig, *, host: Device | None = None, progress: bool = False
) -> tuple[FineTuneResult, float | None, int | None]:
    """One fine-tuning run from the shared starting weights (`config`: batch size, rate, seed, target,
    budget), run again with denser evaluation if it crossed too early
    (`powerfed.training.crossing.run_dense`); with no target, one run for the budget. Returns (the
    run, its interpolated crossing or None, the evaluation interval it used). `host`: the device that
    runs the steps (default: this host on `runs.device`)."""
    host = host or HostDevice(runs.device, torch_device=runs.device)
    callbacks = FineTuneCallbacks(progress=progress, desc=f"b={config.batch_size} seed={config.seed}")
    traced: list[tuple[StepTrace, FineTuneResult]] = []  # the last trained run, with its weights per step
    traceable = (
        runs.user.make_step is None
        and config.max_device_seconds is None
        and config.target_accuracy is not None
        and config.eval_every_samples is not None
    )

    def run(every: int | None) -> FineTuneResult:
        model = build_spec(runs.spec, runs.num_classes, **runs.overrides)
        model.load_state_dict(runs.state)
        model = model.to(host.torch_device())
        trace = StepTrace(model) if traceable else None
        result = fine_tune(
            model,
            runs.train,
            runs.test,
            replace(config, eval_every_samples=every),
            device=host,
            workload=runs.workload,
            callbacks=callbacks if trace is None else replace(callbacks, hooks=(trace,)),
            user=runs.user,
        )
        traced[:] = [] if trace is None else [(trace, result)]
        return result

    def replay(every: int) -> FineTuneResult | None:
        """The run again, evaluated every `every` samples, read from the last trained run's weights."""
        if not traced:
            return None
        trace, first = traced[0]
        x, y = eval_subset(runs.test, config.eval_max_samples)
        dev = host.torch_device()
        budget = config.sample_budget(len(runs.train))
        return trace.replay(
            first, every, eval_x=x.to(dev), eval_y=y.to(dev), task=runs.train.task, max_samples=budget,
            metric=runs.user.metric,
        )  # fmt: skip

    every = config.eval_every_samples
    if config.target_accuracy is None or every is None:
        return run(every), None, every
    return run_dense(
        run,
        batch_size=config.batch_size,
        eval_every_samples=every,
        target=config.target_accuracy,
        replay=replay,
        min_evaluations=runs.min_evaluations,
    )


def _run_job(runs: ProxyRuns, config: FineTuneConfig, progress: bool, threads: int) -> dict[str, Any]:
    """One run to the target with `threads` torch threads, as a plain dict so that it crosses Ray."""
    with _torch_threads(threads):
        result, crossing, every = run_to_target(runs, config, progress=progress)
    return {
        "batch_size": config.batch_size,
        "seed": config.seed,
        "lr": config.lr,
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


def _run_user_job(
    train_to_target: TrainToTarget, config: FineTuneConfig, progress: bool, threads: int
) -> dict[str, Any]:
    """One run of the user's own loop; its answer checked, as a run record like `_run_job`'s (the
    device is the user's loop's own business)."""
    batch_size, lr, seed, target_accuracy = config.batch_size, config.lr, config.seed, config.target_accuracy
    started = time.perf_counter()
    args: tuple[Any, ...] = (batch_size, lr, seed)
    if accepts(train_to_target, 4) is True:  # then it is given the target (unreadable: the three)
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
        "samples": float(samples) if reached and samples is not None else math.inf,
        "wall_seconds": time.perf_counter() - started,
    }


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


def _picklable(shared: ProxyRuns | TrainToTarget) -> bool:
    """Whether what every run needs can cross to a Ray worker (a lambda in a user's script can; a
    local object holding a lock or an open file cannot); the data and weights always can."""
    from ray import cloudpickle

    try:
        cloudpickle.dumps((shared.spec, shared.user) if isinstance(shared, ProxyRuns) else shared)
    except Exception as exc:  # what cannot be pickled fails in many ways
        log.warning("relation runs one at a time: the model or callables cannot go to Ray workers (%s)", exc)
        return False
    return True


def _run_parallel(
    fn: Callable[..., dict[str, Any]],
    jobs: list[FineTuneConfig],
    shared: ProxyRuns | TrainToTarget,
    how: RelationCompute,
    finished: Callable[[dict[str, Any]], None],
) -> list[dict[str, Any]]:
    """Each job a Ray task with one torch thread; Ray is started locally (and stopped) if needed. Jobs
    on a GPU (`ProxyRuns.device` cuda:...) ask Ray for an equal share of one GPU each, as many as run at once,
    and train on the GPU Ray gives them (their cuda:0: Ray sets CUDA_VISIBLE_DEVICES)."""
    import ray

    started_here = not ray.is_initialized()
    cpus = how.num_cpus or min(len(jobs), os.cpu_count() or 1)
    if started_here:
        os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # CPU tasks: leave CUDA env alone
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        gpu = isinstance(shared, ProxyRuns) and str(shared.device).startswith("cuda")
        options: dict[str, Any] = {"num_cpus": 1, **({"num_gpus": gpu_share(cpus, len(jobs))} if gpu else {})}
        if gpu:
            assert isinstance(shared, ProxyRuns)  # `gpu` says so
            _check_ray_gpus()
            shared = replace(shared, device="cuda:0")
        remote = ray.remote(**options)(fn)
        ref = ray.put(shared)
        futures = [remote.remote(ref, job, False, 1) for job in jobs]
        with progress_bar(how.progress, len(futures), "relation runs", "run") as bar:
            pending = list(futures)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                bar.update(len(done))
                for one in done:
                    with contextlib.suppress(ray.exceptions.RayTaskError):  # raised below, as one line
                        finished(ray.get(one))
        try:
            return ray.get(futures)
        except ray.exceptions.RayTaskError as exc:  # a user error inside a task stays a one-line error
            if isinstance(exc.cause, PowerctlError):
                raise exc.cause from None
            if (module := _MISSING_MODULE.search(str(exc))) is not None:
                raise PowerctlError(
                    f"estimate_relation: a Ray worker cannot import module {module[1]!r}, which the model or "
                    "a callable given comes from: put it on the workers' path (PYTHONPATH, or installed in "
                    "the venv; a folder added to sys.path here or a script's __main__ is not), or give "
                    "how=RelationCompute(parallel=False)"
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


def _probe(runs: ProxyRuns, proxy: str) -> dict[str, Any]:
    """One forward and loss on two proxy samples, on the runs' torch device, before any run: a model
    and data that do not fit together are one line, not a traceback from inside a Ray task. Returns
    the model's fingerprint (`model_fingerprint`), which the vector records."""
    from powerfed.training.tasks import loss_fn

    spec, train, device = runs.spec, runs.train, runs.device
    model = build_spec(spec, runs.num_classes, **runs.overrides)
    model.load_state_dict(runs.state)
    model = model.to(device)
    try:
        with torch.no_grad():
            model.eval()
            x, y = train.x[:2].to(device), train.y[:2].to(device)
            float((runs.user.loss or loss_fn(spec.task))(model(x), y))
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
    settings: RelationSettings | None = None,
    user: UserFunctions | None = None,
    how: RelationCompute | None = None,
) -> RelationVector:
    """The relation vector of `model` from `weights` (None: a seeded fresh init) on `proxy`, at
    `target_accuracy` for `batch_sizes`; `settings` (`RelationSettings`; None: the run config's
    defaults, as the ServerApp estimates) say how the proxy runs run.

    `model` is a registered name (`powerfed.training.models.register_model`: the seven built-ins and the
    user's), or a factory returning an nn.Module (given `num_classes=` where it takes it). `proxy` is a
    dataset spec (`powerfed.training.data.load_dataset`), a torch Dataset, a DataLoader (its dataset) or
    tensors (x, y) of any sample shape and channel count. `user` (`UserFunctions`): `loss(outputs,
    targets)` and `metric(outputs, targets)` replace the task's cross entropy and top-1 accuracy;
    `make_step(model)` → `step(x, y)` replaces the training step (the one a `PowerSession` takes), so
    that the vector is the user's optimizer's (`lr_max`/`lr_rule` are then the step's business); the
    crossing, seeds, stopping rule, cache and Ray stay the project's. Instead of all these, a user whose
    loop is their own gives `train_to_target(batch_size, lr, seed[, target])` → samples to the target
    (None: not reached); `model` then only names the file's model and `proxy` (optional) its data.

    Each run trains on the proxy's train split (`data_seed`) at `scaled_lr(lr_max, b, largest b,
    lr_rule)` and evaluates every `eval_every_samples` samples — again more often if it crossed within
    fewer than `min_evaluations` evaluations — and its samples to target is the interpolated crossing
    (`powerfed.training.crossing`). With `max_seeds` above the number of `seeds`, further seeds are run
    one at a time until the ranking of batch sizes stays the same (`seeds_needed`, `ranking_stable` in
    the file). `how` (`RelationCompute`) says where the vector is cached and how it is computed: user
    code is cached only under its `cache_key`; `compute=False` trains nothing (the cached vector, else
    `NotCached`); `parallel` runs go to Ray; `device` is where the runs train, not in the cache key
    (torch's thread count is); `say` hears a line per finished run.
    """
    est = _estimate(target_accuracy, batch_sizes, settings, user, how)
    if est.user.train_to_target is not None:
        return _estimate_own_loop(model, weights, proxy, est)
    start = _locate(model, weights, proxy, est)
    spec = start.spec
    request = est.request(
        model=spec.name,
        overrides=start.overrides,
        weights_sha256=start.weights_id,
        proxy_spec=start.label,
        proxy_sha256=start.digest,
        seq_len=start.seq_len if spec.task == "text" else None,
        user_key=est.how.cache_key if start.user_code else None,
        model_entry={
            "defaults": dict(spec.defaults),
            "input_shape": list(spec.input_shape),
            "task": spec.task,
        },
    )
    cache_file = _cache_file(request, est.how.cache_dir, est.how.use_cache, start.user_code)
    if cache_file is not None and (cached := _cached(cache_file, request.cache_key())) is not None:
        return cached
    if not est.how.compute:
        raise NotCached(f"no cached relation vector of {spec.name} for these settings")
    runs, label = _proxy_runs(start, proxy, est)
    fingerprint = _probe(runs, label)
    return _finish(
        request,
        _seed_runner(_run_job, runs, est, label),
        cache_file,
        lrs=est.lrs,
        samples_rule="interpolated crossing, isotonic curve (powerfed.training.crossing)",
        overrides=start.overrides,
        model_fingerprint=fingerprint,
        **({"training_step": "the user's make_step"} if est.user.make_step is not None else {}),
    )


@dataclass
class _Start:
    """Where an estimate starts, found before any training: the model's entry, its starting weights
    (None: a seeded init, made once the data gives the classes), the proxy's label and digest (its
    data read only where a spec's file cannot say it)."""

    spec: ModelSpec
    state: dict[str, torch.Tensor] | None
    overrides: dict[str, Any]
    num_classes: int | None
    weights: str | Path | None
    weights_id: str
    seq_len: int | None
    device: str
    user_code: bool
    label: str = ""
    digest: str | None = None
    data: Any = None


def _locate(model: str | ModelFactory | ModelSpec, weights: Any, proxy: ProxyData, est: _Estimate) -> _Start:
    """The model's entry and starting weights, and the proxy's digest: what the cache key needs."""
    if proxy is None:
        raise RelationError("proxy data is needed: a dataset spec, a torch Dataset, a DataLoader or (x, y)")
    spec = _model_entry(model)
    if spec is None and weights is not None:
        raise ModelError(
            "weights files name their model: register the factory with register_model and give its name"
        )
    s, seq_len = est.settings, est.settings.seq_len
    user_code = not (spec is not None and spec.builtin) or est.user_code
    if spec is not None:
        state, overrides, num_classes, weights_id = _starting_weights(spec.name, weights, s.overrides)
        if spec.task == "text" and seq_len is None:
            seq_len = int(overrides.get("seq_len", spec.input_shape[0]))
    else:
        state, overrides, num_classes, weights_id = None, dict(s.overrides or {}), None, f"init:{INIT_SEED}"
    device = resolve_torch_device(est.how.device)  # a GPU that is not here: one line before the data is read
    if spec is not None and isinstance(proxy, str):  # a spec's digest is its file's: looked up unread
        data, label, digest = None, proxy, spec_digest(proxy)
    else:
        task = spec.task if spec is not None else None
        data = load_proxy(proxy, task=task, seq_len=seq_len or 64, limit=s.limit, seed=s.data_seed)
        if spec is None:
            assert callable(model)  # `_model_entry` is None for a factory only
            shape = data.whole.x.shape[1:]
            spec = model_spec(_factory_name(model), model, task=data.whole.task, input_shape=shape)
        label, digest = data.label, data.sha256
    return _Start(
        spec,
        state,
        overrides,
        num_classes,
        weights,
        weights_id,
        seq_len,
        device,
        user_code,
        label,
        digest,
        data,
    )


def _proxy_runs(start: _Start, proxy: ProxyData, est: _Estimate) -> tuple[ProxyRuns, str]:
    """The runs' shared part, the proxy read where it was not yet, and checked against the model: a
    model and data that do not fit are one line before any run. Returns it and the data's label."""
    s, spec, bs = est.settings, start.spec, est.batch_sizes
    data = start.data or load_proxy(
        proxy, task=spec.task, seq_len=start.seq_len or 64, limit=s.limit, seed=s.data_seed
    )
    dataset, train, test = data.whole, data.train, data.test
    if dataset.task != spec.task:
        raise DataError(f"model {spec.name} is a {spec.task} model but {data.label} is {dataset.task} data")
    check_input_shape(spec, tuple(dataset.x.shape[1:]), data.label)
    if len(train) < bs[-1]:
        raise DataError(f"proxy train split has {len(train)} samples, fewer than batch size {bs[-1]}")
    num_classes, state = start.num_classes, start.state
    if num_classes is not None and num_classes != dataset.num_classes:
        raise DataError(
            f"{start.weights}: weights have {num_classes} outputs, "
            f"{data.label} has {dataset.num_classes} classes"
        )
    if num_classes is None:
        num_classes = dataset.num_classes
        state = build_spec(spec, num_classes, seed=INIT_SEED, **start.overrides).state_dict()
    assert state is not None  # weights come with their number of classes; without, built above
    runs = ProxyRuns(
        spec=spec,
        num_classes=num_classes,
        state=state,
        train=train,
        test=test,
        overrides=start.overrides,
        min_evaluations=s.min_evaluations,
        user=est.user,
        device=start.device,
    )
    return runs, data.label


def _estimate_own_loop(model: Any, weights: Any, proxy: Any, est: _Estimate) -> RelationVector:
    """`estimate_relation` with the user's own loop: the seeds, the stopping rule, the cache and Ray
    as for the project's loop; the crossing is the user's."""
    if weights is not None:
        raise RelationError("train_to_target starts from the user's own weights: give weights=None")
    name = model if isinstance(model, str) else (model.name if isinstance(model, ModelSpec) else None)
    name = name or (_factory_name(model) if callable(model) else "user-model")
    label = proxy if isinstance(proxy, str) else (type(proxy).__name__ if proxy is not None else "user data")
    request = est.request(
        model=name,
        overrides={},
        weights_sha256="user",
        proxy_spec=label,
        proxy_sha256=_given_data_digest(proxy),
        seq_len=None,
        limit=None,
        data_seed=0,
        max_samples=0,
        eval_every_samples=0,
        eval_max_samples=None,
        min_evaluations=0,
        user_key=est.how.cache_key or "",
    )
    cache_file = _cache_file(request, est.how.cache_dir, est.how.use_cache, True)
    if cache_file is not None and (cached := _cached(cache_file, request.cache_key())) is not None:
        return cached
    if not est.how.compute:
        raise NotCached(f"no cached relation vector of {name} for these settings")
    assert est.user.train_to_target is not None  # `estimate_relation` comes here only with one
    return _finish(
        request,
        _seed_runner(_run_user_job, est.user.train_to_target, est, label),
        cache_file,
        lrs=est.lrs,
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
    fn: Callable[[Any, FineTuneConfig, bool, int], dict[str, Any]],
    shared: ProxyRuns | TrainToTarget,
    est: _Estimate,
    label: str,
) -> Callable[[Sequence[int]], list[dict[str, Any]]]:
    """run_seeds for `seeds_until_stable`: every batch size × seed, on Ray or one after another; `fn`
    runs one (`_run_job` with the shared `ProxyRuns`, `_run_user_job` with the user's loop)."""
    how = est.how
    budget = est.settings.max_samples if isinstance(shared, ProxyRuns) else 0  # a user's loop: its own

    def run_seeds(seed_list: Sequence[int]) -> list[dict[str, Any]]:
        jobs = est.jobs(seed_list)
        finished = _RunProgress(how.say, len(jobs))
        if how.parallel and len(jobs) > 1 and _picklable(shared):
            found = _run_parallel(fn, jobs, shared, how, finished)
        else:
            found = []
            for job in jobs:
                found.append(fn(shared, job, how.progress, est.threads))
                finished(found[-1])
        _check_runs(found, label, est.target_accuracy, budget)
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
    per_seed: dict[int, Sequence[float]] = {
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
