"""Algorithm 1: joint (batch size, frequency) selection under a power cap."""

from __future__ import annotations

import json
import math
import random
import re
import statistics
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerctl.errors import FileFormatError, InfeasibleCapError, PowerctlError
from powerctl.records.pick import Pick
from powerctl.records.profile import Profile, ProfilePoint
from powerctl.records.relation import DEFAULT_RELATION_RULE, INTERVAL_STANDARD_ERRORS, RelationVector
from powerctl.selection.joint import (
    InvalidPowerCapError,
    best_frequency_per_batch,
    common_batch_sizes,
    mean_regret,
    rank,
    select,
)

POW2 = [2**k for k in range(9)]
MHZ = 1_000_000
THOROUGH = settings(max_examples=200, deadline=None)
FAST = settings(max_examples=100, deadline=None)  # the secondary properties; keeps the file at a few seconds

# Small pools mixed into the float ranges make exact ties (equal times, equal products, cap == peak) common.
_PEAKS = st.one_of(st.sampled_from([2.0, 3.0, 4.5, 5.0, 8.0]), st.floats(1.0, 20.0))
_TIMES = st.one_of(st.sampled_from([10.0, 20.0, 40.0, 80.0]), st.floats(1.0, 1000.0))
_SAMPLES = st.one_of(st.sampled_from([1000.0, 2000.0, 4000.0]), st.floats(100.0, 1e6))


def point(b: int, mhz: float, peak: float, seconds: float) -> ProfilePoint:
    return ProfilePoint(b, round(mhz * MHZ), peak, peak * 0.8, seconds * b / 1000, seconds)


def make_profile(points: list[ProfilePoint], device: str = "jetson-nano") -> Profile:
    return Profile(device, "resnet18", [3, 32, 32], 1000, list(points))


def make_relation(samples: dict[int, float], dataset: str = "cifar10") -> RelationVector:
    return RelationVector.from_samples("resnet18", dataset, 0.8, samples)


@st.composite
def profiles(
    draw: st.DrawFn, frequencies: list[int] | None = None, peak_bound: dict[int, float] | None = None
) -> Profile:
    """Random batch sizes (powers of 2) × frequencies, a random non-empty subset of the grid profiled."""
    bss = draw(st.lists(st.sampled_from(POW2), min_size=1, max_size=5, unique=True))
    freqs = frequencies or draw(
        st.lists(st.integers(50 * MHZ, 1500 * MHZ), min_size=1, max_size=5, unique=True)
    )
    cells = [(b, f) for b in bss for f in freqs]
    chosen = draw(st.lists(st.sampled_from(cells), min_size=1, max_size=len(cells), unique=True))
    pts = []
    for b, f in chosen:
        peak = draw(_PEAKS)
        if peak_bound is not None:
            peak = min(peak, peak_bound[f])
        seconds = draw(_TIMES)
        pts.append(ProfilePoint(b, f, peak, peak * 0.8, seconds * b / 1000, seconds))
    return make_profile(pts)


@st.composite
def relations_for(draw: st.DrawFn, profile: Profile) -> RelationVector:
    """A relation sharing at least one batch size with the profile, maybe holding others too."""
    bss = set(draw(st.lists(st.sampled_from(POW2), max_size=5, unique=True)))
    bss.add(draw(st.sampled_from(profile.batch_sizes())))
    return make_relation({b: draw(_SAMPLES) for b in bss})


@st.composite
def cases(draw: st.DrawFn) -> tuple[Profile, RelationVector, float]:
    profile = draw(profiles())
    relation = draw(relations_for(profile))
    cap = draw(st.one_of(st.floats(0.5, 25.0), st.sampled_from([p.peak_power_w for p in profile.points])))
    return profile, relation, cap


def common_points(profile: Profile, relation: RelationVector) -> list[ProfilePoint]:
    r = relation.as_map()
    return [p for p in profile.points if p.batch_size in r]


