"""One client round, Flower-free: profile → choose → pin and train → report.

Every caller that fine-tunes a client's data under a power cap goes through `run_round`: the ClientApp
(`fl_client.app` only translates Flower messages to and from it), the one-board demo
(`simulations.demo`) and the benches. What differs between them is a different step, never a mode:

- `profile`: the device measured (and cached) running the step that will train (`ProfiledStep`: the
  built-in fine-tune's, or a user's own through `fl_client.session`);
- `choose`: the method's rule as a function of the cap (`MethodRule`: the registry's method,
  `powerctl.selection.methods`: Algorithm 1 for ours, the baselines of `powerctl.selection.baselines`);
- `train`: a fine-tune at the rule's pair under a constant cap (power guard), or following a cap that
  changes (the rule re-applied at every change, `powerctl.selection.follow`): `Pinning`, shared with a user's
  loop.

What only the fleet runner and the benches ask for — scale mode's predicted profiles and stand-in
training, the oracle's own-data search — is theirs (`simulations.bench_steps`): the fleet's ClientApp
(`simulations.fleet_client`) and the demo pass them in as `RoundSteps`; the production round refuses
instructions that ask for them (`needs_bench_steps`) in one line. What those steps measure beyond the
report is theirs to send (the fleet's ClientApp: `simulations.bench_report`).

What other modules use is listed in `__all__` (tests/test_round_surface.py: nothing outside imports a
name that starts with an underscore).

The device is opened per step and closed on every way out (`restore_on_exit`: exceptions, SIGINT,
SIGTERM), so nothing stays pinned after a round; a board that a killed process left pinned is put back
when the device opens, and the report says so (`ClientReport.restored`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
import time
import zlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from fl_client.clientapp_entry import COMMAND as CLIENTAPP_COMMAND
from fl_client.node import NodeSettings
from fl_client.profile_cache import ProfileKey, cached_profile, lookup, same_kind_profiles, store
from powerctl.devices import open_device
from powerctl.devices.base import Device
from powerctl.devices.boards import board_model, board_names
from powerctl.devices.simulated import SimulatedBoard, predicted_profile
from powerctl.errors import InfeasibleCapError, PowerctlError
from powerctl.files.cache import cache_dir
from powerctl.pinning.safety import restore_on_exit
from powerctl.procs import seconds_since_start
from powerctl.profiling.budget import (
    BOARD_MODEL,
    FITTED,
    PREDICTED,
    ProfilingPlan,
    ProfilingRequest,
    completed,
    confirmed_in_training,
    profile_within_budget,
    still_enough,
)
from powerctl.profiling.profiler import Profiler, StepFactory
from powerctl.records.pick import Pick
from powerctl.records.profile import Profile
from powerctl.records.relation import DEFAULT_RELATION_RULE, RelationVector
from powerctl.records.workload import Workload
from powerctl.selection.baselines import board_fixed_frequency
from powerctl.selection.capsource import CapSource, ConstantCap
from powerctl.selection.confirm import TrainingConfirmation
from powerctl.selection.follow import CapFollower
from powerctl.selection.guard import PowerGuard
from powerctl.selection.joint import check_power_cap, select
from powerctl.selection.methods import MethodContext, method_named
from powerfed.training.checkpoint import Checkpointing
from powerfed.training.errors import DataError, ModelError
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import (
    DEFAULT_MAX_EPOCHS,
    FineTuneCallbacks,
    FineTuneConfig,
    FineTuneResult,
)
from powerfed.training.models import build_model, check_input_shape, get_model_spec
from strategies.protocol import ClientReport, Plan, TrainInstructions

__all__ = [
    "CapRule",
    "ChooseStep",
    "Chosen",
    "ClientWorkError",
    "MethodRule",
    "Pinning",
    "ProfileStep",
    "Profiled",
    "ProfiledStep",
    "RoundOutcome",
    "RoundSteps",
    "RoundWork",
    "State",
    "StepsFor",
    "TrainStep",
    "Trained",
    "budgeted",
    "budgeted_profile",
    "build_local_model",
    "build_report",
    "builtin_step",
    "check_data",
    "fine_tune_step",
    "measured_profile_step",
    "message_process_startup_s",
    "method_step",
    "model_seq_len",
    "needs_bench_steps",
    "node_caps",
    "node_device_seed",
    "plan_round",
    "profile_order",
    "profiling_choice",
    "round_checkpoint",
    "run_round",
    "train_round",
    "usable_relation",
]

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from powerfed.training.data import Dataset

State = dict[str, torch.Tensor]


class ClientWorkError(PowerctlError):
    """This round cannot run on this node as instructed (no usable batch size, no knob, ...)."""


# --- the work ------------------------------------------------------------------------------------


def node_caps(settings: NodeSettings, instr: TrainInstructions) -> CapSource:
    """The cap this round follows: the server's constant for this round when it sets one, else the
    node's own (a constant, a schedule, a trace or a live file)."""
    if instr.power_cap_w is not None:
        return ConstantCap(check_power_cap(instr.power_cap_w))
    return settings.caps()


