"""One round on one node: profile (or reuse) → select (b, f) under the cap → pin → fine-tune → restore.

This is the client side of the method (DESIGN §2), kept free of Flower messages so it can be tested
and reused directly; `fl_client.app` only translates messages to and from these calls. The device is
opened for the round and closed on every way out (`Device.__exit__` restores, and `Device.pinned`
restores on exceptions, SIGINT and SIGTERM too), so nothing stays pinned after a round.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import re
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fl_client.methods import Choice, choose
from fl_client.node import NodeSettings
from fl_client.profile_cache import ProfileKey, cached_profile
from powerctl.boards import board_model
from powerctl.cache import cache_dir
from powerctl.capsource import CapSource, ConstantCap
from powerctl.devices import open_device
from powerctl.devices.base import Device
from powerctl.devices.simulated import SimulatedBoard, predicted_profile, replay_cost, step_cost
from powerctl.errors import PowerctlError
from powerctl.follow import CapFollower, Chooser, Pick
from powerctl.guard import PowerGuard
from powerctl.profile_table import Profile
from powerctl.profiler import profile_device
from powerctl.relation import RelationVector
from powerctl.selection import best_frequency_per_batch, check_power_cap, select
from powerctl.workload import Workload
from strategies.protocol import ORACLE, OURS, ClientReport, Plan, TrainInstructions
from training.checkpoint import Checkpointing
from training.errors import DataError, ModelError
from training.finetune import FineTuneResult, evaluate_with_loss, fine_tune
from training.models import build_model, get_model_spec, model_workload

if TYPE_CHECKING:
    from training.data import Dataset

State = dict[str, torch.Tensor]


class ClientWorkError(PowerctlError):
    """This round cannot run on this node as instructed (no usable batch size, no knob, ...)."""


def build_local_model(model_name: str, num_classes: int, overrides: dict, state: State) -> nn.Module:
    """The network the server described, with the server's weights; a mismatch is one ModelError line."""
    model = build_model(model_name, num_classes, **overrides)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise ModelError(f"the weights received do not fit model {model_name!r} ({first})") from None
    return model


def model_seq_len(model_name: str, overrides: dict) -> int:
    """The window length text data is cut into (64 for images, which ignore it)."""
    spec = get_model_spec(model_name)
    return int(overrides.get("seq_len", spec.input_shape[0])) if spec.task == "text" else 64


def _check_data(instr: TrainInstructions, train: Dataset) -> None:
    task = get_model_spec(instr.model).task
    if train.task != task:
        raise DataError(f"model {instr.model} is a {task} model but this node's data is {train.task} data")
    if train.num_classes > instr.num_classes:
        raise DataError(
            f"this node's data has {train.num_classes} classes, the model {instr.num_classes} outputs"
        )


def usable_relation(instr: TrainInstructions, train_examples: int) -> RelationVector:
    """The relation restricted to batch sizes this node's train split can fill at least once."""
    relation = instr.relation()
    keep = {b: s for b, s in relation.samples_map().items() if b <= train_examples}
    if not keep:
        raise ClientWorkError(
            f"this node has {train_examples} training samples, fewer than the smallest batch size "
            f"{min(relation.batch_sizes)} of the relation vector; give it more data or smaller batch sizes"
        )
    return RelationVector.from_samples(relation.model, relation.proxy_dataset, relation.target_accuracy, keep)


@lru_cache(maxsize=16)
def _predicted(
    board: str, model: str, overrides: str, num_classes: int, batch_sizes: tuple[int, ...], samples: int
) -> Profile:
    """A simulated board's model profile, one per board × model × settings in this process (scale mode:
    a thousand boards of two kinds cost two profiles)."""
    net = build_model(model, num_classes, seed=0, **json.loads(overrides))
    return predicted_profile(board, model_workload(model, net, num_classes), batch_sizes, samples)


