"""The time–energy front: which feasible (b, f) pairs are worth choosing when energy counts too.

Each feasible pair predicts a time to the target, T_N · r_b, and an energy to it, E_N · r_b (E_N = the
profile's mean power × T_N). A pair is on the Pareto front when no other pair is at least as fast and at
least as frugal, and strictly better in one. The fastest pair (Algorithm 1) and the most frugal one are
its two ends: a lower frequency can finish later yet use less energy, which is what the front shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from powerctl.records.pick import Pick
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.selection.joint import candidates, rank, select

PARETO_SCHEMA = "powerctl.pareto/1"


@dataclass(frozen=True)
class Front:
    """Every feasible pair, the non-dominated ones (fastest first) and the two optima."""

    pairs: list[Pick]
    front: list[Pick]
    fastest: Pick
    most_frugal: Pick
    power_cap_w: float | None

    def to_json_dict(self, profile: Profile, relation: RelationVector) -> dict[str, Any]:
        def point(s: Pick) -> dict[str, Any]:
            return {**s.to_json_dict(with_energy=True)}

        return {
            "schema": PARETO_SCHEMA,
            "device": profile.device,
            "model": profile.model,
            "input_shape": list(profile.input_shape),
            "profile_samples": profile.samples,
            "proxy_dataset": relation.proxy_dataset,
            "target_accuracy": relation.target_accuracy,
            "power_cap_w": self.power_cap_w,
            "feasible_pairs": len(self.pairs),
            "front": [point(s) for s in self.front],
            "time_optimal": point(self.fastest),
            "energy_optimal": point(self.most_frugal),
        }


def pareto_front(profile: Profile, relation: RelationVector, power_cap_w: float | None) -> Front:
    """The front of the feasible pairs (none feasible: the selection's one InfeasibleCapError line)."""
    if not rank(profile, relation, power_cap_w, "time"):
        select(profile, relation, power_cap_w)  # raises the one-line error naming the least power
    pairs = candidates(profile, relation, power_cap_w)
    # a sweep by time (ties: the lower energy first, then the selection's tie rule): a pair is on the
    # front when it uses strictly less energy than every faster one (of pairs predicting exactly the
    # same time and energy, the one the tie rule prefers stands for all)
    ordered = sorted(
        pairs, key=lambda s: (s.predicted_seconds, s.predicted_energy_j, -s.batch_size, s.frequency_hz)
    )
    front: list[Pick] = []
    for s in ordered:
        # candidates' picks carry their predictions
        if not front or cast(float, s.predicted_energy_j) < cast(float, front[-1].predicted_energy_j):
            front.append(s)
    # the two ends are the front's: the time-optimal, among pairs tied at the least time, the one with
    # the least energy (Algorithm 1's own tie rule — the larger batch — may pick a dearer one of them);
    # the energy-optimal, among pairs tied at the least energy, the fastest (the energy ranking's tie
    # rule may pick a slower one, which the fastest dominates)
    return Front(pairs, front, front[0], front[-1], power_cap_w)