def node_device_seed(settings: NodeSettings, server_seed: int) -> int:
    """A simulated board's noise seed: stable per node (not per node id, which changes every run)."""
    return (server_seed * 1_000_003 + zlib.crc32(settings.key.encode())) % (2**31)


@dataclass(frozen=True)
class ProfiledStep:
    """The training step a round profiles: the step of the loop that will train, on the model it trains
    and inputs of its shape, so that the profile is of what is trained.

    `build(device)` gives the step's workload (what it computes, for a simulated board's charge and the
    profile's record) and batch size → one step on the device; profiling trains, so it builds its own
    copy of the model. `model`, `input_shape` and `key` name it in the profile cache."""

    model: str
    input_shape: tuple[int, ...]
    build: Callable[[Device], tuple[Workload, StepFactory]]
    key: str = ""
    """"" for the built-in step; a user's step: its own key (`ProfileKey.step`)."""


def builtin_step(work: RoundWork) -> ProfiledStep:
    """The built-in fine-tune's own step (`powerfed.training.profiling`: its optimizer and loss) on the
    server's model, at the task's input shape."""
    from powerfed.training.profiling import profiling_step_factory

    instr = work.instr
    spec = get_model_spec(instr.model)
    shape = (model_seq_len(instr.model, instr.model_overrides),) if spec.task == "text" else spec.input_shape

    def build(dev: Device) -> tuple[Workload, StepFactory]:
        return profiling_step_factory(
            instr.model,
            model=work.model().to(dev.torch_device()),
            num_classes=instr.num_classes,
            torch_device=dev.torch_device(),
            seed=instr.seed,
        )

    return ProfiledStep(instr.model, tuple(shape), build)


@dataclass(frozen=True)
class RoundWork:
    """One round's work on one node: who it is, what the server asked, its weights and local data.

    `caps` is resolved once from the node and the instructions (a step may narrow it: the oracle's
    search trains under a constant cap)."""

    settings: NodeSettings
    instr: TrainInstructions
    state: State | None
    """The server's weights; None for a planning query, which profiles but does not train."""
    data: tuple[Dataset, Dataset] | None
    device_seed: int = 0
    profile_cache: Path | None = None
    on_step: Callable[[int, int], None] | None = None
    caps: CapSource = field(default=None)  # type: ignore[assignment]
    step: ProfiledStep | None = None
    """The training step profiled: None for the built-in fine-tune's (`builtin_step`); a user's own loop
    gives its own (`fl_client.session.PowerSession`)."""
    examples: int | None = None
    """Training samples on this node when `data` is not ours to hold (a user's own loop)."""

    def __post_init__(self) -> None:
        if self.caps is None:
            object.__setattr__(self, "caps", node_caps(self.settings, self.instr))

    @property
    def train_examples(self) -> int | None:
        """This node's training samples (None: a planning query, which has no data)."""
        return len(self.data[0]) if self.data is not None else self.examples

    def profiled_step(self) -> ProfiledStep:
        return self.step or builtin_step(self)

    def device(self) -> Device:
        """A fresh handle on this node's device (each step opens its own: a simulated board's noise
        then does not depend on what ran before), pinnable as the node allows (`NodeSettings.pin`)."""
        return open_device(self.settings.device, seed=self.device_seed, pin=self.settings.pin)

    @cached_property
    def cap_at_start(self) -> float | None:
        return self.caps.cap_at(0.0)

    def model(self) -> nn.Module:
        """The network the server described, with its weights (a fresh copy for every use)."""
        instr = self.instr
        if self.state is None:
            return build_model(instr.model, instr.num_classes, seed=0, **instr.model_overrides)
        return build_local_model(instr.model, instr.num_classes, instr.model_overrides, self.state)

    def split(self) -> tuple[Dataset, Dataset]:
        if self.data is None:
            raise ClientWorkError("this round has no local data to train on")
        return self.data


def build_local_model(
    model_name: str, num_classes: int, overrides: Mapping[str, Any], state: State
) -> nn.Module:
    """The network the server described, with the server's weights; a mismatch is one ModelError line."""
    model = build_model(model_name, num_classes, **overrides)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise ModelError(f"the weights received do not fit model {model_name!r} ({first})") from None
    return model


