"""Joint batch-size and GPU-frequency selection under a power cap (Algorithm 1, docs/design/method.md):
minimise T_N(b, f) · r_b (or energy) subject to P(b, f) ≤ P_max over the profiled pairs with a relation
entry; ties go to the larger batch size, then the lower frequency. The relation rules: method.md.
"""

from __future__ import annotations

import math
from typing import Any, Literal, cast

from powerctl.errors import ArgumentError, FileFormatError, InfeasibleCapError, PowerctlError
from powerctl.files.mapping import Choice, Flag, check_arguments
from powerctl.records.pick import Pick
from powerctl.records.profile import Profile, ProfilePoint
from powerctl.records.relation import DEFAULT_RELATION_RULE, RELATION_RULES, RelationVector
from powerctl.selection.capsource import (
    InvalidPowerCapError as InvalidPowerCapError,  # re-exported: API users catch it
)
from powerctl.selection.capsource import parse_power_cap

Objective = Literal["time", "energy"]
OBJECTIVES: tuple[str, ...] = ("time", "energy")
"""What selection minimises: predicted time to the target (the paper, the default) or energy to it."""


class MismatchError(FileFormatError):
    """A profile and a relation vector that do not belong together (another model or input)."""


def check_pairing(profile: Profile, relation: RelationVector, *, allow_mismatch: bool = False) -> list[str]:
    """Refuse a relation vector of another model or input (`allow_mismatch`: a warning); the warnings:
    batch sizes in one file only, a relation too coarse to tell batch sizes apart."""
    problems = []
    if profile.model != relation.model:
        problems.append(
            f"the profile is of model {profile.model!r}, the relation vector of {relation.model!r}"
        )
    shape = relation.extra.get("input_shape")
    if isinstance(shape, (list, tuple)) and list(shape) != list(profile.input_shape):
        problems.append(
            f"the profile's input shape is {list(profile.input_shape)}, the relation vector's {list(shape)}"
        )
    if problems and not allow_mismatch:
        raise MismatchError(
            "; ".join(problems) + ": they do not belong together (--allow-mismatch to combine them anyway)"
        )
    warnings = [f"{p}; combined anyway (--allow-mismatch)" for p in problems]
    profiled, related = set(profile.batch_sizes()), set(relation.batch_sizes)
    if only := sorted(profiled - related):
        warnings.append(f"batch sizes {only} are profiled but not in the relation vector: not considered")
    if only := sorted(related - profiled):
        warnings.append(f"batch sizes {only} are in the relation vector but not profiled: not considered")
    if coarse := relation.coarse_warning():
        warnings.append(coarse)
    return warnings


def is_feasible(point: ProfilePoint, power_cap_w: float | None) -> bool:
    """Peak power ≤ cap; equal is feasible (docs/design/method.md); no cap = everything is feasible."""
    return power_cap_w is None or point.peak_power_w <= power_cap_w


def common_batch_sizes(profile: Profile, relation: RelationVector) -> list[int]:
    """Batch sizes both profiled and in the relation; the others cannot be predicted and are ignored."""
    profiled = set(profile.batch_sizes())
    related = set(relation.batch_sizes)
    common = sorted(profiled & related)
    if not common:
        raise FileFormatError(
            f"the profile ({profile.device}, {profile.model}) has batch sizes {sorted(profiled)} and the "
            f"relation ({relation.model}, {relation.proxy_dataset}) has {sorted(related)}: none in common"
        )
    return common


def predicted_s(point: ProfilePoint, r_b: float) -> float:
    """TT_acc(b, f) = T_N(b, f) · r_b."""
    return point.seconds_for_samples * r_b


def predicted_energy_j(point: ProfilePoint, r_b: float) -> float:
    """E_acc(b, f) = E_N(b, f) · r_b, with E_N = the profile's mean power × T_N."""
    return point.mean_power_w * point.seconds_for_samples * r_b


def check_objective(objective: str) -> Objective:
    return check_arguments("select", objective=(objective, Choice(OBJECTIVES)))["objective"]


def _order_key(objective: Objective) -> Any:
    # The objective, then the other one, then the larger batch size, then the lower frequency.
    if objective == "energy":
        return lambda s: (s.predicted_energy_j, s.predicted_s, -s.batch_size, s.frequency_hz)
    return lambda s: (s.predicted_s, -s.batch_size, s.frequency_hz)


def candidates(profile: Profile, relation: RelationVector, power_cap_w: float | None) -> list[Pick]:
    """Every feasible pair with a relation entry, with its predicted time and energy, in profile order."""
    cap = parse_power_cap(power_cap_w, text=False)
    r = relation.as_map()
    common = set(common_batch_sizes(profile, relation))
    return [
        Pick(
            p.batch_size,
            p.frequency_hz,
            predicted_s(p, r[p.batch_size]),
            p.peak_power_w,
            predicted_energy_j(p, r[p.batch_size]),
        )
        for p in profile.points
        if p.batch_size in common and is_feasible(p, cap)
    ]


def mean_regret(
    profile: Profile, relation: RelationVector, power_cap_w: float | None, objective: str = "time"
) -> dict[tuple[int, int], float]:
    """(b, f) → mean over the seeds of its cost / that seed's least feasible cost (empty: none feasible)."""
    common = set(common_batch_sizes(profile, relation))
    points = [p for p in profile.points if p.batch_size in common and is_feasible(p, power_cap_w)]
    cost = predicted_energy_j if objective == "energy" else predicted_s
    total = dict.fromkeys(((p.batch_size, p.frequency_hz) for p in points), 0.0)
    scenarios = relation.seed_scenarios()
    for samples in scenarios:
        costs = {(p.batch_size, p.frequency_hz): cost(p, samples[p.batch_size]) for p in points}
        best = min(costs.values(), default=math.nan)
        for k, c in costs.items():
            total[k] += c / best
    return {k: v / len(scenarios) for k, v in total.items()}


