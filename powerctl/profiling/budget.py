"""Profiling that pays for itself (docs/design/profiling-budget.md): the most thorough way (the instructed
order, `fitted`, or `predicted`, confirmed by the training's first steps) whose cost, predicted by walking the
profiler over a predicted profile (`ReplayBoard`), fits a share of the training it serves.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

from powerctl.devices.base import Device, PowerSampler, PowerSamples
from powerctl.errors import DeviceOutOfMemory, InfeasibleCapError
from powerctl.pinning.safety import restore_on_exit
from powerctl.profiling.fit import fit_profile
from powerctl.profiling.profiler import Profiler, StepFactory
from powerctl.records.profile import Profile, ProfilePoint
from powerctl.records.relation import DEFAULT_RELATION_RULE, RelationVector
from powerctl.records.workload import Workload
from powerctl.selection.joint import select

T = TypeVar("T")

PREDICTED = "predicted"  # the least way: the prediction's choice, confirmed by the training's first steps
FITTED = "fitted"
BOARD_MODEL = "the simulated board's model"  # `predicted_from` of a simulated board's prediction


class ReplayBoard(Device, PowerSampler):
    """A noiseless virtual board whose every step costs what `table` says (a pair not in it: out of memory),
    its own power sampler with one reading per step: the profiler walked over it costs what it predicts."""

    has_power_sensor = True

    def __init__(self, table: Profile, frequencies: Sequence[int]) -> None:
        self.board, self.spec = table.device, f"replay:{table.device}"
        self._points = {(p.batch_size, p.frequency_hz): p for p in (*table.predicted, *table.points)}
        self._table = sorted(frequencies)
        self._hz = self._table[-1]
        self._t = 0.0
        self.watts = 0.0
        self._samples: PowerSamples = []

    def _write_pin(self, hz: int) -> None:  # a board walked once: nothing to restore
        self._hz = hz

    def power_sampler(self, rate_hz: float) -> PowerSampler:
        return self

    def start(self) -> None:
        self._samples = [(self._t, self.watts)]

    def stop(self) -> PowerSamples:
        self._samples.append((self._t, self.watts))
        return self._samples

    def memory_bytes(self) -> int:
        return 0

    def clock(self) -> float:
        return self._t

    def run_step(self, fn: Callable[[], T], *, batch_size: int, workload: Workload) -> T:
        point = self._points.get((batch_size, self._hz))
        if point is None:
            raise DeviceOutOfMemory(f"the predicted profile has no batch size {batch_size} at {self._hz} Hz")
        result = fn()
        self._t += point.seconds_per_batch
        self.watts = point.peak_power_w
        self._samples.append((self._t, self.watts))
        return result


def completed(profile: Profile, frequencies: Sequence[int]) -> Profile | None:
    """A measured profile completed by the fit (a prediction, never a pin's input); None if unfittable."""
    try:
        fit = fit_profile(profile.points, max(frequencies))
    except ValueError:
        return None
    points = [
        profile.point(b, hz) or fit.predict(b, hz, profile.samples)
        for b in sorted(fit.utilisation)
        for hz in sorted(frequencies)
    ]
    return replace(profile, points=points, predicted=[], extra={**profile.extra, "completed_by_fit": True})


@dataclass(frozen=True)
class ProfilingRequest:
    """What a client's profiling is asked to do and what it is held to: `share` of the training it serves."""

    order: str  # the instructed order (efficient, grid, fitted)
    order_cap_w: float | None  # the cap the instructed order stops at
    batch_sizes: Sequence[int]  # those the relation vector also has are profiled
    samples: int  # samples per profiled point
    power_cap_w: float | None  # the cap the chosen pair must keep (the fitted and predicted ways stop at it)
    relation: RelationVector
    share: float  # profiling may cost at most this share of the predicted training, in (0, 1]
    max_samples: float | None = None  # the round's sample budget: the training predicted stops there
    max_training_s: float | None = None  # the round's device-s budget, likewise
    rule: str = DEFAULT_RELATION_RULE  # the relation rule the predicted way's choice is made by
    warmup_steps: int = 2
    measure_steps: int = 5

    def profiler(self, device: Device, workload: Workload, make_step: StepFactory) -> Profiler:
        """The profiler this request measures with (its samples, warm-up and measured steps)."""
        steps = {"warmup_steps": self.warmup_steps, "measure_steps": self.measure_steps}
        return Profiler(device, workload, make_step, samples=self.samples, **steps)

    def run(self, profiler: Profiler, way: str, sizes: Sequence[int]) -> Profile:
        """`way` profiled: the instructed order stops at its own cap, the others at the pair's."""
        return profiler.run(
            sizes,
            order=way,
            power_cap_w=self.order_cap_w if way == self.order else self.power_cap_w,
            relation=self.relation.as_map() if way == FITTED else None,
            progress=False,
        )


@dataclass(frozen=True)
class ProfilingPlan:
    """What a client predicted and chose before profiling, and what it spent (reported to the server)."""

    choice: str  # the way it profiled: the instructed order (efficient, grid), fitted, or predicted
    share: float
    predicted_training_s: float  # samples to the target × seconds per sample at the reference pair
    budget_s: float  # share × predicted_training_s
    costs_s: dict[str, float]  # each way's predicted device seconds (ways it could not predict: absent)
    reference: tuple[int, int]  # the (batch size, Hz) the training is predicted at
    predicted_from: str = ""  # where the predicted profile came from ("" without one)
    spent_s: float = 0.0  # device seconds profiling cost, the measured step included
    points: int = 0  # pairs measured, the measured step included

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"reference": list(self.reference)}

    def over_budget(self) -> str | None:
        return over_budget(self.choice, self.costs_s, self.budget_s, self.spent_s, self.predicted_training_s)