def model_seq_len(model_name: str, overrides: Mapping[str, Any]) -> int:
    """The window length text data is cut into (64 for images, which ignore it)."""
    spec = get_model_spec(model_name)
    return int(overrides.get("seq_len", spec.input_shape[0])) if spec.task == "text" else 64


def check_data(instr: TrainInstructions, train: Dataset) -> None:
    task = get_model_spec(instr.model).task
    if train.task != task:
        raise DataError(f"model {instr.model} is a {task} model but this node's data is {train.task} data")
    check_input_shape(get_model_spec(instr.model), tuple(train.x.shape[1:]), "this node's data")
    if train.num_classes > instr.num_classes:
        raise DataError(
            f"this node's data has {train.num_classes} classes, the model {instr.num_classes} outputs"
        )


def usable_relation(instr: TrainInstructions, train_examples: int) -> RelationVector:
    """The relation restricted to batch sizes this node's train split can fill at least once."""
    relation = instr.relation()
    keep = [b for b in relation.batch_sizes if b <= train_examples]
    if not keep:
        raise ClientWorkError(
            f"this node has {train_examples} training samples, fewer than the smallest batch size "
            f"{min(relation.batch_sizes)} of the relation vector; give it more data or smaller batch sizes"
        )
    return relation.restricted(keep)


# --- step results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profiled:
    """What the profile step produced."""

    profile: Profile
    cached: bool
    """Taken from the cache (or predicted): no device time spent on it this round."""
    board: str
    restored: str = ""
    """The line said when the device was opened and found left pinned by a killed process."""
    plan: ProfilingPlan | None = None
    """A budgeted profile: what the client predicted and chose (None: the instructed order, or cached)."""


class CapRule(Protocol):
    """A method's rule bound to one profile, as a function of the cap alone: what it pins under a constant
    cap, and what a follower re-applies when the cap changes. `relation` is what it predicts progress by.
    (The registry's `powerctl.selection.methods.Rule` is the unbound function it applies.)"""

    # read-only: a frozen dataclass (`MethodRule`) is a rule
    @property
    def profile(self) -> Profile: ...
    @property
    def relation(self) -> RelationVector: ...

    def __call__(self, power_cap_w: float | None) -> Pick: ...


@dataclass(frozen=True)
class MethodRule:
    """The instructed method's rule (`powerctl.selection.methods`: the registry's method of that name) over
    one
    profile."""

    method: str
    profile: Profile
    relation: RelationVector
    """The proxy's relation; the oracle's rule predicts by its own-data relation instead."""
    own_data: RelationVector | None = None
    deadline_s: float = 0.0
    relation_rule: str = DEFAULT_RELATION_RULE

    def __call__(self, power_cap_w: float | None) -> Pick:
        context = MethodContext(self.own_data, self.deadline_s, self.relation_rule)
        return method_named(self.method).choose(self.profile, self.relation, power_cap_w, context)

    @property
    def predicts_by(self) -> RelationVector:
        return self.own_data or self.relation


@dataclass
class Trained:
    """A train step's outcome: the fine-tune's result, the weights after it, the board, and the choice it
    started from (under a changing cap the follower's first pick)."""

    result: FineTuneResult
    state: State
    board: str
    choice: Pick
    stand_in: bool = False
    """Not trained: a bench's stand-in charged a board model (no steps, no profiling charged)."""
    final_pair: list[int] | None = None
    """Under a cap that changes: the pair in force when the fine-tune ended."""
    step_downs: list[dict[str, Any]] = field(default_factory=list)
    """What the power guard did (read from the guard or the follower after the fine-tune)."""
    cap_events: list[dict[str, Any]] = field(default_factory=list)
    """What the cap follower did (a cap that changes, `powerctl.selection.follow.CapEvent`), in order."""
    paused_seconds: float = 0.0
    """Device seconds the follower paused (nothing fitted under the cap); not in the result's seconds."""
    over_cap_seconds: float | None = None
    """Device seconds the follower measured over the cap in force (None: no follower)."""
    pinned: bool = True
    """False: trained at the clock in force, the frequency not ours to change (`open_device(pin=...)`)."""


@dataclass(frozen=True)
class Chosen:
    """The choose step's outcome: the rule the train step applies; a step that trained to choose (the
    oracle's search) hands on its runs and what it measured."""

    rule: CapRule
    runs: dict[tuple[int, int], Trained] = field(default_factory=dict)
    """Runs the choose step made under this round's constant cap, by pair: the chosen pair's is the
    round's training, not run again."""
    bench: object = None
    """What a bench's choose step measured beside the report (the oracle's own-data search), in its own
    record, which its caller sends (`simulations.fleet_client`); None: nothing."""


