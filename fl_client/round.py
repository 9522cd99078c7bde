"""One client round, Flower-free: profile → choose → pin and train → report (`run_round`); its callers
(the ClientApp, the demo, the benches, the fleet runner) differ only by their steps (`RoundSteps`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time
import zlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from fl_client.clientapp_entry import COMMAND as CLIENTAPP_COMMAND
from fl_client.node import NodeSettings
from fl_client.pinning import Pinning, Trained, pinned
from fl_client.profile_step import Profiled, measured_profile_step
from powerctl.devices import open_device
from powerctl.devices.base import Device
from powerctl.errors import PowerctlError
from powerctl.files.cache import cache_dir
from powerctl.procs import seconds_since_start
from powerctl.profiling.profiler import StepFactory
from powerctl.records.pick import Pick
from powerctl.records.profile import Profile
from powerctl.records.relation import DEFAULT_RELATION_RULE, RelationVector
from powerctl.records.workload import Workload
from powerctl.selection.capsource import CapSource, ConstantCap
from powerctl.selection.joint import select
from powerctl.selection.methods import MethodContext, method_named
from powerfed.training.checkpoint import Checkpointing
from powerfed.training.errors import DataError, ModelError
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import FineTuneCallbacks, FineTuneConfig
from powerfed.training.models import build_model, check_data_fits, get_model_spec
from strategies.protocol import TrainInstructions
from strategies.report import ClientReport, Plan, Training

__all__ = [
    "CapRule",
    "Chosen",
    "ClientWorkError",
    "MethodRule",
    "Pinning",
    "Prepared",
    "Profiled",
    "ProfiledStep",
    "RoundOutcome",
    "RoundSteps",
    "RoundWork",
    "State",
    "TrainStep",
    "Trained",
    "build_local_model",
    "fine_tune_step",
    "measured_profile_step",
    "method_step",
    "model_seq_len",
    "node_device_seed",
    "plan_round",
    "run_round",
    "usable_relation",
]

if TYPE_CHECKING:
    from powerfed.training.data import Dataset

State = dict[str, torch.Tensor]


class ClientWorkError(PowerctlError):
    """This round cannot run on this node as instructed (no usable batch size, no knob, ...)."""


def node_device_seed(settings: NodeSettings, server_seed: int) -> int:
    """A simulated board's noise seed: stable per node (not per node id, which changes every run)."""
    return (server_seed * 1_000_003 + zlib.crc32(settings.key.encode())) % (2**31)


@dataclass(frozen=True)
class ProfiledStep:
    """The step that will train, as a round profiles it: `build(device)` gives its workload and batch size
    → one step, on its own copy of the model; `model`, `input_shape` and `key` name it in the cache."""

    model: str
    input_shape: tuple[int, ...]
    build: Callable[[Device], tuple[Workload, StepFactory]]
    key: str = ""


@dataclass(frozen=True)
class RoundWork:
    """One round's work on one node: who it is, what the server asked, its weights and local data."""

    settings: NodeSettings
    instr: TrainInstructions
    state: State | None  # the server's weights; None: a planning query (profiles, does not train)
    data: tuple[Dataset, Dataset] | None
    device_seed: int = 0
    profile_cache: Path | None = None
    on_step: Callable[[int, int], None] | None = None
    caps: CapSource = field(default=None)  # type: ignore[assignment]
    step: ProfiledStep | None = None  # None: the built-in fine-tune's (`profiled_step`); a user's loop's own
    examples: int | None = None  # training samples when `data` is not ours to hold (a user's loop)

    def __post_init__(self) -> None:
        if self.caps is None:  # the server's constant for this round when it sets one, else the node's own
            cap = self.instr.power_cap_w
            object.__setattr__(self, "caps", self.settings.caps() if cap is None else ConstantCap(cap))

    @property
    def train_examples(self) -> int | None:
        """This node's training samples (None: a planning query, which has no data)."""
        return len(self.data[0]) if self.data is not None else self.examples

    def profiled_step(self) -> ProfiledStep:
        """The step profiled: a user's loop's own, else the built-in fine-tune's on the server's model."""
        if self.step is not None:
            return self.step
        from powerfed.training.profiling import profiling_step_factory

        instr = self.instr
        spec = get_model_spec(instr.model)
        shape = (
            (model_seq_len(instr.model, instr.model_overrides),) if spec.task == "text" else spec.input_shape
        )

        def build(dev: Device) -> tuple[Workload, StepFactory]:
            return profiling_step_factory(
                instr.model,
                model=self.model().to(dev.torch_device()),
                num_classes=instr.num_classes,
                torch_device=dev.torch_device(),
                seed=instr.seed,
            )

        return ProfiledStep(instr.model, tuple(shape), build)

    def device(self) -> Device:
        """A fresh handle on this node's device (a simulated board's noise depends on no earlier step)."""
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