def over_budget(
    choice: str, costs_s: Mapping[str, float], budget_s: float, spent_s: float, training_s: float
) -> str | None:
    """Why profiling cost more than its budget, in one line (None: it did not)."""
    if spent_s <= budget_s:
        return None
    spent = f"profiling took {spent_s:.3g} s, over its {budget_s:.3g} s budget"
    predicted = costs_s.get(choice)
    if predicted is not None and predicted > budget_s:
        return (
            f"{spent} (a share of {training_s:.3g} s of training predicted): even the cheapest way, "
            f"{choice} ({predicted:.3g} s predicted), does not fit; a larger profiling-budget or a longer "
            "training makes room, a cached profile costs nothing"
        )
    if predicted is None:
        return (
            f"{spent} (a share of {training_s:.3g} s of training predicted): with no predicted profile of "
            f"this kind of board to cost the lighter ways, the least thorough one, {choice}, was taken"
        )
    return f"{spent}: {choice} was predicted to cost {predicted:.3g} s and cost more"


def choose_way(ways: Sequence[str], costs_s: Mapping[str, float], budget_s: float) -> str:
    """The first (most thorough) of `ways` predicted to fit the budget; else the last (the least)."""
    return next((way for way in ways if way in costs_s and costs_s[way] <= budget_s), ways[-1])


CONFIRM_KEY = "confirm"  # `Profile.extra` key of the predicted way's profile: where its choice is measured
IN_TRAINING = "training"  # by the training's first steps (`powerctl.selection.confirm`)


def confirmed_in_training(profile: Profile) -> bool:
    """Whether `profile` is the predicted way's, whose choice the training's first steps measure."""
    return profile.extra.get("order") == PREDICTED and profile.extra.get(CONFIRM_KEY) == IN_TRAINING


def still_enough(
    profile: Profile,
    ways: Sequence[str],
    relation: RelationVector,
    power_cap_w: float | None,
    share: float,
    *,
    max_samples: float | None = None,
    max_training_s: float | None = None,
    rule: str = DEFAULT_RELATION_RULE,
) -> bool:
    """Whether a cached predicted-way profile is still all this task's budget pays for (its plan's costs)."""
    plan = profile.extra.get("budget")
    if not isinstance(plan, dict) or not isinstance(plan.get("costs_s"), dict):
        return True  # nothing to weigh with: kept, as every cached profile is
    try:
        sel = select(profile, relation, power_cap_w, rule=rule)
    except InfeasibleCapError:
        return False
    point = profile.point(sel.batch_size, sel.frequency_hz)
    assert point is not None  # selection picks measured points only
    training = predicted_training_s(relation.samples_map(), point, max_samples, max_training_s)
    costs = {w: float(c) for w, c in plan["costs_s"].items() if w != PREDICTED}
    return choose_way([*ways, PREDICTED], costs, share * training) == PREDICTED