ProfileStep = Callable[[RoundWork, RelationVector], Profiled]
TrainStep = Callable[[RoundWork, CapRule], Trained]
ChooseStep = Callable[[RoundWork, Profile, RelationVector, TrainStep], Chosen]


# --- profile ----------------------------------------------------------------------------------------


def profile_order(instr: TrainInstructions, caps: CapSource) -> tuple[str, float | None]:
    """(order, the cap the order stops at). The efficient order stops at the cap (no cap: the grid); the
    fitted order predicts and confirms the choice for this cap; a cap that changes may rise above
    today's, so it needs the whole grid."""
    if not caps.is_constant:
        return "grid", None
    cap = caps.cap_at(0.0)
    order = instr.profile_order if cap is not None or instr.profile_order == "fitted" else "grid"
    return order, (cap if order in ("efficient", "fitted") else None)


def budgeted(work: RoundWork) -> bool:
    """Whether this round's profiling is held to a share of its predicted training: ours (no deadline:
    energy under a deadline reads the whole profile) training under a constant cap (a cap that changes
    needs the grid), with a budget set."""
    instr = work.instr
    return (
        instr.profiling_budget > 0
        and method_named(instr.method).power_aware
        and not instr.deadline_s
        and not instr.stand_in
        and work.caps.is_constant
        and work.train_examples is not None
    )


def measured_profile_step(work: RoundWork, relation: RelationVector) -> Profiled:
    """The device's profile for this model, from the cache or measured now (and cached); a device
    without a knob or a sensor is refused by the profiler with one line. Ours with a profiling budget
    (`budgeted`) measures only what its predicted training pays for (`budgeted_profile`); a baseline on
    a simulated board takes the board's model, measuring nothing (it is charged no profiling)."""
    instr = work.instr
    order, order_cap = profile_order(instr, work.caps)
    fitted_relation = relation.as_map() if order == "fitted" else None
    step = work.profiled_step()
    with work.device() as dev:
        key = ProfileKey(
            device_kind=dev.profile_kind(),
            model=step.model,
            overrides=instr.overrides_text(),
            num_classes=instr.num_classes,
            input_shape=step.input_shape,
            batch_sizes=tuple(relation.batch_sizes),
            order=order,
            power_cap_w=order_cap,
            relation=None if fitted_relation is None else json.dumps(sorted(fitted_relation.items())),
            samples=instr.profile_samples,
            warmup_steps=instr.profile_warmup,
            measure_steps=instr.profile_steps,
            step=step.key,
        )

        def step_factory() -> tuple[Workload, StepFactory]:
            # profiling trains: its own copy of the weights, so the round starts from the server's
            return step.build(dev)

        if budgeted(work):
            return budgeted_profile(work, dev, key, relation, step_factory)
        if not method_named(instr.method).power_aware and isinstance(dev, SimulatedBoard):
            # a baseline is charged no profiling; on a simulated board the board's model is what its
            # readings are drawn from: read, not measured (the paper's baselines do not profile)
            model = _board_model(dev, step_factory()[0], relation, instr.profile_samples)
            return Profiled(model, False, dev.board, dev.recovered or "")

        def measure() -> Profile:
            workload, make_step = step_factory()
            return Profiler(
                dev,
                workload,
                make_step,
                samples=instr.profile_samples,
                warmup_steps=instr.profile_warmup,
                measure_steps=instr.profile_steps,
            ).run(
                relation.batch_sizes,
                order=order,
                power_cap_w=order_cap,
                relation=fitted_relation,
                progress=False,
            )

        profile, cached = cached_profile(key, measure, work.profile_cache)
        return Profiled(profile, cached, dev.board, dev.recovered or "")