def _profile(
    dev: Device,
    model: nn.Module,
    instr: TrainInstructions,
    batch_sizes: list[int],
    cap: float | None,
    cache: Path | None = None,
    relation_map: dict[int, float] | None = None,
) -> tuple[Profile, bool]:
    """The device's profile for this model: predicted from a simulated board's model when the run asks
    for it, else from the cache or measured now (and cached); a device without a knob or a sensor is
    refused by the profiler with one line."""
    from training.profiling import profiling_step_factory

    if instr.profile_source == "predicted":
        if not isinstance(dev, SimulatedBoard):
            raise ClientWorkError(f"predicted profiles need a simulated board (sim:...), not {dev.spec}")
        overrides = json.dumps(instr.model_overrides, sort_keys=True)
        bs = tuple(batch_sizes)
        return _predicted(
            dev.board, instr.model, overrides, instr.num_classes, bs, instr.profile_samples
        ), True

    # the efficient order stops at a cap (none: the grid); the fitted order predicts and confirms the
    # choice for this cap and relation vector, with or without a cap
    order = instr.profile_order if cap is not None or instr.profile_order == "fitted" else "grid"
    order_cap = cap if order in ("efficient", "fitted") else None
    relation = relation_map if order == "fitted" else None
    spec = get_model_spec(instr.model)
    shape = (model_seq_len(instr.model, instr.model_overrides),) if spec.task == "text" else spec.input_shape
    key = ProfileKey(
        device_kind=f"{type(dev).__name__}/{dev.board}",
        model=instr.model,
        overrides=json.dumps(instr.model_overrides, sort_keys=True),
        num_classes=instr.num_classes,
        input_shape=tuple(shape),
        batch_sizes=tuple(batch_sizes),
        order=order,
        power_cap_w=order_cap,
        relation=None if relation is None else json.dumps(sorted(relation.items())),
        samples=instr.profile_samples,
        warmup_steps=instr.profile_warmup,
        measure_steps=instr.profile_steps,
    )

    def measure() -> Profile:
        # profiling trains: a copy, so the round starts from exactly the server's weights
        workload, make_step = profiling_step_factory(
            instr.model,
            model=copy.deepcopy(model),
            num_classes=instr.num_classes,
            torch_device=dev.torch_device(),
            seed=instr.seed,
        )
        return profile_device(
            dev,
            workload,
            make_step,
            batch_sizes=batch_sizes,
            samples=instr.profile_samples,
            order=order,
            power_cap_w=order_cap,
            relation=relation,
            warmup_steps=instr.profile_warmup,
            measure_steps=instr.profile_steps,
            progress=False,
        )

    return cached_profile(key, measure, cache)


