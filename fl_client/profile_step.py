"""A round's profile step: the device's profile of the step that will train, and what the report says;
profiles on disk, one per (board, model, input shape, batch sizes, profiler settings, code version), an
entry trusted only if it loads as a valid profile carrying the key it was stored under."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from powerctl.devices.base import Device
from powerctl.devices.boards import board_model, board_names
from powerctl.devices.simulated import SimulatedBoard, predicted_profile
from powerctl.errors import FileFormatError, InfeasibleCapError
from powerctl.files.cache import cache_dir as default_cache_dir
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
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.records.workload import Workload
from powerctl.selection.baselines import board_fixed_frequency
from powerctl.selection.capsource import CapSource
from powerctl.selection.methods import method_named
from powerfed.training.finetune_records import DEFAULT_MAX_EPOCHS
from strategies.protocol import TrainInstructions
from strategies.report import Profiling

if TYPE_CHECKING:
    from fl_client.round import RoundWork

log = logging.getLogger(__name__)

PROFILE_CACHE_VERSION = 1  # bump when a code change alters what a profile would measure


@dataclass(frozen=True)
class ProfileKey:
    """Everything that decides a profile's content."""

    device_kind: str  # backend and board, e.g. SimulatedBoard/jetson-nano
    model: str
    overrides: str
    num_classes: int
    input_shape: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    order: str
    power_cap_w: float | None  # only for the orders that depend on the cap; None for the full grid
    samples: int
    warmup_steps: int
    measure_steps: int
    relation: str | None = None  # only for the fitted order: the (b, r_b) pairs as JSON
    step: str = ""  # "" for the built-in fine-tune's step, else the user's step key (`fl_client.session`)

    def steps(self) -> dict[str, int]:
        """How each pair is measured, as `Profiler` and `ProfilingRequest` take it."""
        return {name: getattr(self, name) for name in ("samples", "warmup_steps", "measure_steps")}

    def digest(self) -> str:
        from powerfed.training.numerics import torch_minor

        # no relation (not the fitted order) or step (the built-in one): the keys they had without them
        fields = {k: v for k, v in asdict(self).items() if v or k not in ("relation", "step")}
        fields["cache_version"] = PROFILE_CACHE_VERSION
        try:  # a new release never trusts an older release's profiles
            fields["code_version"] = version("powerfed")
        except PackageNotFoundError:
            fields["code_version"] = "unknown"
        fields["torch"] = torch_minor()
        blob = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


def _path(key: ProfileKey, cache_dir: Path | None) -> tuple[Path, str]:
    digest = key.digest()
    return (cache_dir or default_cache_dir("profile")) / f"profile-{digest[:40]}.json", digest


def lookup(key: ProfileKey, cache_dir: Path | None = None) -> Profile | None:
    """The profile cached under `key`, or None (none, or one that cannot be trusted: one warning line)."""
    path, digest = _path(key, cache_dir)
    if not path.is_file():
        return None
    try:
        profile = Profile.load(path)
    except FileFormatError as exc:
        log.warning("profile cache: %s; profiling again", exc)
        return None
    board = key.device_kind.split("/", 1)[-1]
    if (
        profile.extra.get("cache_key") != digest
        or profile.model != key.model
        or profile.device != board
        or tuple(profile.input_shape) != key.input_shape
        or not set(profile.batch_sizes()) <= set(key.batch_sizes)
    ):
        log.warning("profile cache: %s does not match this device and model; profiling again", path)
        return None
    return profile


def store(key: ProfileKey, profile: Profile, cache_dir: Path | None = None) -> None:
    """Cache `profile` under `key` (with the key it was stored under and the device kind it is of)."""
    path, digest = _path(key, cache_dir)
    profile.extra["cache_key"] = digest
    profile.extra["device_kind"] = key.device_kind
    profile.save(path)


def cached_profile(
    key: ProfileKey, measure: Callable[[], Profile], cache_dir: Path | None = None
) -> tuple[Profile, bool]:
    """(profile, True) from the cache, or (measure(), False) after storing it under `key`."""
    if (profile := lookup(key, cache_dir)) is not None:
        return profile, True
    profile = measure()
    store(key, profile, cache_dir)
    return profile, False


MEASURED_ORDERS = ("grid", "efficient", "fitted")


def same_kind_profiles(
    device_kind: str, workload: dict[str, Any], cache_dir: Path | None = None
) -> list[tuple[Path, Profile]]:
    """Measured profiles of this board kind and workload in the cache, whatever their cap or order."""
    found = []
    for path in sorted((cache_dir or default_cache_dir("profile")).glob("profile-*.json")):
        try:
            profile = Profile.load(path)
        except FileFormatError:
            continue
        extra = profile.extra
        if (
            extra.get("device_kind") == device_kind
            and extra.get("workload") == workload
            and extra.get("order") in MEASURED_ORDERS
        ):
            found.append((path, profile))
    return sorted(found, key=lambda item: (-len(item[1].points), str(item[0])))