def budgeted_profile(
    work: RoundWork,
    dev: Device,
    key: ProfileKey,
    relation: RelationVector,
    step_factory: Callable[[], tuple[Workload, StepFactory]],
) -> Profiled:
    """Profiling that pays for itself (`powerctl.profiling.budget`): a profile cached for this board,
    model and cap by any of the ways costs nothing; else one measured step predicts the training, and
    the client profiles the most thorough way whose predicted cost is within `profiling-budget` of it —
    the instructed order, the fitted order, or the predicted profile's choice confirmed. The predicted
    profile: a simulated board's model; a real board's, a measured profile in the cache of the same
    kind of board and model (completed by the fit), marked as such."""
    instr, cap = work.instr, work.cap_at_start
    rmap = json.dumps(sorted(relation.as_map().items()))
    keys = {
        key.order: key,
        FITTED: replace(key, order=FITTED, power_cap_w=cap, relation=rmap),
        PREDICTED: replace(key, order=PREDICTED, power_cap_w=cap, relation=f"{rmap} {instr.relation_rule}"),
    }
    restored = dev.recovered or ""
    max_samples = instr.budget_samples or DEFAULT_MAX_EPOCHS * (work.train_examples or 0)
    max_training_s = instr.budget_device_seconds or None
    for way, way_key in keys.items():
        profile = lookup(way_key, work.profile_cache)
        enough = profile is not None and (
            way != PREDICTED
            or still_enough(
                profile,
                [key.order, FITTED],
                relation,
                cap,
                instr.profiling_budget,
                max_samples=max_samples,
                max_training_s=max_training_s,
                rule=instr.relation_rule,
            )
        )
        if profile is not None and enough:
            return Profiled(profile, True, dev.board, restored)
    workload, make_step = step_factory()
    prediction, source = _prediction(work, dev, key, workload, relation)
    request = ProfilingRequest(
        order=key.order,
        order_cap_w=key.power_cap_w,
        batch_sizes=relation.batch_sizes,
        samples=instr.profile_samples,
        power_cap_w=cap,
        relation=relation,
        share=instr.profiling_budget,
        max_samples=max_samples,
        max_training_s=max_training_s,
        rule=instr.relation_rule,
        warmup_steps=instr.profile_warmup,
        measure_steps=instr.profile_steps,
    )
    profile, plan = profile_within_budget(
        dev,
        workload,
        make_step,
        request,
        prediction=prediction,
        predicted_from=source,
        reference_hz=_reference_hz(dev, cap),
    )
    store(keys[plan.choice], profile, work.profile_cache)
    if (why := plan.over_budget()) is not None:
        log.warning("%s on %s: %s", work.settings.key, dev.board, why)
    return Profiled(profile, False, dev.board, restored, plan)


def _board_model(dev: SimulatedBoard, workload: Workload, relation: RelationVector, samples: int) -> Profile:
    """A simulated board's model of the very step profiled, at the relation's batch sizes."""
    return predicted_profile(dev.board, workload, relation.batch_sizes, samples)


def _prediction(
    work: RoundWork, dev: Device, key: ProfileKey, workload: Workload, relation: RelationVector
) -> tuple[Profile | None, str]:
    """The board's predicted profile and where it came from (None: nothing predicts this board)."""
    if isinstance(dev, SimulatedBoard):
        return _board_model(dev, workload, relation, work.instr.profile_samples), BOARD_MODEL
    for path, measured in same_kind_profiles(key.device_kind, workload.to_dict(), work.profile_cache):
        if (full := completed(measured, dev.frequencies())) is not None:
            order = measured.extra.get("order")
            return full, f"the {order} profile of a {key.device_kind} measured earlier ({path.name})"
    return None, ""


def _reference_hz(dev: Device, cap: float | None) -> int | None:
    """Where one step is measured when nothing predicts the board: the state of practice's frequency
    for the cap (safe for any model) where the board kind has one, else the lowest (None). A device
    that may not be pinned has one frequency, the clock in force: measured there."""
    if not dev.frequencies():
        return None  # no knob: the profiler refuses it with one line
    if cap is None or not dev.pins:
        return dev.frequencies()[-1]
    if dev.board not in board_names():
        return None
    try:
        return board_fixed_frequency(board_model(dev.board), cap)
    except InfeasibleCapError:
        return None


# --- choose -----------------------------------------------------------------------------------------


def method_step(work: RoundWork, profile: Profile, relation: RelationVector, train: TrainStep) -> Chosen:
    """The instructed method's rule. A stand-in oracle has no training to search with: it predicts by
    the proxy's relation."""
    instr = work.instr
    own = relation if method_named(instr.method).searches_own_data else None
    return Chosen(MethodRule(instr.method, profile, relation, own, instr.deadline_s, instr.relation_rule))


# --- train ------------------------------------------------------------------------------------------


def round_checkpoint(work: RoundWork, pair: tuple[int, int]) -> Checkpointing | None:
    """Where this node checkpoints this round's fine-tune, keyed by the work itself.

    One file per node (a later round's work replaces an earlier one's). The key is the round's
    instructions, the node and the first pair, not Flower's run or node ids: a restarted ServerApp
    (a new run id) that re-sends the same round from the same weights finds the node's checkpoint,
    and `fine_tune` also checks the received weights, the data and the device before resuming.
    """
    instr, settings = work.instr, work.settings
    if not instr.checkpoint_every_samples:
        return None
    what = {"instructions": dict(instr.to_config()), "node": settings.key, "pair": list(pair)}
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", settings.key)[:80]
    path = cache_dir("checkpoints") / f"finetune-{name}-{zlib.crc32(settings.key.encode()):08x}.safetensors"
    return Checkpointing(path, every_samples=instr.checkpoint_every_samples, key=key)