def _fine_tune_at(
    settings: NodeSettings,
    instr: TrainInstructions,
    state: State,
    data: tuple[Dataset, Dataset],
    batch_size: int,
    frequency_hz: int,
    cap: float | None,
    device_seed: int,
    on_step: Callable[[int, int], None] | None = None,
    follow: Following | None = None,
) -> tuple[FineTuneResult, nn.Module, str, dict[str, Any]]:
    """Fine-tune the server's weights at a pinned (b, f) on a fresh device handle: a simulated board's
    noise then does not depend on what ran before, so a seeded run repeats exactly. Checkpointed
    (`round_checkpoint`): the same work killed and sent again resumes.

    With `follow` (a cap that changes) the pair is the method's pick for the cap at each moment
    (`powerctl.follow`): the board starts at its lowest frequency, the follower pins the first pick
    (or pauses). The last item is what the guard or the follower did, as ClientReport fields."""
    model = build_local_model(instr.model, instr.num_classes, instr.model_overrides, state)
    train, test = data
    with open_device(settings.device, seed=device_seed) as dev:
        model = model.to(dev.torch_device())
        follower = None
        with dev.pinned(dev.frequencies()[0] if follow is not None else frequency_hz):
            if follow is not None:
                follower = CapFollower(
                    dev,
                    follow.caps,
                    follow.choose,
                    samples_to_target=follow.samples_to_target,
                    poll_s=instr.cap_poll_s,
                    pause_timeout_s=instr.cap_pause_timeout_s,
                    guard_window=instr.guard_window,
                    guard_tolerance=instr.guard_tolerance,
                )
                first = follower.start()
                batch_size, frequency_hz = first.batch_size, first.frequency_hz
            guard = (
                PowerGuard(dev, cap, frequency_hz, window=instr.guard_window, tolerance=instr.guard_tolerance)
                if cap is not None and dev.has_power_sensor and follower is None
                else None
            )
            result = fine_tune(
                model,
                train,
                test,
                device=dev,
                batch_size=batch_size,
                lr=instr.lr_for,
                target_accuracy=instr.target_accuracy,
                max_samples=instr.budget_samples or None,
                max_device_seconds=instr.budget_device_seconds or None,
                eval_every_samples=instr.eval_every_samples,
                eval_max_samples=instr.eval_max_samples,
                seed=instr.seed,
                progress=False,
                checkpoint=round_checkpoint(settings, instr, batch_size, frequency_hz),
                hooks=[h for h in (guard, follower) if h is not None],
                on_step=on_step,
            )
        board = dev.board
    control: dict[str, Any] = {}
    if guard is not None:
        control["step_downs"] = [e.to_dict() for e in guard.step_downs]
    if follower is not None:
        result.extra.update(
            cap_source=follow.caps.describe(),  # type: ignore[union-attr]
            final_pair=[follower.batch_size, follower.frequency_hz],
        )
        control.update(
            step_downs=[e.to_dict() for e in follower.step_downs],
            cap_events=[e.to_dict() for e in follower.events],
            paused_seconds=follower.paused_s,
            over_cap_seconds=follower.over_cap_s,
        )
    return result, model, board, control


@dataclass(frozen=True)
class Following:
    """A cap that changes during the fine-tune, and the method's rule to follow it with."""

    caps: CapSource
    choose: Chooser
    samples_to_target: dict[int, float]


def method_chooser(
    method: str, profile: Profile, relation: RelationVector, target_relation: RelationVector | None
) -> Chooser:
    """The instructed method's rule as a function of the cap (what a follower re-applies)."""

    def pick(cap: float | None) -> Pick:
        c = choose(method, profile, relation, cap, target_relation)
        return Pick(c.batch_size, c.frequency_hz, c.predicted_seconds)

    return pick


def _oracle_extra(
    target_relation: RelationVector, runs: dict[tuple[int, int], tuple[FineTuneResult, nn.Module, str, dict]]
) -> dict[str, Any]:
    """What the report says of the oracle's own-data search (reported apart, not charged)."""
    return {
        "oracle_samples_to_target": {str(b): s for b, s in target_relation.samples_map().items()},
        "oracle_search_device_seconds": sum(r.device_seconds for r, *_ in runs.values()),
    }


def _oracle_runs(
    settings: NodeSettings,
    instr: TrainInstructions,
    state: State,
    data: tuple[Dataset, Dataset],
    profile: Profile,
    relation: RelationVector,
    cap: float | None,
    device_seed: int,
    search_hz: int | None = None,
) -> tuple[RelationVector, dict[tuple[int, int], tuple[FineTuneResult, nn.Module, str, dict]]]:
    """Samples to the target per batch size on this client's own data: each batch size fine-tuned at
    its fastest feasible frequency (or at `search_hz`). Batch sizes that miss the target within the
    budget are left out of the target relation (when none reaches it, every run counts with the
    samples it used)."""
    runs = {}
    pairs = (
        {b: search_hz for b in profile.batch_sizes()}
        if search_hz is not None
        else {b: p.frequency_hz for b, p in best_frequency_per_batch(profile, cap).items()}
    )
    for b, hz in pairs.items():
        if b in relation.batch_sizes:
            runs[(b, hz)] = _fine_tune_at(settings, instr, state, data, b, hz, cap, device_seed)
    if not runs:
        raise ClientWorkError(f"oracle: no profiled batch size is feasible under the cap {cap}")
    # samples 0 = already at the target before training: every batch size then needs (about) nothing
    reached = {b: max(float(r.samples), 1.0) for (b, _), (r, *_) in runs.items() if r.reached}
    if not reached:
        reached = {b: max(float(r.samples), 1.0) for (b, _), (r, *_) in runs.items()}
    target = RelationVector.from_samples(instr.model, "own data", instr.target_accuracy, reached)
    return target, runs


