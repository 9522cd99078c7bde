"""The relation estimate: the request, the cache, the runs until the ranking is stable, the vector stored."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache, partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fl_server.relation.cache import lookup, store
from fl_server.relation.parallel import seed_runner
from fl_server.relation.request import (
    NotCached,
    RelationCompute,
    RelationError,
    RelationRequest,
    RelationSettings,
    check_record,
)
from fl_server.relation.runs import INIT_SEED, Start, make_proxy_runs, probe, run_job, run_user_job
from fl_server.relation_data import ProxyData, load_proxy, spec_digest
from fl_server.weights import load_weights, weights_hash
from powerctl.devices.torchdev import resolve_torch_device
from powerctl.records.relation import RelationVector
from powerfed.training.errors import ModelError
from powerfed.training.finetune_records import UserFunctions
from powerfed.training.models import ModelSpec, get_model_spec, model_spec

ModelFactory = Callable[[], nn.Module]
"""A user's model: called with no argument (or `num_classes=` where it takes it), a fresh nn.Module."""


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
    `target_accuracy` for `batch_sizes`; `settings` (None: the run config's defaults, as the ServerApp
    estimates) say how the proxy runs run, `how` where it is cached and how it is computed.

    `model`: a registered name or a factory; `proxy`: a dataset spec, a torch Dataset, a DataLoader or
    tensors (x, y); `user`: the user's loss, metric, step or whole loop, cached only under
    `how.cache_key` (docs/howto/bring-your-own.md).
    """
    check_record("settings", settings, RelationSettings)
    check_record("user", user, UserFunctions)
    how = check_record("how", how, RelationCompute) or RelationCompute()
    request = RelationRequest(
        target_accuracy=target_accuracy,
        batch_sizes=batch_sizes,
        settings=settings or RelationSettings(),
        threads=1 if how.parallel else torch.get_num_threads(),
    )
    user = user or UserFunctions()  # a UserFunctions checks its functions where it is made
    loop, start = user.train_to_target, None
    if loop is not None:  # the user's own loop: the seeds, the stopping rule, the cache and Ray as ours
        request, user_code = _own_loop(model, weights, proxy, replace(request, own_loop=True), how), True
    else:
        request, start, user_code = _locate(model, weights, proxy, request, user, how)
    path, cached = lookup(request, how, user_code)
    if cached is not None:
        return cached
    if not how.compute:
        raise NotCached(f"no cached relation vector of {request.model} for these settings")
    extra: dict[str, Any] = {}
    if start is None:
        assert loop is not None  # no start: the user's own loop
        run_seeds, rule = seed_runner(run_user_job, loop, request, how), "the user's train_to_target"
    else:
        runs = make_proxy_runs(start, request, user)
        extra["model_fingerprint"] = probe(runs, request.proxy_spec)
        if user.make_step is not None:
            extra["training_step"] = "the user's make_step"
        run_seeds = seed_runner(run_job, runs, request, how)
        rule = "interpolated crossing, isotonic curve (powerfed.training.crossing)"
    bs, s = request.batch_sizes, request.settings
    started = time.perf_counter()
    found, used, stable = seeds_until_stable(bs, s.seeds, request.max_seeds, run_seeds)
    wall = time.perf_counter() - started
    per_seed: dict[int, Sequence[float]] = {
        b: [float(r["samples"]) for s in used for r in found if r["batch_size"] == b and r["seed"] == s]
        for b in bs
    }
    relation = RelationVector.from_seeds(
        request.model,
        request.proxy_spec,
        request.target_accuracy,
        per_seed,
        vector=s.vector,
        seeds=used,
        seeds_needed=len(used),
        max_seeds=request.max_seeds,
        ranking_stable=stable,
        lr_max=s.lr_max,
        lr=request.lrs,
        lr_rule=s.lr_rule,
        weights_sha256=request.weights_sha256,
        proxy_sha256=request.proxy_sha256,
        **{k: v for k, v in request.runs_key().items() if k not in ("limit", "data_seed")},
        samples_rule=rule,
        overrides=request.overrides,
        **extra,
        runs=found,
        wall_s=wall,
        cache_key=request.cache_key(),
    )
    store(relation, path)
    return relation


def _locate(
    model: str | ModelFactory | ModelSpec,
    weights: Any,
    proxy: ProxyData,
    request: RelationRequest,
    user: UserFunctions,
    how: RelationCompute,
) -> tuple[RelationRequest, Start, bool]:
    """The request completed with what the cache key needs (the model's entry and starting weights, the
    proxy's digest), where the runs start, and whether user code takes part."""
    if proxy is None:
        raise RelationError("proxy data is needed: a dataset spec, a torch Dataset, a DataLoader or (x, y)")
    spec = _model_entry(model)
    if spec is None and weights is not None:
        raise ModelError(
            "weights files name their model: register the factory with register_model and give its name"
        )
    s, seq_len = request.settings, request.settings.seq_len
    functions = (user.loss, user.metric, user.make_step, user.train_to_target)
    user_code = not (spec is not None and spec.builtin) or any(f is not None for f in functions)
    state, overrides, num_classes, weights_id = _starting_weights(spec, weights, s.overrides)
    if spec is not None and spec.task == "text" and seq_len is None:
        seq_len = int(overrides.get("seq_len", spec.input_shape[0]))
    device = resolve_torch_device(how.device)  # a GPU that is not here: one line before the data is read
    task = spec.task if spec is not None else None  # read once, here or by the runs (`make_proxy_runs`)
    read = cache(
        partial(load_proxy, proxy, task=task, seq_len=seq_len or 64, limit=s.limit, seed=s.data_seed)
    )
    if spec is not None and isinstance(proxy, str):  # a spec's digest is its file's: looked up unread
        label, digest = proxy, spec_digest(proxy)
    else:
        data = read()
        if spec is None:
            assert callable(model)  # `_model_entry` is None for a factory only
            shape = data.whole.x.shape[1:]
            spec = model_spec(_factory_name(model), model, task=data.whole.task, input_shape=shape)
        label, digest = data.label, data.sha256
    request = replace(
        request,
        model=spec.name,
        overrides=overrides,
        weights_sha256=weights_id,
        proxy_spec=label,
        proxy_sha256=digest,
        seq_len=seq_len if spec.task == "text" else None,
        user_key=how.cache_key if user_code else None,
        model_entry={
            "defaults": dict(spec.defaults),
            "input_shape": list(spec.input_shape),
            "task": spec.task,
        },
    )
    return request, Start(spec, state, num_classes, weights, device, read), user_code


def _own_loop(
    model: Any, weights: Any, proxy: Any, request: RelationRequest, how: RelationCompute
) -> RelationRequest:
    """The request of an estimate by the user's own loop: its model's name and data's digest."""
    if weights is not None:
        raise RelationError("train_to_target starts from the user's own weights: give weights=None")
    name = model if isinstance(model, str) else (model.name if isinstance(model, ModelSpec) else None)
    name = name or (_factory_name(model) if callable(model) else "user-model")
    label = proxy if isinstance(proxy, str) else (type(proxy).__name__ if proxy is not None else "user data")
    digest: str | None = None  # the data's bytes in the key: a spec's file, or the tensors given
    if isinstance(proxy, str):
        digest = spec_digest(proxy) or proxy
    elif proxy is not None:
        digest = load_proxy(proxy, task=None, seq_len=64, limit=None, seed=0).sha256
    return replace(
        request,
        model=name,
        weights_sha256="user",
        proxy_spec=label,
        proxy_sha256=digest,
        user_key=how.cache_key or "",
    )


def seeds_until_stable(
    batch_sizes: Sequence[int],
    seeds: Sequence[int],
    max_seeds: int,
    run_seeds: Callable[[Sequence[int]], list[dict[str, Any]]],
) -> tuple[list[dict[str, Any]], list[int], bool | None]:
    """Run `seeds`, then one more seed at a time, up to `max_seeds` in all, until a seed leaves the
    `ranking` unchanged. Returns (every run, the seeds used, whether it ended stable; None: none added)."""
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


def _starting_weights(
    spec: ModelSpec | None, weights: str | Path | None, overrides: dict[str, Any] | None
) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any], int | None, str]:
    """(state or None, overrides, num_classes or None, weights id) without touching the data yet."""
    if weights is None or spec is None:  # a factory has no weights file (refused before)
        return None, dict(overrides or {}), None, f"init:{INIT_SEED}"
    state, meta = load_weights(weights)
    if meta.model != (model_name := spec.name):
        raise ModelError(f"{weights}: weights are for model {meta.model!r}, not {model_name!r}")
    if overrides and dict(overrides) != meta.overrides:
        raise ModelError(f"{weights}: weights were built with {meta.overrides}, not {overrides}")
    return state, dict(meta.overrides), meta.num_classes, weights_hash(state)


def _model_entry(model: str | ModelFactory | ModelSpec) -> ModelSpec | None:
    """The registry entry of a name, an entry as given, or None for a factory."""
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