@dataclass
class Pinning:
    """A rule in force on an open device while a loop trains: under a constant cap pinned at the rule's
    pair with the power guard watching; under a cap that changes, the follower re-applying the rule at
    every change. Any loop (the built-in fine-tune, a user's own through `fl_client.session`) runs its
    steps with `hooks`; the caller restores the device (`restore_on_exit`)."""

    choice: Pick
    guard: PowerGuard | None = None
    follower: CapFollower | None = None
    confirmation: TrainingConfirmation | None = None
    """The predicted way's choice, measured by the first steps (it holds the guard until confirmed)."""
    pinned: bool = True
    """False: the device runs at the clock in force (the one frequency it offers); nothing is written."""

    @classmethod
    def start(cls, work: RoundWork, rule: CapRule, dev: Device) -> Pinning:
        instr = work.instr
        if work.caps.is_constant:
            cap = work.cap_at_start
            choice = rule(cap)
            dev.pin_frequency(choice.frequency_hz)
            guard = None
            if cap is not None and dev.has_power_sensor:
                guard = PowerGuard(
                    dev, cap, choice.frequency_hz, window=instr.guard_window, tolerance=instr.guard_tolerance
                )
            if cap is not None and guard is not None and confirmed_in_training(rule.profile):
                confirmation = TrainingConfirmation(
                    dev,
                    rule.profile,
                    lambda merged: select(merged, rule.relation, cap, rule=instr.relation_rule),
                    cap,
                    choice,
                    warmup_steps=int(rule.profile.extra.get("warmup_steps", instr.profile_warmup)),
                    measure_steps=int(rule.profile.extra.get("measure_steps", instr.profile_steps)),
                    guard=guard,
                )
                return cls(choice, confirmation=confirmation, pinned=dev.pins)
            return cls(choice, guard=guard, pinned=dev.pins)
        follower = CapFollower(
            dev,
            work.caps,
            rule,
            samples_to_target=rule.relation.samples_map(),
            poll_s=instr.cap_poll_s,
            pause_timeout_s=instr.cap_pause_timeout_s,
            guard_window=instr.guard_window,
            guard_tolerance=instr.guard_tolerance,
        )
        first = follower.start()
        choice = Pick(first.batch_size, first.frequency_hz, first.predicted_seconds, method=instr.method)
        return cls(choice, follower=follower, pinned=dev.pins)

    @property
    def hooks(self) -> list[Any]:
        """The step hooks a loop runs (`powerfed.training.finetune_records.StepHook`)."""
        return [h for h in (self.confirmation or self.guard, self.follower) if h is not None]

    @property
    def batch_size(self) -> int:
        """The batch size in force (a follower or the confirmation may change it between steps)."""
        for holder in (self.follower, self.confirmation):
            if holder is not None:
                return int(holder.batch_size)
        return self.choice.batch_size

    @property
    def frequency_hz(self) -> int:
        """The frequency in force: the follower's, the confirmation's or the guard's after its
        step-downs, else the choice's."""
        for holder in (self.follower, self.confirmation, self.guard):
            if holder is not None:
                return int(holder.frequency_hz)
        return self.choice.frequency_hz

    def trained(self, result: FineTuneResult, state: State, board: str) -> Trained:
        """The train step's outcome, with what the guard or the follower did."""
        follower, method = self.follower, self.choice.method
        if follower is None:
            choice, guard = self.choice, self.guard
            if self.confirmation is not None:  # the pair confirmed (or in force): what trained
                choice, guard = replace(self.confirmation.pick, method=method), self.confirmation.guard
                for s in self.confirmation.switches:
                    log.info(
                        "%s: b=%d at %d Hz read %.2f W, over the %g W cap or outranked once measured: "
                        "b=%d at %d Hz from %.3g s of training",
                        board,
                        *s.old,
                        s.measured_w,
                        s.power_cap_w,
                        *s.new,
                        s.device_seconds,
                    )
            downs = [] if guard is None else [e.to_dict() for e in guard.step_downs]
            return Trained(result, state, board, choice, step_downs=downs, pinned=self.pinned)
        events = [e.to_dict() for e in follower.events]
        # the pair it started with (from the events: a resumed run's first pick is its first run's)
        e = next(e for e in events if e["kind"] in ("start", "resume"))
        choice = Pick(e["new_batch_size"], e["new_frequency_hz"], e["predicted_remaining_s"], method=method)
        return Trained(
            result,
            state,
            board,
            choice,
            step_downs=[e.to_dict() for e in follower.step_downs],
            cap_events=events,
            paused_seconds=follower.paused_s,
            over_cap_seconds=follower.over_cap_s,
            final_pair=[follower.batch_size, follower.frequency_hz],
            pinned=self.pinned,
        )