def usable_relation(instr: TrainInstructions, train_examples: int) -> RelationVector:
    """The relation restricted to batch sizes this node's train split can fill at least once."""
    relation = instr.relation_vector
    keep = [b for b in relation.batch_sizes if b <= train_examples]
    if not keep:
        raise ClientWorkError(
            f"this node has {train_examples} training samples, fewer than the smallest batch size "
            f"{min(relation.batch_sizes)} of the relation vector; give it more data or smaller batch sizes"
        )
    return relation.restricted(keep)


class CapRule(Protocol):
    """A method's rule bound to one profile, as a function of the cap alone: what it pins under a constant
    cap, and what a follower re-applies when the cap changes. `relation` is what it predicts progress by."""

    # read-only: a frozen dataclass (`MethodRule`) is a rule
    @property
    def profile(self) -> Profile: ...
    @property
    def relation(self) -> RelationVector: ...

    def __call__(self, power_cap_w: float | None) -> Pick: ...


@dataclass(frozen=True)
class MethodRule:
    """The instructed method's rule (the registry's method of that name) over one profile."""

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


@dataclass(frozen=True)
class Chosen:
    """The rule the train step applies; a step that trained to choose (the oracle's search) hands on its
    `runs` by pair (the chosen one is not run again) and what it measured (`bench`)."""

    rule: CapRule
    runs: dict[tuple[int, int], Trained] = field(default_factory=dict)
    bench: object = None


ProfileStep = Callable[[RoundWork, RelationVector], Profiled]
TrainStep = Callable[[RoundWork, CapRule], Trained]
ChooseStep = Callable[[RoundWork, Profile, RelationVector, TrainStep], Chosen]


def method_step(work: RoundWork, profile: Profile, relation: RelationVector, train: TrainStep) -> Chosen:
    """The instructed method's rule (an oracle without its search predicts by the proxy's relation)."""
    instr = work.instr
    own = relation if method_named(instr.method).searches_own_data else None
    return Chosen(MethodRule(instr.method, profile, relation, own, instr.deadline_s, instr.relation_rule))


def round_checkpoint(work: RoundWork, pair: tuple[int, int]) -> Checkpointing | None:
    """This node's checkpoint of this round's fine-tune, keyed by the instructions, the node and the first
    pair (not Flower's ids: the same round re-sent by a restarted ServerApp resumes)."""
    instr, settings = work.instr, work.settings
    if not instr.checkpoint_every_samples:
        return None
    what = {"instructions": dict(instr.to_config()), "node": settings.key, "pair": list(pair)}
    key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", settings.key)[:80]
    path = cache_dir("checkpoints") / f"finetune-{name}-{zlib.crc32(settings.key.encode()):08x}.safetensors"
    return Checkpointing(path, every_samples=instr.checkpoint_every_samples, key=key)


def fine_tune_step(
    work: RoundWork, rule: CapRule, *, observe: Callable[[Device], AbstractContextManager[Any]] | None = None
) -> Trained:
    """Fine-tune the server's weights, checkpointed, under the rule as `Pinning` holds it; `observe(device)`
    is entered around it (a bench records the board's power with it)."""
    instr = work.instr
    train, test = work.split()
    model = work.model()
    with pinned(work, rule, observe) as (dev, pinning):
        model = model.to(dev.torch_device())
        config = FineTuneConfig(
            batch_size=pinning.batch_size,
            lr=instr.lr_for,
            target_accuracy=instr.target_accuracy,
            max_samples=instr.budget_samples or None,
            max_device_s=instr.budget_device_s or None,
            eval_every_samples=instr.eval_every_samples,
            eval_max_samples=instr.eval_max_samples,
            seed=instr.seed,
        )
        callbacks = FineTuneCallbacks(
            progress=False,
            checkpoint=round_checkpoint(work, (pinning.choice.batch_size, pinning.choice.frequency_hz)),
            hooks=pinning.hooks,
            on_step=work.on_step,
        )
        result = fine_tune(model, train, test, config, device=dev, callbacks=callbacks)
        state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
        return pinning.trained(result, state, dev.board)


@dataclass(frozen=True)
class RoundSteps:
    """The three steps of a round."""

    profile: ProfileStep = measured_profile_step
    choose: ChooseStep = method_step
    train: TrainStep = fine_tune_step

    @classmethod
    def for_instructions(cls, instr: TrainInstructions) -> RoundSteps:
        """The production round's steps; instructions that need the fleet runner's are refused."""
        searches = method_named(instr.method).searches_own_data
        if instr.stand_in or instr.profile_source == "predicted" or searches:
            raise ClientWorkError(
                "these instructions ask for the fleet runner's steps (scale mode, predicted profiles or "
                "the oracle's search), which only its ClientApp has (simulations.fleet_client:app, what "
                "`python -m simulations` runs): run them there, or send measured, trained rounds"
            )
        return cls()