def tt(p: ProfilePoint, relation: RelationVector) -> float:
    return p.seconds_for_samples * relation.as_map()[p.batch_size]


def watts_in(message: str) -> list[float]:
    return [float(x) for x in re.findall(r"(\d+(?:\.\d+)?) W\b", message)]


# --- properties -----------------------------------------------------------------------------------------


@THOROUGH
@given(cases())
def test_choice_is_feasible_optimal_and_ties_follow_the_rule(
    case: tuple[Profile, RelationVector, float],
) -> None:
    profile, relation, cap = case
    check_rank_and_best_frequency(profile, relation, cap)
    feasible = [p for p in common_points(profile, relation) if p.peak_power_w <= cap]
    if not feasible:
        with pytest.raises(InfeasibleCapError):
            select(profile, relation, cap)
        return
    sel = select(profile, relation, cap)
    chosen = profile.point(sel.batch_size, sel.frequency_hz)
    assert chosen is not None and sel.batch_size in relation.as_map()
    assert chosen.peak_power_w <= cap and sel.peak_power_w == chosen.peak_power_w
    assert sel.predicted_s == tt(chosen, relation)
    assert all(tt(p, relation) >= sel.predicted_s for p in feasible)
    # The tie rule, among the feasible pairs exactly as fast as the choice.
    tied = [p for p in feasible if tt(p, relation) == sel.predicted_s]
    assert sel.batch_size == max(p.batch_size for p in tied)
    assert sel.frequency_hz == min(p.frequency_hz for p in tied if p.batch_size == sel.batch_size)


def check_rank_and_best_frequency(profile: Profile, relation: RelationVector, cap: float) -> None:
    """rank lists every feasible pair best first; best_frequency_per_batch is the highest feasible one."""
    ranked = rank(profile, relation, cap)
    feasible = [p for p in common_points(profile, relation) if p.peak_power_w <= cap]
    assert {(s.batch_size, s.frequency_hz) for s in ranked} == {
        (p.batch_size, p.frequency_hz) for p in feasible
    }
    assert len(ranked) == len(feasible)
    times = [s.predicted_s for s in ranked]
    assert times == sorted(times)
    if ranked:
        assert ranked[0] == select(profile, relation, cap)
    best = best_frequency_per_batch(profile, cap)
    for b in profile.batch_sizes():
        ok = [p for p in profile.points if p.batch_size == b and p.peak_power_w <= cap]
        if ok:
            assert best[b] == max(ok, key=lambda p: p.frequency_hz)
        else:
            assert b not in best


@FAST
@given(cases(), st.randoms(use_true_random=False))
def test_invariant_to_the_order_of_points(
    case: tuple[Profile, RelationVector, float], rnd: random.Random
) -> None:
    profile, relation, _ = case
    shuffled = list(profile.points)
    rnd.shuffle(shuffled)
    other = make_profile(shuffled)
    assert select(profile, relation, None) == select(other, relation, None)
    assert rank(profile, relation, None) == rank(other, relation, None)


@FAST
@given(cases(), st.floats(0.0, 10.0))
def test_no_cap_is_the_global_min_and_raising_the_cap_never_slows(
    case: tuple[Profile, RelationVector, float], more: float
) -> None:
    profile, relation, cap = case
    # No cap: the global minimum, the same as a cap above every peak.
    free = select(profile, relation, None)
    assert free.predicted_s == min(tt(p, relation) for p in common_points(profile, relation))
    assert select(profile, relation, max(p.peak_power_w for p in profile.points)) == free
    try:
        low = select(profile, relation, cap)
    except InfeasibleCapError:
        return
    high = select(profile, relation, cap + more)
    assert free.predicted_s <= high.predicted_s <= low.predicted_s


