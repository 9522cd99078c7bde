"""The time–energy front: the feasible (b, f) pairs no other pair beats in both predicted time (T_N · r_b)
and energy (E_N · r_b) to the target; the fastest pair (Algorithm 1) and the most frugal are its ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from powerctl.records.pick import Pick
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.selection.joint import candidates, rank, select

PARETO_SCHEMA = "powerctl.pareto/2"


@dataclass(frozen=True)
class Front:
    """Every feasible pair, the non-dominated ones (fastest first) and the two optima."""

    pairs: list[Pick]
    front: list[Pick]
    fastest: Pick
    most_frugal: Pick
    power_cap_w: float | None

    def to_json_dict(self, profile: Profile, relation: RelationVector) -> dict[str, Any]:
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
            "front": [s.to_json_dict(with_energy=True) for s in self.front],
            "time_optimal": self.fastest.to_json_dict(with_energy=True),
            "energy_optimal": self.most_frugal.to_json_dict(with_energy=True),
        }


def pareto_front(profile: Profile, relation: RelationVector, power_cap_w: float | None) -> Front:
    """The front of the feasible pairs (none feasible: the selection's one InfeasibleCapError line)."""
    if not rank(profile, relation, power_cap_w, "time"):
        select(profile, relation, power_cap_w)  # raises the one-line error naming the least power
    pairs = candidates(profile, relation, power_cap_w)
    # a sweep by time (ties: the lower energy, then the selection's tie rule): a pair is on the front
    # when it uses strictly less energy than every faster one
    ordered = sorted(
        pairs, key=lambda s: (s.predicted_s, s.predicted_energy_j, -s.batch_size, s.frequency_hz)
    )
    front: list[Pick] = []
    for s in ordered:
        if not front or cast(float, s.predicted_energy_j) < cast(float, front[-1].predicted_energy_j):
            front.append(s)
    # its ends: of the pairs tied at the least time, the least energy (not Algorithm 1's tie rule), and
    # of those tied at the least energy, the fastest
    return Front(pairs, front, front[0], front[-1], power_cap_w)