def fine_tune_step(
    work: RoundWork, rule: CapRule, *, observe: Callable[[Device], AbstractContextManager[Any]] | None = None
) -> Trained:
    """Fine-tune the server's weights on a fresh device handle (a simulated board's noise then does not
    depend on what ran before, so a seeded run repeats exactly), checkpointed so that the same work
    killed and sent again resumes; the rule in force as `Pinning` holds it.

    `observe(device)` is entered around the whole fine-tune, pauses included (a bench records the
    board's power over time with it)."""
    instr = work.instr
    train, test = work.split()
    model = work.model()
    watch = observe or (lambda _dev: nullcontext())
    with (
        work.device() as dev,
        restore_on_exit(dev),
        watch(dev),
    ):
        model = model.to(dev.torch_device())
        pinning = Pinning.start(work, rule, dev)
        choice = pinning.choice
        config = FineTuneConfig(
            batch_size=pinning.batch_size,
            lr=instr.lr_for,
            target_accuracy=instr.target_accuracy,
            max_samples=instr.budget_samples or None,
            max_device_seconds=instr.budget_device_seconds or None,
            eval_every_samples=instr.eval_every_samples,
            eval_max_samples=instr.eval_max_samples,
            seed=instr.seed,
        )
        callbacks = FineTuneCallbacks(
            progress=False,
            checkpoint=round_checkpoint(work, (choice.batch_size, choice.frequency_hz)),
            hooks=pinning.hooks,
            on_step=work.on_step,
        )
        result = fine_tune(model, train, test, config, device=dev, callbacks=callbacks)
        state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
        return pinning.trained(result, state, dev.board)


# --- the round --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RoundSteps:
    """The three steps of a round; `for_instructions` gives the ones the server's instructions ask for."""

    profile: ProfileStep = measured_profile_step
    choose: ChooseStep = method_step
    train: TrainStep = fine_tune_step

    @classmethod
    def for_instructions(cls, instr: TrainInstructions) -> RoundSteps:
        """The production round (measured profile, the method's rule, fine-tune). What only the fleet
        runner does (`needs_bench_steps`) is not here: its own ClientApp passes its steps in, and a
        round asked for them without them is one line."""
        if needs_bench_steps(instr):
            raise ClientWorkError(
                "these instructions ask for the fleet runner's steps (scale mode, predicted profiles or "
                "the oracle's search), which only its ClientApp has (simulations.fleet_client:app, what "
                "`python -m simulations` runs): run them there, or send measured, trained rounds"
            )
        return cls()


def needs_bench_steps(instr: TrainInstructions) -> bool:
    """Scale mode's predicted profiles and stand-in training, and the oracle's own-data search: what
    only the fleet runner and the benches ask a client for."""
    return (
        instr.stand_in or instr.profile_source == "predicted" or method_named(instr.method).searches_own_data
    )


StepsFor = Callable[[TrainInstructions], RoundSteps]
"""The steps a round runs for its instructions: what a caller with steps of its own (the fleet runner's
ClientApp, `simulations.fleet_client`) passes to the ClientApp's round (`fl_client.app.train_reply`)."""


@dataclass
class RoundOutcome:
    """What a round produced, for callers that need more than the report (the demo, the benches)."""

    state: State
    report: ClientReport
    profiled: Profiled
    chosen: Chosen
    trained: Trained


def message_process_startup_s() -> float | None:
    """Wall seconds since this process started, where it was started for this one message (a deployed
    SuperNode's `flwr-clientapp`): the start-up the round cost before its work (`ClientReport.startup_s`).
    None where a process serves many messages (simulation's Ray actors, a test, a user's script)."""
    if os.path.basename(sys.argv[0]) != CLIENTAPP_COMMAND:
        return None
    startup = seconds_since_start(os.getpid())
    return None if startup is None else round(startup, 2)