def _stand_in(
    settings: NodeSettings,
    instr: TrainInstructions,
    state: State,
    model: nn.Module,
    test: Dataset,
    profile: Profile,
    relation: RelationVector,
    cap: float | None,
    board: str,
) -> tuple[State, ClientReport, Choice]:
    """Scale mode's cheap stand-in: selection is real; training is not. The board model charges the
    steps the proxy's samples to target need at the chosen pair (capped by the budget); the weights go
    back unchanged; the accuracy is the received model's on the local test split (a forward pass)."""
    # the oracle's own-data relation is the proxy's for a stand-in: it has no training to measure
    chosen = choose(instr.method, profile, relation, cap, relation)
    task = get_model_spec(instr.model).task
    accuracy, _ = evaluate_with_loss(model, task, test.x, test.y) if len(test) else (0.0, 0.0)
    b, hz = chosen.batch_size, chosen.frequency_hz
    w = dict(profile.extra["workload"])
    workload = Workload(**{**w, "input_shape": tuple(w["input_shape"])})
    sim = board_model(board)
    need = 0.0 if accuracy >= instr.target_accuracy else relation.samples_map()[b]
    samples = min(need, instr.budget_samples or math.inf)
    steps = math.ceil(samples / b)
    cost = step_cost(sim, workload, b, hz)
    if instr.budget_device_seconds and steps * cost.seconds > instr.budget_device_seconds:
        steps = int(instr.budget_device_seconds // cost.seconds)
    seconds, energy = replay_cost(sim, workload, b, steps, hz)
    reached = need == 0.0 or steps * b >= need
    report = ClientReport(
        device=settings.device,
        power_cap_w=cap,
        batch_size=b,
        frequency_hz=hz,
        device_seconds=seconds,
        energy_j=energy,
        peak_power_w=cost.peak_w if steps else None,
        samples=steps * b,
        accuracy=accuracy,
        reached_target=reached,
        profiling_seconds=0.0,
        board=board,
        node_key=settings.key,
        predicted_seconds=chosen.predicted_seconds or 0.0,
        profiled_peak_power_w=chosen.profiled_peak_power_w or 0.0,
        profile_cached=True,
        lr=instr.lr_for(b),
        stop_reason="stand-in",
        train_examples=0,
        method=instr.method,
        stand_in=True,
        extra={"accuracy_of": "received weights (stand-in: not trained)"},
    )
    return state, report, chosen


def round_checkpoint(
    settings: NodeSettings, instr: TrainInstructions, batch_size: int, frequency_hz: int
) -> Checkpointing | None:
    """Where this node checkpoints this round's fine-tune, keyed by the work itself.

    One file per node (a later round's work replaces an earlier one's). The key is the round's
    instructions, the node and the selected pair, not Flower's run or node ids: a restarted ServerApp
    (a new run id) that re-sends the same round from the same weights finds the node's checkpoint,
    and `fine_tune` also checks the received weights, the data and the device before resuming.
    """
    if not instr.checkpoint_every_samples:
        return None
    work = {"instructions": dict(instr.to_config()), "node": settings.key, "pair": [batch_size, frequency_hz]}
    key = hashlib.sha256(json.dumps(work, sort_keys=True).encode()).hexdigest()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", settings.key)[:80]
    path = cache_dir("checkpoints") / f"finetune-{name}-{zlib.crc32(settings.key.encode()):08x}.safetensors"
    return Checkpointing(path, every_samples=instr.checkpoint_every_samples, key=key)


def train_round(
    settings: NodeSettings,
    instr: TrainInstructions,
    state: State,
    data: tuple[Dataset, Dataset],
    *,
    device_seed: int = 0,
    profile_cache: Path | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> tuple[State, ClientReport]:
    """Fine-tune the server's weights on this node's data with the (b, f) the instructed method picks.

    Only the power-aware method is charged for profiling (the baselines do not profile: they read only
    which batch sizes fit; the oracle is a limit, its own-data search is reported apart). A fine-tune
    killed mid-round resumes from its checkpoint when the same work comes again (`round_checkpoint`);
    `on_step` goes to `fine_tune`."""
    wall_start = time.perf_counter()
    caps = node_caps(settings, instr)
    cap = caps.cap_at(0.0)
    # a cap that changes follows the method's rule over the whole profile; the stand-in (scale mode)
    # and a server-set cap are constant
    dynamic = not caps.is_constant and not instr.stand_in
    model = build_local_model(instr.model, instr.num_classes, instr.model_overrides, state)
    train, test = data
    _check_data(instr, train)
    relation = instr.relation() if instr.stand_in else usable_relation(instr, len(train))
    with open_device(settings.device, seed=device_seed) as dev:
        model = model.to(dev.torch_device())
        # a changing cap may rise above today's: the whole grid, not the efficient order up to one cap
        profile, cached = _profile(
            dev,
            model,
            dataclasses.replace(instr, profile_order="grid") if dynamic else instr,
            relation.batch_sizes,
            None if dynamic else cap,
            profile_cache,
            relation_map=relation.as_map(),
        )
        board = dev.board
    if dynamic:
        return _train_following(
            settings, instr, state, data, profile, relation, caps, cached, device_seed, on_step, wall_start
        )
    if instr.stand_in:
        new_state, report, _ = _stand_in(settings, instr, state, model, test, profile, relation, cap, board)
        report.train_examples = len(train)
        report.wall_seconds = time.perf_counter() - wall_start
        return new_state, report
    runs: dict[tuple[int, int], tuple[FineTuneResult, nn.Module, str, dict]] = {}
    target_relation = None
    if instr.method == ORACLE:
        target_relation, runs = _oracle_runs(
            settings, instr, state, data, profile, relation, cap, device_seed
        )
    chosen = choose(instr.method, profile, relation, cap, target_relation, instr.deadline_s)
    pair = (chosen.batch_size, chosen.frequency_hz)
    result, model, board, control = runs.get(pair) or _fine_tune_at(
        settings, instr, state, data, *pair, cap, device_seed, on_step
    )
    extra: dict = {"profile_points": len(profile.points), "steps": result.steps}
    if chosen.meets_deadline is not None:
        extra.update(deadline_s=instr.deadline_s, meets_deadline_predicted=chosen.meets_deadline)
    if target_relation is not None:
        extra.update(_oracle_extra(target_relation, runs))
    report = _report(
        settings,
        instr,
        result,
        profile,
        cached,
        board,
        len(train),
        wall_start,
        cap=cap,
        pair=pair,
        predicted_seconds=chosen.predicted_seconds or 0.0,
        profiled_peak_power_w=chosen.profiled_peak_power_w or 0.0,
        extra={**extra, **result.extra},
        **control,
    )
    new_state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    return new_state, report


def node_caps(settings: NodeSettings, instr: TrainInstructions) -> CapSource:
    """The cap this round follows: the server's constant for this round when it sets one, else the
    node's own (a constant, a schedule, a trace or a live file)."""
    if instr.power_cap_w is not None:
        return ConstantCap(check_power_cap(instr.power_cap_w))
    return settings.caps()


def _train_following(
    settings: NodeSettings,
    instr: TrainInstructions,
    state: State,
    data: tuple[Dataset, Dataset],
    profile: Profile,
    relation: RelationVector,
    caps: CapSource,
    cached: bool,
    device_seed: int,
    on_step: Callable[[int, int], None] | None,
    wall_start: float,
) -> tuple[State, ClientReport]:
    """A round under a cap that changes: the method's rule re-applied at every change (see
    `powerctl.follow`). The oracle measures its own-data samples to target at the board's lowest
    frequency (safe under any cap the board can meet at all) before following with them."""
    train, _ = data
    target_relation = None
    extra: dict = {"profile_points": len(profile.points)}
    if instr.method == ORACLE:
        lowest = profile.frequencies()[0]
        target_relation, runs = _oracle_runs(
            settings, instr, state, data, profile, relation, None, device_seed, search_hz=lowest
        )
        extra.update(_oracle_extra(target_relation, runs))
    follow = Following(
        caps,
        method_chooser(instr.method, profile, relation, target_relation),
        (target_relation or relation).samples_map(),
    )
    result, model, board, control = _fine_tune_at(
        settings, instr, state, data, 0, 0, None, device_seed, on_step, follow
    )
    first = next(e for e in control["cap_events"] if e["kind"] in ("start", "resume"))
    b, hz = first["new_batch_size"], first["new_frequency_hz"]
    point = profile.point(b, hz)
    extra["steps"] = result.steps
    report = _report(
        settings,
        instr,
        result,
        profile,
        cached,
        board,
        len(train),
        wall_start,
        cap=caps.cap_at(0.0),
        pair=(b, hz),
        predicted_seconds=first["predicted_remaining_s"] or 0.0,
        profiled_peak_power_w=point.peak_power_w if point is not None else 0.0,
        extra={**extra, **result.extra},
        **control,
    )
    new_state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
    return new_state, report


def plan_round(
    settings: NodeSettings,
    instr: TrainInstructions,
    train_examples: int,
    *,
    profile_cache: Path | None = None,
) -> Plan:
    """A planning query (energy-under-deadline rounds): this node's fastest pair under its cap and its
    predicted time to the target. The profile is measured now when not cached (the next round's
    training then finds it cached; the server charges these seconds to that round)."""
    caps = node_caps(settings, instr)
    cap = caps.cap_at(0.0)
    model = build_model(instr.model, instr.num_classes, seed=0, **instr.model_overrides)
    relation = usable_relation(instr, train_examples)
    with open_device(settings.device) as dev:
        model = model.to(dev.torch_device())
        profile, cached = _profile(
            dev, model, instr, relation.batch_sizes, cap, profile_cache, relation_map=relation.as_map()
        )
    fastest = select(profile, relation, cap)
    return Plan(
        fastest_seconds=fastest.predicted_seconds,
        batch_size=fastest.batch_size,
        frequency_hz=fastest.frequency_hz,
        energy_j=fastest.predicted_energy_j,
        profiling_seconds=0.0 if cached else float(profile.profiling_seconds or 0.0),
    )


def _report(
    settings: NodeSettings,
    instr: TrainInstructions,
    result: FineTuneResult,
    profile: Profile,
    cached: bool,
    board: str,
    train_examples: int,
    wall_start: float,
    *,
    cap: float | None,
    pair: tuple[int, int],
    predicted_seconds: float,
    profiled_peak_power_w: float,
    extra: dict,
    **more: Any,
) -> ClientReport:
    """The round's report from its fine-tune. Only the power-aware method is charged for profiling
    it measured this round (the baselines do not profile; the oracle's search is reported apart)."""
    charged = instr.method == OURS and not cached
    return ClientReport(
        device=settings.device,
        power_cap_w=cap,
        batch_size=pair[0],
        frequency_hz=pair[1],
        device_seconds=result.device_seconds,
        energy_j=result.energy_j,
        peak_power_w=result.peak_power_w,
        samples=result.samples,
        accuracy=result.final_accuracy,
        reached_target=result.reached,
        profiling_seconds=float(profile.profiling_seconds or 0.0) if charged else 0.0,
        board=board,
        node_key=settings.key,
        predicted_seconds=predicted_seconds,
        profiled_peak_power_w=profiled_peak_power_w,
        profile_cached=cached,
        lr=result.lr,
        stop_reason=result.stop_reason,
        train_examples=train_examples,
        wall_seconds=time.perf_counter() - wall_start,
        method=instr.method,
        extra=extra,
        **more,
    )