def predicted_training_s(
    samples_to_target: Mapping[int, float],
    point: ProfilePoint,
    max_samples: float | None,
    max_training_s: float | None,
) -> float:
    """Seconds to train to the target at `point`, within the round's sample and device-s budgets."""
    b = point.batch_size
    samples = min(samples_to_target[b], max_samples or math.inf)
    seconds = samples * point.seconds_per_batch / b
    return min(seconds, max_training_s or math.inf)


def profile_within_budget(
    device: Device,
    workload: Workload,
    make_step: StepFactory,
    request: ProfilingRequest,
    *,
    prediction: Profile | None,
    predicted_from: str = "",
    reference_hz: int | None = None,
) -> tuple[Profile, ProfilingPlan]:
    """Profile the most thorough way within `request.share` of the predicted training (no `prediction`:
    one step at `reference_hz`, default the lowest, predicts it); its `extra["budget"]` is the plan."""
    order, power_cap_w, relation = request.order, request.power_cap_w, request.relation
    table = device.frequencies()
    sizes = sorted(set(request.batch_sizes) & set(relation.batch_sizes), reverse=True)
    profiler = request.profiler(device, workload, make_step)  # refuses a device without a knob or sensor
    ways = [order] + [w for w in (FITTED, PREDICTED) if w != order]
    if prediction is not None:
        prediction = replace(prediction, points=[p for p in prediction.points if p.batch_size in sizes])
    with restore_on_exit(device):
        start = device.clock()
        ref_point: ProfilePoint | None = None
        if prediction is not None and prediction.points:
            with contextlib.suppress(InfeasibleCapError):
                sel = select(prediction, relation, power_cap_w, rule=request.rule)
                ref_point = prediction.point(sel.batch_size, sel.frequency_hz)
        else:
            prediction = None
            ways = [w for w in ways if w != PREDICTED]
            hz = reference_hz if reference_hz is not None else table[0]
            ref_point = next((p for b in sizes if (p := profiler.measure(b, hz)) is not None), None)
        spent = device.clock() - start
        if ref_point is None:  # nothing fits where it was tried: profile as instructed, nothing to weigh
            ways, training, costs = [order], 0.0, {}
            reference = (sizes[-1], table[-1])
        else:
            reference = (ref_point.batch_size, ref_point.frequency_hz)
            training = predicted_training_s(
                relation.samples_map(), ref_point, request.max_samples, request.max_training_s
            )
            costs = _costs(ways, prediction, ref_point, spent, workload, request, table, sizes)
        budget = request.share * training
        choice = choose_way(ways, costs, budget)
        if choice == PREDICTED:
            assert prediction is not None
            head = {"order": PREDICTED, CONFIRM_KEY: IN_TRAINING, "power_cap_w": power_cap_w}
            profile = profiler.profile(
                prediction.points, head | {"predicted_from": predicted_from}, profiling_s=0.0
            )
        else:
            profile = request.run(profiler, choice, sizes)
        measured_step = prediction is None and training > 0
        profile.profiling_s = device.clock() - start
        plan = ProfilingPlan(
            choice=choice,
            share=request.share,
            predicted_training_s=training,
            budget_s=budget,
            costs_s=costs,
            reference=reference,
            predicted_from=predicted_from if prediction is not None else "",
            spent_s=profile.profiling_s,
            points=(0 if choice == PREDICTED else len(profile.points)) + int(measured_step),
        )
        profile.extra["budget"] = plan.to_dict()
        return profile, plan


def _costs(
    ways: list[str],
    prediction: Profile | None,
    ref_point: ProfilePoint,
    spent: float,
    workload: Workload,
    request: ProfilingRequest,
    table: list[int],
    sizes: list[int],
) -> dict[str, float]:
    """Each way's predicted device seconds (without a prediction: the measured step and a grid bound)."""
    if prediction is None:  # the whole grid scaled from the measured step, step time ∝ b / f
        per_step = ref_point.seconds_per_batch / ref_point.batch_size * ref_point.frequency_hz
        steps = request.warmup_steps + request.measure_steps
        bound = spent + sum(steps * per_step * b / hz for b in sizes for hz in table)
        return {} if request.order == FITTED else {request.order: bound}

    def walked(way: str) -> float:  # the profiler walked over the board the prediction describes
        profiler = request.profiler(ReplayBoard(prediction, table), workload, lambda _b: lambda: None)
        return float(request.run(profiler, way, sizes).profiling_s or 0.0)

    return {way: 0.0 if way == PREDICTED else walked(way) for way in ways}
