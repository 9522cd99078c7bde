"""The least worst-cell ours/fastest that ANY one relation vector can reach on a bench's measured runs.

Every board, cap and target chooses from the same vector, so where targets disagree even the best vector
is off somewhere: the floor separates "the proxy's vector is wrong" from "no vector could do better".

Algorithm 1 picks argmin over feasible (b, f) of r_b · T(b, f). For a fixed b its best f does not depend on
r, so within one (board, cap) group the pick is argmin_b r_b · T_b with T_b the seconds per sample of b's
best feasible pair. Picking b in a group is then a set of strict difference constraints on x = log r:
x_b − x_b' < log T_b' − log T_b for every other feasible b'. A set of picks (one per group) is reachable by
some vector exactly when the constraint graph has no cycle of weight ≤ 0. The floor is the least threshold
θ for which some reachable set of picks has every cell's ratio ≤ θ; the witness is a vector reaching it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

TOLERANCE = 1e-12
"""A cycle this close to weight 0 counts as closed: a tie the vector cannot break for sure."""


@dataclass(frozen=True)
class Group:
    """One (board, cap): what a vector chooses between, and what each choice costs on each target."""

    name: str
    seconds_per_sample: Mapping[int, float]
    """Per feasible batch size: the predicted seconds per sample of its best feasible (b, f)."""
    ratio: Mapping[str, Mapping[int, float]]
    """Per target, per feasible batch size: that pair's measured seconds / the fastest's."""

    def worst(self, b: int) -> tuple[float, str]:
        """The worst ratio over this group's targets if it picks `b`, and which target that is."""
        return max((r[b], t) for t, r in self.ratio.items())


@dataclass(frozen=True)
class Floor:
    worst: float
    """The least worst-cell ratio any one vector reaches (1.0: some vector is the fastest everywhere)."""
    cell: str
    """Where that worst ratio is: group and target."""
    picks: dict[str, int]
    """The batch size each group picks under the witness."""
    relation: dict[int, float]
    """A witness vector reaching the floor (samples to target relative to the largest batch size)."""


def shared_vector_floor(groups: Sequence[Group]) -> Floor:
    """The floor and a witness. Groups with no feasible batch size are ignored; none at all → ValueError."""
    groups = [g for g in groups if g.seconds_per_sample]
    if not groups:
        raise ValueError("no group has a feasible batch size")
    batch_sizes = sorted({b for g in groups for b in g.seconds_per_sample})
    for theta in sorted({g.worst(b)[0] for g in groups for b in g.seconds_per_sample}):
        allowed = [[b for b in g.seconds_per_sample if g.worst(b)[0] <= theta] for g in groups]
        if any(not a for a in allowed):
            continue
        picks = _reachable(groups, allowed, batch_sizes)
        if picks is not None:
            worst, cell = max(
                (g.worst(b)[0], f"{g.name} {g.worst(b)[1]}") for g, b in zip(groups, picks, strict=True)
            )
            x = _witness(_edges(groups, picks), batch_sizes)
            top = x[batch_sizes[-1]]
            return Floor(
                worst, cell, {g.name: b for g, b in zip(groups, picks, strict=True)},
                {b: math.exp(x[b] - top) for b in batch_sizes},
            )  # fmt: skip
    raise AssertionError("unreachable: the largest threshold allows every pick, and some pick is reachable")


Edges = dict[tuple[int, int], float]
"""(u, v) → w: x_v − x_u < w (the least such bound)."""


def _edges(groups: Sequence[Group], picks: Sequence[int]) -> Edges:
    edges: Edges = {}
    for g, p in zip(groups, picks, strict=True):
        t = g.seconds_per_sample
        for b, tb in t.items():
            if b != p:
                w = math.log(tb) - math.log(t[p])
                edges[(b, p)] = min(edges.get((b, p), math.inf), w)
    return edges


def _shortest(edges: Edges, batch_sizes: list[int], shift: float = 0.0) -> dict[tuple[int, int], float]:
    """All-pairs shortest paths with every edge weight less `shift` (Floyd–Warshall; a handful of nodes)."""
    d = {(u, v): (0.0 if u == v else math.inf) for u in batch_sizes for v in batch_sizes}
    for (u, v), w in edges.items():
        d[(u, v)] = min(d[(u, v)], w - shift)
    for k in batch_sizes:
        for i in batch_sizes:
            for j in batch_sizes:
                if d[(i, k)] + d[(k, j)] < d[(i, j)]:
                    d[(i, j)] = d[(i, k)] + d[(k, j)]
    return d


def _open(edges: Edges, batch_sizes: list[int], shift: float = 0.0) -> bool:
    """No cycle of weight ≤ 0 (within the tolerance) once every edge is `shift` lighter: the strict
    constraints have a solution with that margin to spare on each."""
    closure = _shortest(edges, batch_sizes, shift)  # a cycle: an edge u → v, then the shortest path v → u
    return all(w - shift + closure[(v, u)] > TOLERANCE for (u, v), w in edges.items())


def _reachable(groups: Sequence[Group], allowed: list[list[int]], batch_sizes: list[int]) -> list[int] | None:
    """Depth-first over the groups' allowed picks, pruning as soon as the constraints close a cycle."""
    picks: list[int] = []

    def go(i: int) -> bool:
        if i == len(groups):
            return True
        for b in allowed[i]:
            picks.append(b)
            if _open(_edges(groups[: i + 1], picks), batch_sizes) and go(i + 1):
                return True
            picks.pop()
        return False

    return picks if go(0) else None


def _witness(edges: Edges, batch_sizes: list[int]) -> dict[int, float]:
    """x with every constraint met by half the widest margin there is (so products do not tie): the
    margin δ* is found by bisection (the least cycle mean), and x is the shortest distance from a source
    joined to every node by a 0-weight edge, under weights less δ*/2."""
    lo, hi = 0.0, max((abs(w) for w in edges.values()), default=0.0) + 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _open(edges, batch_sizes, mid) else (lo, mid)
    closure = _shortest(edges, batch_sizes, lo / 2)
    return {v: min(0.0, *(closure[(u, v)] for u in batch_sizes)) for v in batch_sizes}