@dataclass
class RoundOutcome:
    """What a round produced, for callers that need more than the report (the demo, the benches)."""

    report: ClientReport
    chosen: Chosen
    trained: Trained


def message_process_startup_s() -> float | None:
    """Seconds since this process started where it serves one message (a deployed `flwr-clientapp`), the
    start-up the round cost; None where a process serves many (simulation, a test, a user's script)."""
    if os.path.basename(sys.argv[0]) != CLIENTAPP_COMMAND:
        return None
    startup = seconds_since_start(os.getpid())
    return None if startup is None else round(startup, 2)


@dataclass(frozen=True)
class Prepared:
    """A round profiled and its rule chosen (the built-in round and a user's loop alike)."""

    work: RoundWork
    profiled: Profiled
    chosen: Chosen
    wall_start: float
    startup_s: float | None

    @classmethod
    def of(cls, work: RoundWork, steps: RoundSteps) -> Prepared:
        """Profile (or read the cache) and choose, over the batch sizes this node's data can fill."""
        wall_start = time.perf_counter()
        instr, examples = work.instr, work.train_examples or 0
        relation = instr.relation_vector if instr.stand_in else usable_relation(instr, examples)
        startup_s = message_process_startup_s()  # the first profiling or training step comes next
        profiled = steps.profile(work, relation)
        chosen = steps.choose(work, profiled.profile, relation, steps.train)
        return cls(work, profiled, chosen, wall_start, startup_s)

    def report(self, trained: Trained) -> ClientReport:
        """The round's report: the round's own fields, and the records its steps wrote."""
        work, profiled, instr, choice = self.work, self.profiled, self.work.instr, trained.choice
        wall_s = time.perf_counter() - self.wall_start
        point = profiled.profile.point(choice.batch_size, choice.frequency_hz)
        peak = choice.peak_power_w or (point.peak_power_w if point is not None else 0.0)
        return ClientReport(
            work.settings.device,
            work.cap_at_start,
            choice.batch_size,
            choice.frequency_hz,
            Training.of(trained.result, stand_in=trained.stand_in),
            profiled.outcome(method_named(instr.method).power_aware, trained.stand_in),
            trained.cap,
            trained.step_downs,
            board=trained.board,
            node_key=work.settings.key,
            predicted_s=choice.predicted_s or 0.0,
            profiled_peak_power_w=peak or 0.0,
            train_examples=work.train_examples or 0,
            wall_s=wall_s,
            startup_s=self.startup_s,
            method=instr.method,
            deadline_s=instr.deadline_s if choice.meets_deadline is not None else None,
            meets_deadline_predicted=choice.meets_deadline,
            pinned=trained.pinned,
            restored=profiled.restored,
        )


def run_round(work: RoundWork, steps: RoundSteps | None = None) -> RoundOutcome:
    """Profile → choose → pin and train → report, with the steps given (default: the production round's)."""
    steps = steps or RoundSteps.for_instructions(work.instr)
    instr, train, spec = work.instr, work.split()[0], get_model_spec(work.instr.model)
    check_data_fits(spec, train, "this node's data")
    if train.num_classes > instr.num_classes:
        raise DataError(
            f"this node's data has {train.num_classes} classes, the model {instr.num_classes} outputs"
        )
    prepared = Prepared.of(work, steps)
    chosen, trained = prepared.chosen, None
    if chosen.runs and work.caps.is_constant:  # the chosen pair was measured while choosing
        c = chosen.rule(work.cap_at_start)
        trained = chosen.runs.get((c.batch_size, c.frequency_hz))
        if trained is not None:
            trained = replace(trained, choice=c)
    if trained is None:
        trained = steps.train(work, chosen.rule)
    return RoundOutcome(prepared.report(trained), chosen, trained)


def plan_round(
    settings: NodeSettings,
    instr: TrainInstructions,
    train_examples: int,
    *,
    profile_cache: Path | None = None,
) -> Plan:
    """A planning query: this node's fastest pair under its cap and its predicted time to the target."""
    work = RoundWork(settings, instr, None, None, profile_cache=profile_cache)
    relation = usable_relation(instr, train_examples)
    profiled = measured_profile_step(work, relation)
    fastest = select(profiled.profile, relation, work.cap_at_start, rule=instr.relation_rule)
    return Plan.of(fastest, 0.0 if profiled.cached else float(profiled.profile.profiling_s or 0.0))