@FAST
@given(cases())
def test_infeasible_cap_names_the_cap_and_the_least_peak(case: tuple[Profile, RelationVector, float]) -> None:
    profile, relation, _ = case
    common = common_points(profile, relation)
    least = min(p.peak_power_w for p in common)
    cap = least * 0.9
    with pytest.raises(InfeasibleCapError) as err:
        select(profile, relation, cap)
    msg = str(err.value)
    assert "\n" not in msg
    shown = watts_in(msg)
    assert len(shown) == 2
    assert shown[0] == pytest.approx(cap, abs=0.005) and shown[1] == pytest.approx(least, abs=0.005)
    assert shown[0] != shown[1]
    assert rank(profile, relation, cap) == []


@FAST
@given(profiles(), st.data())
def test_equal_times_go_to_the_largest_batch_then_the_lowest_frequency(
    profile: Profile, data: st.DataObject
) -> None:
    # Every predicted time equal: only the tie rule decides.
    flat = make_profile(
        [
            ProfilePoint(p.batch_size, p.frequency_hz, p.peak_power_w, p.mean_power_w, 1.0, 50.0)
            for p in profile.points
        ]
    )
    relation = make_relation(dict.fromkeys(flat.batch_sizes(), 3000.0))
    cap = data.draw(st.sampled_from([p.peak_power_w for p in flat.points]))
    feasible = [p for p in flat.points if p.peak_power_w <= cap]
    b = max(p.batch_size for p in feasible)
    f = min(p.frequency_hz for p in feasible if p.batch_size == b)
    sel = select(flat, relation, cap)
    assert (sel.batch_size, sel.frequency_hz) == (b, f)


# --- worked examples ------------------------------------------------------------------------------------
#
# Two batch sizes × two frequencies. r_16 = 40000 / 50000 = 0.8, r_32 = 1.
#   (b, MHz)   peak W   T_N s   T_N · r_b
#   (32, 100)   4.0     100     100
#   (32, 200)   6.0      60      60
#   (16, 100)   3.0     150     120
#   (16, 200)   4.5      80      64


def small() -> tuple[Profile, RelationVector]:
    profile = make_profile(
        [
            point(32, 100, 4.0, 100.0),
            point(32, 200, 6.0, 60.0),
            point(16, 100, 3.0, 150.0),
            point(16, 200, 4.5, 80.0),
        ]
    )
    return profile, make_relation({16: 40000.0, 32: 50000.0})


