"""The fleet runner's and the benches' own round steps (`fl_client.round.RoundSteps`), never the production
round's: scale mode's predicted profile and stand-in, and the oracle's own-data search."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import lru_cache, partial

from fl_client.round import (
    CapRule,
    Chosen,
    ClientWorkError,
    MethodRule,
    Profiled,
    RoundSteps,
    RoundWork,
    Trained,
    TrainStep,
    fine_tune_step,
    measured_profile_step,
    method_step,
)
from powerctl.devices.boards import board_model
from powerctl.devices.simulated import SimulatedBoard, predicted_profile, replay_cost, step_cost
from powerctl.records.pick import Pick
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.records.workload import Workload
from powerctl.selection.capsource import ConstantCap
from powerctl.selection.joint import best_frequency_per_batch
from powerctl.selection.methods import method_named
from powerctl.selection.names import ORACLE
from powerfed.training.crossing import run_dense
from powerfed.training.evaluation import evaluate_with_loss
from powerfed.training.finetune_records import FineTuneResult
from powerfed.training.models import build_model, get_model_spec, model_workload
from simulations.bench_report import BenchReport
from strategies.protocol import TrainInstructions
from strategies.rounds import STAND_IN


def round_steps(instr: TrainInstructions) -> RoundSteps:
    """The steps the instructions ask for: the fleet's where only it does that, else the production's."""
    return RoundSteps(
        profile=predicted_profile_step if instr.profile_source == "predicted" else measured_profile_step,
        choose=oracle_search
        if method_named(instr.method).searches_own_data and not instr.stand_in
        else method_step,
        train=stand_in_step if instr.stand_in else fine_tune_step,
    )


@lru_cache(maxsize=16)
def board_prediction(
    board: str, model: str, overrides: str, num_classes: int | None, sizes: tuple[int, ...], samples: int
) -> Profile:
    """A simulated board's model profile (also the figures' map), once per board, model and settings."""
    return predicted_profile(board, _workload(model, overrides, num_classes), sizes, samples)


@lru_cache(maxsize=16)
def _workload(model: str, overrides: str, num_classes: int | None) -> Workload:
    """The model's training FLOPs and memory per sample, counted once per process (a few seconds)."""
    net = build_model(model, num_classes, seed=0, **json.loads(overrides))
    return model_workload(model, net, num_classes)


def predicted_profile_step(work: RoundWork, relation: RelationVector) -> Profiled:
    """A simulated board's model profile: no device time (scale mode)."""
    instr = work.instr
    with work.device() as dev:
        if not isinstance(dev, SimulatedBoard):
            raise ClientWorkError(f"predicted profiles need a simulated board (sim:...), not {dev.spec}")
        profile = board_prediction(
            dev.board, instr.model, instr.overrides_text(), instr.num_classes, tuple(relation.batch_sizes),
            instr.profile_samples,
        )  # fmt: skip
        return Profiled(profile, True, dev.board, dev.recovered or "")


PRUNE_MARGIN = 0.25
"""A pruned search stops a batch size's run this share past the samples that would tie the fastest measured
so far (past that it cannot be chosen), on the evaluation grid plus one interval (the crossing is read
between evaluations)."""


