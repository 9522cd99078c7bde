"""bench/vector_floor.py: the best worst-cell ratio any one relation vector can reach."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from vector_floor import Group, shared_vector_floor


def _picks(groups: list[Group], relation: dict[int, float]) -> dict[str, int]:
    """What Algorithm 1 picks in each group under `relation` (the least r_b · T_b)."""
    return {
        g.name: min(g.seconds_per_sample, key=lambda b: relation[b] * g.seconds_per_sample[b]) for g in groups
    }


def _worst(groups: list[Group], relation: dict[int, float]) -> float:
    picks = _picks(groups, relation)
    return max(g.worst(picks[g.name])[0] for g in groups)


def test_two_targets_that_disagree_in_one_cell_leave_the_lesser_penalty() -> None:
    # the text bench's TX2 NX, no cap: one target needs b=32, the other b=64; any vector serves one
    g = Group(
        "tx2nx no cap", {32: 1.0, 64: 0.8}, {"austen": {32: 1.0, 64: 1.014}, "dickens": {32: 1.037, 64: 1.0}}
    )
    floor = shared_vector_floor([g])
    assert floor.worst == pytest.approx(1.014) and floor.cell == "tx2nx no cap austen"
    assert floor.picks == {"tx2nx no cap": 64} and _picks([g], floor.relation) == floor.picks


def test_one_vector_for_two_boards_can_be_worse_than_each_boards_best() -> None:
    # Board A makes b=16 1.25x faster per sample than b=8, board B 2x. A's target needs b=16 (a vector with
    # r16/r8 < 1.25), B's needs b=8 (r16/r8 > 2): no one vector has both.
    a = Group("A", {8: 1.0, 16: 0.8}, {"t": {8: 1 / 0.88, 16: 1.0}})
    b = Group("B", {8: 1.0, 16: 0.5}, {"t": {8: 1.0, 16: 1.25}})
    assert a.worst(16)[0] == 1.0 and b.worst(8)[0] == 1.0  # each board alone: some vector is exact
    floor = shared_vector_floor([a, b])
    # r16/r8 < 1.25: 16 on both (B 1.25x); between: 8 on A, 16 on B (1.25x); > 2: 8 on both (A 1.136x)
    assert floor.worst == pytest.approx(1 / 0.88) and floor.picks == {"A": 8, "B": 8}
    assert floor.relation[16] / floor.relation[8] > 2
    assert _worst([a, b], floor.relation) == pytest.approx(floor.worst)


def test_a_batch_size_infeasible_in_a_group_constrains_nothing_there() -> None:
    a = Group("capped", {8: 1.0}, {"t": {8: 1.0}})
    b = Group("free", {8: 1.0, 16: 0.6}, {"t": {8: 1.2, 16: 1.0}})
    floor = shared_vector_floor([a, b])
    assert floor.worst == 1.0 and floor.picks == {"capped": 8, "free": 16}


def test_no_feasible_batch_size_anywhere_is_refused() -> None:
    with pytest.raises(ValueError, match="no group"):
        shared_vector_floor([Group("g", {}, {})])


_sizes = [4, 8, 16, 32]


@st.composite
def _groups(draw: st.DrawFn) -> list[Group]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        sizes = draw(st.lists(st.sampled_from(_sizes), min_size=1, max_size=4, unique=True))
        t = {b: draw(st.floats(0.1, 10.0)) for b in sizes}
        ratio = {}
        for target in ("x", "y")[: draw(st.integers(1, 2))]:
            raw = {b: draw(st.floats(1.0, 3.0)) for b in sizes}
            least = min(raw.values())
            ratio[target] = {b: v / least for b, v in raw.items()}
        out.append(Group(f"g{i}", t, ratio))
    return out


@settings(max_examples=150, deadline=None)
@given(_groups(), st.lists(st.lists(st.floats(-4.0, 4.0), min_size=4, max_size=4), min_size=1, max_size=20))
def test_the_witness_reaches_the_floor_and_no_vector_beats_it(groups: list[Group], logs: list) -> None:
    floor = shared_vector_floor(groups)
    assert _picks(groups, floor.relation) == floor.picks
    assert _worst(groups, floor.relation) == pytest.approx(floor.worst)
    for log_r in logs:
        assert (
            _worst(groups, {b: math.exp(x) for b, x in zip(_sizes, log_r, strict=True)}) >= floor.worst - 1e-9
        )