@pytest.mark.parametrize(
    ("cap", "want", "seconds"),
    [
        (None, (32, 200), 60.0),  # no cap: the global minimum
        (7.0, (32, 200), 60.0),  # everything feasible
        (
            5.0,
            (16, 200),
            64.0,
        ),  # (32, 200) draws 6 W; the smaller batch at the higher frequency beats (32, 100)
        (4.5, (16, 200), 64.0),  # a peak equal to the cap is feasible
        (4.49, (32, 100), 100.0),  # (16, 200) just over; (32, 100) = 100 s beats (16, 100) = 120 s
        (3.5, (16, 100), 120.0),  # only the smallest point fits
    ],
)
def test_worked_example(cap: float | None, want: tuple[int, int], seconds: float) -> None:
    profile, relation = small()
    sel = select(profile, relation, cap)
    assert (sel.batch_size, sel.frequency_hz // MHZ) == want
    assert sel.predicted_s == pytest.approx(seconds)
    assert sel.peak_power_w == profile.point(want[0], want[1] * MHZ).peak_power_w


def test_worked_example_infeasible_message() -> None:
    profile, relation = small()
    with pytest.raises(InfeasibleCapError) as err:
        select(profile, relation, 2.9)
    assert str(err.value) == (
        "no (batch size, frequency) pair stays under 2.90 W: the least peak power profiled is 3.00 W "
        "(batch size 16 at 100000000 Hz); raise the cap or profile smaller batch sizes or lower frequencies"
    )


def test_close_cap_and_peak_print_with_enough_digits() -> None:
    profile = make_profile([point(8, 100, 4.314, 10.0)])
    with pytest.raises(InfeasibleCapError, match=r"under 4\.313 W: .* is 4\.314 W"):
        select(profile, make_relation({8: 1.0}), 4.313)


def test_least_peak_counts_only_batch_sizes_with_a_relation() -> None:
    # Batch size 4 draws the least but has no relation entry: it cannot be chosen, so it is not "the least".
    profile = make_profile([point(4, 100, 1.0, 10.0), point(8, 100, 3.0, 10.0)])
    with pytest.raises(InfeasibleCapError, match=r"least peak power profiled is 3\.00 W \(batch size 8"):
        select(profile, make_relation({8: 1.0}), 2.0)


def test_explicit_ties() -> None:
    # 16 at 50 s × r=2 and 32 at 100 s × r=1 both predict 100 s: the larger batch wins.
    profile = make_profile([point(16, 300, 3.0, 50.0), point(32, 100, 3.0, 100.0)])
    relation = make_relation({16: 2000.0, 32: 1000.0})
    assert select(profile, relation, 5.0).batch_size == 32
    # Same batch, a time plateau over frequency: the lower frequency wins (it draws less).
    plateau = make_profile(
        [point(32, 300, 4.0, 100.0), point(32, 200, 3.5, 100.0), point(32, 400, 4.5, 100.0)]
    )
    assert select(plateau, make_relation({32: 1.0}), 5.0).frequency_hz == 200 * MHZ


def test_batch_sizes_in_only_one_file_are_ignored() -> None:
    # 64 is the fastest point but has no r_b; 8 is only in the relation.
    profile = make_profile([point(64, 100, 3.0, 1.0), point(32, 100, 3.0, 50.0), point(16, 100, 3.0, 80.0)])
    relation = make_relation({8: 10.0, 16: 10.0, 32: 20.0})
    assert common_batch_sizes(profile, relation) == [16, 32]
    sel = select(profile, relation, None)
    assert (sel.batch_size, sel.predicted_s) == (16, pytest.approx(40.0))  # 80 × 0.5 < 50 × 1


def test_no_common_batch_size_is_one_line_naming_both_sets() -> None:
    profile = make_profile([point(64, 100, 3.0, 1.0), point(32, 100, 3.0, 50.0)])
    relation = make_relation({8: 10.0, 16: 20.0})
    with pytest.raises(FileFormatError) as err:
        select(profile, relation, 5.0)
    msg = str(err.value)
    assert "\n" not in msg and "[32, 64]" in msg and "[8, 16]" in msg


@pytest.mark.parametrize("cap", [0.0, -1.0, math.nan, math.inf, -math.inf, True, "5"])
def test_bad_caps_are_one_line_usage_errors(cap: object) -> None:
    profile, relation = small()
    for call in (
        lambda: select(profile, relation, cap),  # type: ignore[arg-type]
        lambda: rank(profile, relation, cap),  # type: ignore[arg-type]
        lambda: best_frequency_per_batch(profile, cap),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidPowerCapError) as err:
            call()
        assert isinstance(err.value, PowerctlError) and isinstance(err.value, ValueError)
        assert "\n" not in str(err.value)


def test_integer_cap_is_accepted() -> None:
    profile, relation = small()
    assert select(profile, relation, 5) == select(profile, relation, 5.0)


def test_selection_json_has_exactly_the_design_keys() -> None:
    profile, relation = small()
    d = select(profile, relation, 5.0).to_json_dict()
    assert list(d) == ["batch_size", "frequency_hz", "predicted_s", "peak_power_w"]
    assert json.loads(json.dumps(d)) == d
    assert d["batch_size"] == 16 and d["frequency_hz"] == 200 * MHZ and d["peak_power_w"] == 4.5


def test_selection_from_loaded_files(tmp_path: Path) -> None:
    profile, relation = small()
    profile.save(tmp_path / "p.json")
    relation.save(tmp_path / "r.json")
    loaded = select(Profile.load(tmp_path / "p.json"), RelationVector.load(tmp_path / "r.json"), 5.0)
    assert loaded == select(profile, relation, 5.0)


def test_best_frequency_per_batch_worked() -> None:
    profile, _ = small()
    best = best_frequency_per_batch(profile, 5.0)
    assert list(best) == [16, 32]
    assert best[16].frequency_hz == 200 * MHZ  # 4.5 W ≤ 5
    assert best[32].frequency_hz == 100 * MHZ  # 200 MHz draws 6 W
    assert best_frequency_per_batch(profile, 3.5) == {16: profile.point(16, 100 * MHZ)}
    assert best_frequency_per_batch(profile, 2.0) == {}


def test_a_pick_is_frozen() -> None:
    sel = Pick(8, 100, 1.0, 2.0)
    with pytest.raises(AttributeError):
        sel.batch_size = 16  # type: ignore[misc]


# --- the energy objective (issue 8) ---------------------------------------------------------------
def energy_point(b: int, mhz: float, peak: float, mean: float, seconds: float) -> ProfilePoint:
    return ProfilePoint(b, round(mhz * MHZ), peak, mean, seconds * b / 1000, seconds)


def test_energy_objective_picks_the_frugal_pair_time_the_fast_one() -> None:
    # Worked by hand (r = 1 for both): fast pair 50 s at 5 W mean = 250 J; slow pair 80 s at 2.5 W = 200 J.
    profile = make_profile([energy_point(32, 900, 6.0, 5.0, 50.0), energy_point(32, 400, 3.0, 2.5, 80.0)])
    relation = make_relation({32: 1000.0})
    fast = select(profile, relation, None)
    frugal = select(profile, relation, None, objective="energy")
    assert (fast.frequency_hz, fast.predicted_s) == (900 * MHZ, 50.0)
    assert (frugal.frequency_hz, frugal.predicted_energy_j) == (400 * MHZ, 200.0)
    assert fast.predicted_energy_j == 250.0
    assert frugal.to_json_dict(with_energy=True)["predicted_energy_j"] == 200.0
    # the cap still binds: under 2.9 W neither is feasible
    with pytest.raises(InfeasibleCapError):
        select(profile, relation, 2.9, objective="energy")


def test_unknown_objective_is_one_line() -> None:
    profile, relation = small()
    with pytest.raises(PowerctlError, match="select: 'objective' must be one of time, energy, got 'joules'"):
        select(profile, relation, 5.0, objective="joules")


@FAST
@given(profiles(), st.floats(1.0, 20.0))
def test_energy_choice_is_the_least_predicted_energy(profile: Profile, cap: float) -> None:
    relation = make_relation({b: 1000.0 * b**0.5 for b in profile.batch_sizes()})
    ranked = rank(profile, relation, cap, "energy")
    if ranked:
        assert ranked[0].predicted_energy_j == min(s.predicted_energy_j for s in ranked)
        assert {(s.batch_size, s.frequency_hz) for s in ranked} == {
            (s.batch_size, s.frequency_hz) for s in rank(profile, relation, cap)
        }


def _two_seed_case() -> tuple[Profile, RelationVector]:
    """Two pairs of equal speed per sample (T_N = 1 s each); two seeds that disagree about the vector:
    seed 0: b=16 needs 1.0, b=32 1.5 (units of samples); seed 1: b=16 10, b=32 8."""
    profile = make_profile([point(16, 100, 3.0, 1.0), point(32, 100, 3.0, 1.0)])
    relation = RelationVector.from_seeds("resnet18", "cifar10", 0.8, {16: [1.0, 10.0], 32: [1.5, 8.0]})
    return profile, relation


def test_mean_and_robust_rules_disagree_on_a_hand_worked_case() -> None:
    profile, relation = _two_seed_case()
    # mean vector: b=16 5.5, b=32 4.75 → Algorithm 1 takes b=32 (predicted 4.75/4.75 = 1.0 of the largest)
    assert relation.samples_to_target == (5.5, 4.75)
    assert select(profile, relation, None).batch_size == 32
    # robust: regret of b=16 is (1/1 + 10/8)/2 = 1.125; of b=32 (1.5/1 + 8/8)/2 = 1.25 → b=16
    regret = mean_regret(profile, relation, None)
    assert regret[(16, 100 * MHZ)] == pytest.approx(1.125)
    assert regret[(32, 100 * MHZ)] == pytest.approx(1.25)
    robust = select(profile, relation, None, rule="robust")
    assert robust.batch_size == 16
    assert robust.predicted_s == pytest.approx(5.5 / 4.75)  # predictions stay the mean vector's


def test_robust_rule_without_per_seed_samples_is_the_mean_rule() -> None:
    profile, relation = small()
    for cap in (None, 5.0, 4.49, 3.5):
        assert select(profile, relation, cap, rule="robust") == select(profile, relation, cap)


def test_unknown_relation_rule_is_one_line() -> None:
    profile, relation = small()
    with pytest.raises(
        PowerctlError, match="select: 'rule' must be one of mean, robust, interval, got 'best'"
    ):
        select(profile, relation, None, rule="best")


def _three_seed_case(spread: float) -> tuple[Profile, RelationVector]:
    """b=32 at 1.0 s per sample against b=64 at 0.9 s (a larger batch uses the GPU better); the seeds
    say b=32 needs 1000 samples and b=64 1200 ± `spread` (three seeds: 1200 - spread, 1200, 1200 + spread)."""
    profile = make_profile(
        [point(32, 100, 3.0, 1000.0), point(64, 100, 3.5, 900.0), point(64, 50, 3.0, 1800.0)]
    )
    per_seed = {32: [1000.0, 1000.0, 1000.0], 64: [1200.0 - spread, 1200.0, 1200.0 + spread]}
    return profile, RelationVector.from_seeds("resnet18", "cifar10", 0.8, per_seed)


def test_the_relation_vector_states_each_batch_size_interval_from_its_seeds() -> None:
    _, relation = _three_seed_case(100.0)
    half = relation.interval_halfwidths()
    # two standard errors of the mean: sd of (1100, 1200, 1300) = 100; 2 * 100 / sqrt(3) / 1200
    assert INTERVAL_STANDARD_ERRORS == 2.0 and half[64] == pytest.approx(2 * 100 / 3**0.5 / 1200)
    assert half[32] == 0.0  # three seeds that agree: no spread
    lo, hi = relation.interval()[64]
    assert relation.as_map()[64] == 1.0 and (lo, hi) == pytest.approx((1 - half[64], 1 + half[64]))
    assert small()[1].interval_halfwidths() == dict.fromkeys(small()[1].batch_sizes, 0.0)  # no seeds kept


def test_interval_rule_gives_pairs_the_vector_cannot_tell_apart_to_the_larger_batch_size() -> None:
    # mean vector: b=32 predicts 1000 * 1000/1200 = 833 s, b=64 at 100 MHz 900 s: the mean rule takes b=32
    profile, narrow = _three_seed_case(30.0)
    assert select(profile, narrow, None, rule="mean").batch_size == 32
    # b=64's interval: 900 * (1 - 2 * 30 / sqrt(3) / 1200) = 874 s > 833 (b=32's seeds agree): b=32
    assert select(profile, narrow, None, rule="interval").batch_size == 32
    # b=64 spread by ±100: its interval reaches down to 900 * (1 - 0.096) = 813 s < 833, they overlap
    _, wide = _three_seed_case(100.0)
    picked = select(profile, wide, None, rule="interval")
    assert (picked.batch_size, picked.frequency_hz) == (64, 100 * MHZ)  # b=64's best pair, not 50 MHz
    assert picked.predicted_s == pytest.approx(900.0)  # predictions stay the mean vector's
    assert select(profile, wide, None, rule="mean").batch_size == 32
    ranked = rank(profile, wide, None, rule="interval")
    assert [(s.batch_size, s.frequency_hz // MHZ) for s in ranked] == [(64, 100), (32, 100), (64, 50)]
    # the cap still binds: under 3.2 W b=64 runs only at 50 MHz (1800 s; down to 1627), apart: b=32
    assert select(profile, wide, 3.2, rule="interval").batch_size == 32
    # energy: b=32 2.4 W x 833 s = 2000 J (its seeds agree), b=64 2.8 W x 900 s = 2520 J, down to 2277: apart
    assert select(profile, wide, None, "energy", rule="interval").batch_size == 32
    assert DEFAULT_RELATION_RULE == "interval" and select(profile, wide, None).batch_size == 64


def test_interval_rule_pairs_the_seeds_so_a_spread_every_batch_size_shares_cancels() -> None:
    """A seed slow at one batch size is slow at all (ResNet18's proxy seeds: b=64 against b=16 over 10
    seeds, 0.08 paired, 0.29 from the two entries' intervals): the rule reads each seed's own ratio."""
    profile, _ = _three_seed_case(0.0)  # b=32: 833 s on the mean vector, b=64 at 100 MHz: 900 s
    shared = RelationVector.from_seeds(
        "resnet18", "cifar10", 0.8, {32: [900.0, 1000.0, 1100.0], 64: [1080.0, 1200.0, 1320.0]}
    )
    half = shared.interval_halfwidths()
    assert half[32] == pytest.approx(half[64]) == pytest.approx(2 * 100 / 3**0.5 / 1000)
    # unpaired, the entries' intervals overlap (900 x 0.885 = 796 s < 833 x 1.115 = 929 s); paired, every
    # seed says b=64 needs 1.2x b=32's samples: no spread, and b=32 is the faster
    assert shared.paired_halfwidth(64, 32) == 0.0 and shared.paired_halfwidth(32, 32) == 0.0
    assert select(profile, shared, None, rule="interval").batch_size == 32
    # the same entries and intervals, the seeds crossed: ratios 1.47, 1.2, 0.98 cannot tell them apart
    crossed = RelationVector.from_seeds(
        "resnet18", "cifar10", 0.8, {32: [900.0, 1000.0, 1100.0], 64: [1320.0, 1200.0, 1080.0]}
    )
    assert crossed.interval_halfwidths() == pytest.approx(half)
    ratios = [1320 / 900, 1.2, 1080 / 1100]
    sem = statistics.stdev(ratios) / 3**0.5
    assert crossed.paired_halfwidth(64, 32) == pytest.approx(2 * sem / statistics.fmean(ratios))
    assert select(profile, crossed, None, rule="interval").batch_size == 64
    assert select(profile, crossed, None, rule="mean").batch_size == 32


def test_interval_rule_without_per_seed_samples_is_the_mean_rule() -> None:
    profile, relation = small()
    for cap in (None, 5.0, 4.49, 3.5):
        for objective in ("time", "energy"):
            assert select(profile, relation, cap, objective, rule="interval") == select(
                profile, relation, cap, objective
            )


def test_select_cli_takes_the_relation_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from powerctl.cli.commands import main

    profile, relation = _two_seed_case()
    profile.save(tmp_path / "p.json")
    relation.save(tmp_path / "r.json")
    picks = {}
    for rule in ("mean", "robust"):
        args = ["select", "--profile", str(tmp_path / "p.json"), "--relation", str(tmp_path / "r.json")]
        assert main([*args, "--relation-rule", rule, "--json"]) == 0
        picks[rule] = json.loads(capsys.readouterr().out)["batch_size"]
    assert picks == {"mean": 32, "robust": 16}