def rank(
    profile: Profile,
    relation: RelationVector,
    power_cap_w: float | None,
    objective: str = "time",
    rule: str = DEFAULT_RELATION_RULE,
) -> list[Pick]:
    """Every feasible pair with a relation entry, best first for `objective` under `rule` (empty: none)."""
    if not isinstance(profile, Profile):
        raise ArgumentError(f"select: 'profile' must be a Profile, got {type(profile).__name__}")
    if not isinstance(relation, RelationVector):  # a RelationVector checks its entries itself
        raise ArgumentError(f"select: 'relation' must be a RelationVector, got {type(relation).__name__}")
    key = _order_key(check_objective(objective))
    ranked = sorted(candidates(profile, relation, power_cap_w), key=key)
    check_arguments("select", rule=(rule, Choice(RELATION_RULES)))
    if rule == "robust":
        regret = mean_regret(profile, relation, power_cap_w, objective)
        ranked.sort(key=lambda s: regret[(s.batch_size, s.frequency_hz)])  # stable: ties keep the order
    elif rule == "interval":
        within = indistinguishable(ranked, relation, objective)
        inside = {(s.batch_size, s.frequency_hz) for s in within}
        rest = [s for s in ranked if (s.batch_size, s.frequency_hz) not in inside]
        ranked = sorted(within, key=lambda s: -s.batch_size) + rest  # stable: the mean order within
    return ranked


def indistinguishable(ranked: list[Pick], relation: RelationVector, objective: str = "time") -> list[Pick]:
    """Of `ranked` (the mean order, best first), those the vector cannot tell from the best, in order:
    their cost ratio to the best's has an interval reaching 1 (the profile's times taken as exact)."""
    if not ranked:
        return []
    obj, best = check_objective(objective), ranked[0]

    def cost(s: Pick) -> float:
        value = s.predicted_energy_j if obj == "energy" else s.predicted_s
        assert value is not None, f"{s} has no prediction"  # `candidates` predicts every pair it ranks
        return value

    half = {b: relation.paired_halfwidth(b, best.batch_size) for b in {s.batch_size for s in ranked}}
    return [s for s in ranked if cost(s) / cost(best) * (1 - half[s.batch_size]) <= 1]


def select(
    profile: Profile,
    relation: RelationVector,
    power_cap_w: float | None,
    objective: str = "time",
    rule: str = DEFAULT_RELATION_RULE,
    *,
    allow_mismatch: bool = False,
) -> Pick:
    """Algorithm 1 under `rule` (the module doc); the Pick's predictions are the mean vector's. None
    feasible: one InfeasibleCapError line; another model or input: one MismatchError (`check_pairing`)."""
    check_arguments("select", allow_mismatch=(allow_mismatch, Flag()))  # "no" must not mix models
    ranked = rank(profile, relation, power_cap_w, objective, rule)
    check_pairing(profile, relation, allow_mismatch=allow_mismatch)
    if ranked:
        return ranked[0]
    assert power_cap_w is not None  # with no cap every common point is feasible, and there is one
    common = set(common_batch_sizes(profile, relation))
    least = min(
        (p for p in profile.points if p.batch_size in common),
        key=lambda p: (p.peak_power_w, -p.batch_size, p.frequency_hz),
    )
    cap_s, least_s = format_watts_pair(power_cap_w, least.peak_power_w)
    raise InfeasibleCapError(
        f"no (batch size, frequency) pair stays under {cap_s} W: the least peak power profiled is "
        f"{least_s} W (batch size {least.batch_size} at {least.frequency_hz} Hz); "
        "raise the cap or profile smaller batch sizes or lower frequencies"
    )


def best_frequency_per_batch(profile: Profile, power_cap_w: float | None) -> dict[int, ProfilePoint]:
    """Per batch size, the feasible point with the highest frequency (batch sizes with none are absent)."""
    cap = parse_power_cap(power_cap_w, text=False)
    best: dict[int, ProfilePoint] = {}
    for p in sorted(profile.points, key=lambda p: p.frequency_hz, reverse=True):
        if is_feasible(p, cap):
            best.setdefault(p.batch_size, p)
    return dict(sorted(best.items()))


def format_watts_pair(a: float, b: float) -> tuple[str, str]:
    """Two wattages with 2 decimals, or more when 2 would print different values the same."""
    for digits in range(2, 7):
        sa, sb = f"{a:.{digits}f}", f"{b:.{digits}f}"
        if sa != sb or a == b:
            return sa, sb
    return repr(a), repr(b)


def select_under_deadline(
    profile: Profile,
    relation: RelationVector,
    power_cap_w: float | None,
    deadline_s: float,
    rule: str = DEFAULT_RELATION_RULE,
) -> tuple[Pick, bool]:
    """(the least-energy feasible pair predicted to meet `deadline_s`, True), else (`select`'s, False)."""
    if not math.isfinite(deadline_s) or deadline_s <= 0:
        raise PowerctlError(f"a deadline must be a positive number of seconds, got {deadline_s!r}")
    ranked = rank(profile, relation, power_cap_w, "energy", rule)
    in_time = [s for s in ranked if cast(float, s.predicted_s) <= deadline_s]  # ranked: predicted
    if in_time:
        return in_time[0], True
    return select(profile, relation, power_cap_w, rule=rule), False