def oracle_search(
    work: RoundWork, profile: Profile, relation: RelationVector, train: TrainStep, prune: bool = True
) -> Chosen:
    """The oracle: fine-tune the client's own data at every batch size (at its fastest feasible frequency
    under the cap; under a changing cap, the lowest), and select by Algorithm 1 with the interpolated
    samples to the target (`run_dense`). Misses are left out unless none reached it. Pruned (the fleet's):
    batch sizes run fastest-predicted first, a run stops `PRUNE_MARGIN` past a tie with the fastest so far
    and is reported apart (`oracle_stopped_at_samples`); a run that reaches the target is the unpruned run."""
    cap = work.cap_at_start if work.caps.is_constant else None
    if work.caps.is_constant:
        points = best_frequency_per_batch(profile, cap)
    else:
        lowest = profile.frequencies()[0]
        points = {b: p for b in profile.batch_sizes() if (p := profile.point(b, lowest)) is not None}
    r = relation.as_map()
    order = sorted((b for b in points if b in r), key=lambda b: (r[b] * points[b].seconds_per_batch / b, -b))
    search_work = replace(work, caps=ConstantCap(cap), on_step=None)
    runs: dict[tuple[int, int], Trained] = {}
    samples: dict[int, float] = {}
    missed: dict[int, float] = {}
    stopped: dict[int, float] = {}
    spent_s = 0.0
    fastest_s = math.inf  # the fastest measured batch size's samples to target × its seconds per sample
    every, budget_samples = work.instr.eval_every_samples, work.instr.budget_samples
    for b in order:
        hz, per_sample_s = points[b].frequency_hz, points[b].seconds_per_batch / b
        stop_at = None
        if prune and math.isfinite(fastest_s):
            stop_at = (math.ceil(fastest_s / per_sample_s * (1 + PRUNE_MARGIN) / every) + 1) * every
        if stop_at is not None and budget_samples and stop_at >= budget_samples:
            stop_at = None  # the budget stops it first
        budget = stop_at or budget_samples
        rule = PinnedRule(b, hz, profile, relation)
        tried: dict[int, Trained] = {}

        def run(
            every: int, rule: PinnedRule = rule, tried: dict[int, Trained] = tried, budget: int = budget
        ) -> FineTuneResult:
            instr = replace(work.instr, eval_every_samples=every, budget_samples=budget)
            tried[every] = train(replace(search_work, instr=instr), rule)
            return tried[every].result

        result, crossing, _ = run_dense(
            run, batch_size=b, eval_every_samples=every, target=work.instr.target_accuracy
        )
        spent_s += sum(t.result.device_s for t in tried.values())
        if every in tried and (stop_at is None or result.reached):  # a run like any method's: reusable
            runs[(b, hz)] = tried[every]
        # samples to target: the interpolated crossing (0 before training: about nothing, 1 sample)
        if result.reached and crossing is not None:
            samples[b] = max(crossing, 1.0)
            fastest_s = min(fastest_s, samples[b] * per_sample_s)
        elif stop_at is not None and result.samples >= stop_at:
            stopped[b] = float(result.samples)
        else:
            missed[b] = max(float(result.samples), 1.0)
    if not samples and not missed:
        raise ClientWorkError(f"oracle: no profiled batch size is feasible under the cap {cap}")
    own = RelationVector.from_samples(
        work.instr.model, "own data", work.instr.target_accuracy, samples or missed
    )
    chosen = MethodRule(ORACLE, profile, relation, own, work.instr.deadline_s, work.instr.relation_rule)
    measured = BenchReport(
        oracle_samples_to_target={str(b): s for b, s in own.samples_map().items()},
        oracle_search_device_s=spent_s,
        oracle_stopped_at_samples={str(b): s for b, s in sorted(stopped.items())} or None,
    )
    return Chosen(chosen, runs=runs, bench=measured)


full_oracle_search = partial(oracle_search, prune=False)
"""The oracle's search in full (the demo's: it shows every batch size's own-data samples)."""


@dataclass(frozen=True)
class PinnedRule:
    """A rule that picks a fixed pair whatever the cap (the oracle's search runs, a bench's policy)."""

    batch_size: int
    frequency_hz: int
    profile: Profile
    relation: RelationVector
    method: str = ORACLE

    def __call__(self, power_cap_w: float | None) -> Pick:
        return Pick(self.batch_size, self.frequency_hz, method=self.method)


def stand_in_step(work: RoundWork, rule: CapRule) -> Trained:
    """Scale mode's stand-in: real selection, no training. The board model charges the steps the proxy's
    samples to target need at the chosen pair (within the budget); the weights go back unchanged, the
    accuracy is theirs on the local test split."""
    instr = work.instr
    _, test = work.split()
    choice = rule(work.cap_at_start)
    profile = rule.profile
    task = get_model_spec(instr.model).task
    accuracy, _ = evaluate_with_loss(work.model(), task, test.x, test.y) if len(test) else (0.0, 0.0)
    b, hz = choice.batch_size, choice.frequency_hz
    workload = Workload(**profile.extra["workload"])
    sim = board_model(profile.device)
    need = 0.0 if accuracy >= instr.target_accuracy else rule.relation.samples_map()[b]
    samples = min(need, instr.budget_samples or math.inf)
    steps = math.ceil(samples / b)
    cost = step_cost(sim, workload, b, hz)
    if instr.budget_device_s and steps * cost.seconds > instr.budget_device_s:
        steps = int(instr.budget_device_s // cost.seconds)
    seconds, energy = replay_cost(sim, workload, b, steps, hz)
    reached = need == 0.0 or steps * b >= need
    result = FineTuneResult(
        reached=reached,
        samples=steps * b,
        device_s=seconds,
        energy_j=energy,
        peak_power_w=cost.peak_w if steps else None,
        mean_power_w=None,
        final_accuracy=accuracy,
        curve=[],
        batch_size=b,
        lr=instr.lr_for(b),
        steps=steps,
        target_accuracy=instr.target_accuracy,
        stop_reason=STAND_IN,
    )
    return Trained(result, dict(work.state or {}), profile.device, choice, stand_in=True)