@dataclass(frozen=True)
class Profiled:
    """What the profile step produced; `restored`: the line said when a killed process left a board pinned."""

    profile: Profile
    cached: bool
    board: str
    restored: str = ""
    plan: ProfilingPlan | None = None

    def outcome(self, power_aware: bool, stand_in: bool) -> Profiling:
        """What the report says of this profile: its cost, charged only to a power-aware method for a
        profile measured this round."""
        profile, plan, extra = self.profile, self.plan, self.profile.extra
        charged = power_aware and not self.cached and not stand_in
        seconds = float(profile.profiling_s or 0.0) if charged else 0.0
        points = 0 if stand_in or confirmed_in_training(profile) else len(profile.points)
        if plan is None:
            way = "model" if extra.get("predicted") is True else str(extra.get("order") or "")
            return Profiling(seconds, self.cached, points, way)
        budget = (plan.predicted_from, plan.predicted_training_s, plan.budget_s, dict(plan.costs_s))
        return Profiling(seconds, self.cached, points, plan.choice, *budget)


def profile_order(instr: TrainInstructions, caps: CapSource) -> tuple[str, float | None]:
    """(order, the cap the order stops at); a cap that changes may rise above today's: the whole grid."""
    if not caps.is_constant:
        return "grid", None
    cap = caps.cap_at(0.0)
    order = instr.profile_order if cap is not None or instr.profile_order == "fitted" else "grid"
    return order, (cap if order in ("efficient", "fitted") else None)


def budgeted(work: RoundWork) -> bool:
    """Whether this round's profiling is held to a share of its predicted training."""
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
    """The device's profile for this step, from the cache or measured now (and cached)."""
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

        step_factory = partial(step.build, dev)  # profiling trains its own copy of the weights
        if budgeted(work):
            return budgeted_profile(work, dev, key, relation, step_factory)
        if not method_named(instr.method).power_aware and isinstance(dev, SimulatedBoard):
            # a baseline does not profile: a simulated board's model is read, not measured
            model, _ = _prediction(work, dev, key, step_factory()[0], relation)
            assert model is not None  # a simulated board always has its model
            return Profiled(model, False, dev.board, dev.recovered or "")

        def measure() -> Profile:
            workload, make_step = step_factory()
            profiler = Profiler(dev, workload, make_step, **key.steps())
            return profiler.run(
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
    """Profiling that pays for itself (`powerctl.profiling.budget`): a profile cached by any way costs
    nothing; else one measured step predicts the training, and the most thorough way within
    `profiling-budget` of it is profiled."""
    instr, cap = work.instr, work.cap_at_start
    rmap = json.dumps(sorted(relation.as_map().items()))
    keys = {
        key.order: key,
        FITTED: replace(key, order=FITTED, power_cap_w=cap, relation=rmap),
        PREDICTED: replace(key, order=PREDICTED, power_cap_w=cap, relation=f"{rmap} {instr.relation_rule}"),
    }
    restored = dev.recovered or ""
    max_samples = instr.budget_samples or DEFAULT_MAX_EPOCHS * (work.train_examples or 0)
    max_training_s = instr.budget_device_s or None
    for way, way_key in keys.items():
        profile = lookup(way_key, work.profile_cache)
        if profile is not None and (
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
        ):
            return Profiled(profile, True, dev.board, restored)
    workload, make_step = step_factory()
    prediction, source = _prediction(work, dev, key, workload, relation)
    request = ProfilingRequest(
        order=key.order,
        order_cap_w=key.power_cap_w,
        batch_sizes=relation.batch_sizes,
        power_cap_w=cap,
        relation=relation,
        share=instr.profiling_budget,
        max_samples=max_samples,
        max_training_s=max_training_s,
        rule=instr.relation_rule,
        **key.steps(),
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


def _prediction(
    work: RoundWork, dev: Device, key: ProfileKey, workload: Workload, relation: RelationVector
) -> tuple[Profile | None, str]:
    """The board's predicted profile and where it came from: a simulated board's model, else a measured
    profile of the same kind of board and workload in the cache, completed by the fit (None: none)."""
    if isinstance(dev, SimulatedBoard):
        samples = work.instr.profile_samples
        return predicted_profile(dev.board, workload, relation.batch_sizes, samples), BOARD_MODEL
    for path, measured in same_kind_profiles(key.device_kind, workload.to_dict(), work.profile_cache):
        if (full := completed(measured, dev.frequencies())) is not None:
            order = measured.extra.get("order")
            return full, f"the {order} profile of a {key.device_kind} measured earlier ({path.name})"
    return None, ""


def _reference_hz(dev: Device, cap: float | None) -> int | None:
    """Where one step is measured when nothing predicts the board: the state of practice's frequency for
    the cap, else the lowest (None); unpinnable: the clock in force."""
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