def run_round(work: RoundWork, steps: RoundSteps | None = None) -> RoundOutcome:
    """Profile → choose → pin and train → report, with the steps given (default: what the instructions
    ask for). Only the power-aware method is charged for profiling it measured this round (the
    baselines do not profile: they read only which batch sizes fit; the oracle is a limit, its own-data
    search is reported apart)."""
    steps = steps or RoundSteps.for_instructions(work.instr)
    wall_start = time.perf_counter()
    train, _ = work.split()
    check_data(work.instr, train)
    relation = work.instr.relation() if work.instr.stand_in else usable_relation(work.instr, len(train))
    startup_s = message_process_startup_s()  # the first profiling or training step comes next
    profiled = steps.profile(work, relation)
    chosen = steps.choose(work, profiled.profile, relation, steps.train)
    trained = None
    if chosen.runs and work.caps.is_constant:  # the chosen pair was measured while choosing
        c = chosen.rule(work.cap_at_start)
        trained = chosen.runs.get((c.batch_size, c.frequency_hz))
        if trained is not None:
            trained = replace(trained, choice=c)
    if trained is None:
        trained = steps.train(work, chosen.rule)
    wall_s = time.perf_counter() - wall_start
    report = build_report(work, profiled, chosen, trained, len(train), wall_s, startup_s=startup_s)
    return RoundOutcome(trained.state, report, profiled, chosen, trained)


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
    """The production round (`RoundSteps.for_instructions`); returns the new weights and the report."""
    work = RoundWork(settings, instr, state, data, device_seed, profile_cache, on_step)
    outcome = run_round(work)
    return outcome.state, outcome.report


def build_report(
    work: RoundWork,
    profiled: Profiled,
    chosen: Chosen,
    trained: Trained,
    train_examples: int,
    wall_seconds: float,
    *,
    startup_s: float | None = None,
) -> ClientReport:
    """The round's report. Only the power-aware method is charged for profiling it measured this round."""
    instr, result, choice, profile = work.instr, trained.result, trained.choice, profiled.profile
    charged = method_named(instr.method).power_aware and not profiled.cached and not trained.stand_in
    plan = profiled.plan
    point = profile.point(choice.batch_size, choice.frequency_hz)
    peak = choice.peak_power_w or (point.peak_power_w if point is not None else 0.0)
    return ClientReport(
        device=work.settings.device,
        power_cap_w=work.cap_at_start,
        batch_size=choice.batch_size,
        frequency_hz=choice.frequency_hz,
        device_seconds=result.device_seconds,
        energy_j=result.energy_j,
        peak_power_w=result.peak_power_w,
        samples=result.samples,
        accuracy=result.final_accuracy,
        reached_target=result.reached,
        profiling_seconds=float(profile.profiling_seconds or 0.0) if charged else 0.0,
        board=trained.board,
        node_key=work.settings.key,
        predicted_seconds=choice.predicted_seconds or 0.0,
        profiled_peak_power_w=peak or 0.0,
        profile_cached=profiled.cached,
        lr=result.lr,
        stop_reason=result.stop_reason,
        train_examples=train_examples,
        wall_seconds=wall_seconds,
        startup_s=startup_s,
        step_downs=trained.step_downs,
        method=instr.method,
        profile_points=0 if trained.stand_in or confirmed_in_training(profile) else len(profile.points),
        steps=0 if trained.stand_in else result.steps,
        resumed_at_samples=result.extra.get("resumed_at_samples"),
        deadline_s=instr.deadline_s if choice.meets_deadline is not None else None,
        meets_deadline_predicted=choice.meets_deadline,
        cap_source="" if trained.final_pair is None else work.caps.describe(),
        final_pair=trained.final_pair,
        cap_events=trained.cap_events,
        paused_seconds=trained.paused_seconds,
        over_cap_seconds=trained.over_cap_seconds,
        pinned=trained.pinned,
        restored=profiled.restored,
        profiling_choice=profiling_choice(profiled),
        profiling_predicted_from=plan.predicted_from if plan else "",
        predicted_training_seconds=plan.predicted_training_s if plan else None,
        profiling_budget_seconds=plan.budget_s if plan else None,
        profiling_costs_predicted=dict(plan.costs_s) if plan else None,
    )


def profiling_choice(profiled: Profiled) -> str:
    """How the profile was made (`ClientReport.profiling_choice`)."""
    if profiled.plan is not None:
        return profiled.plan.choice
    extra = profiled.profile.extra
    return "model" if extra.get("predicted") is True else str(extra.get("order") or "")


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
    work = RoundWork(settings, instr, None, None, profile_cache=profile_cache)
    relation = usable_relation(instr, train_examples)
    profiled = measured_profile_step(work, relation)
    fastest = select(profiled.profile, relation, work.cap_at_start, rule=instr.relation_rule)
    return Plan.of(fastest, 0.0 if profiled.cached else float(profiled.profile.profiling_seconds or 0.0))
