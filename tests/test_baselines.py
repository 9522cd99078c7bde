"""The three baselines (state-of-practice, proxy-batch, oracle) and the comparison table."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerctl.devices.boards import board_model
from powerctl.errors import DeviceError, InfeasibleCapError
from powerctl.records.pick import Pick
from powerctl.records.profile import Profile, ProfilePoint
from powerctl.records.relation import RelationVector
from powerctl.selection.baselines import compare, oracle, proxy_batch, state_of_practice
from powerctl.selection.joint import select
from powerctl.selection.methods import ORACLE, PROXY_BATCH, STATE_OF_PRACTICE
from tests.test_selection import MHZ, make_profile, make_relation, point, profiles

NANO = board_model("jetson-nano")
NANO_FREQS = list(NANO.frequencies_hz)
assert NANO.state_of_practice is not None
NANO_SOP = dict(zip(NANO.frequencies_hz, NANO.state_of_practice.peak_training_power_w, strict=True))
NANO_5W = NANO.fixed_frequency_cap(5.0)  # 768 MHz: every model at every batch size stays ≤ 4.93 W there


def nano_grid(batch_sizes: list[int], device: str = "jetson-nano") -> Profile:
    """Every Nano frequency for each batch size; power and time grow/fall with b and f like a real board."""
    pts = []
    for b in batch_sizes:
        u = b / (b + 32)  # larger batches use the GPU better: more power, less time per sample
        for hz in NANO_FREQS:
            peak = 2.0 + u * (NANO_SOP[hz] - 2.0)  # never above the state-of-practice table
            seconds = 1000.0 / (u * hz / 1e9)
            pts.append(ProfilePoint(b, hz, peak, peak * 0.9, seconds * b / 1000, seconds))
    return make_profile(pts, device)


# --- state of practice ----------------------------------------------------------------------------------


def test_state_of_practice_on_a_nano_at_5_w() -> None:
    # Training profiles of the model set peak at 4.93 W at 768 MHz and 5.42 W at 844.8: the fixed cap for 5 W
    # is 768 MHz (full-load SGEMM would have given 614.4 MHz, two steps lower).
    assert NANO_5W == 768_000_000
    profile = nano_grid([8, 32, 128])
    relation = make_relation({8: 3000.0, 32: 2000.0, 128: 4000.0})
    base = state_of_practice(profile, 5.0, relation=relation)
    assert (base.method, base.batch_size, base.frequency_hz) == (STATE_OF_PRACTICE, 128, NANO_5W)
    p = profile.point(128, NANO_5W)
    assert base.peak_power_w == p.peak_power_w
    assert base.predicted_s == pytest.approx(p.seconds_for_samples * 1.0)  # r_128 = 1: largest batch
    # Without a relation it still says which (b, f), but predicts nothing.
    assert state_of_practice(profile, 5.0).predicted_s is None


def test_state_of_practice_looks_up_the_board_by_device_name() -> None:
    for device in ("jetson-nano", "sim:jetson-nano"):
        assert state_of_practice(nano_grid([16], device), 5.0).frequency_hz == NANO_5W
    tx2 = board_model("jetson-tx2nx")
    assert state_of_practice(
        nano_grid([16], "nvml:0"), 5.0, board=tx2
    ).frequency_hz == tx2.fixed_frequency_cap(5.0)
    with pytest.raises(DeviceError):
        state_of_practice(nano_grid([16], "nvml:0"), 5.0)


def test_state_of_practice_with_no_cap() -> None:
    profile = nano_grid([16, 64])
    assert state_of_practice(profile, None).frequency_hz == 921_600_000  # no cap: nothing to hold back


def test_state_of_practice_cap_below_every_fixed_frequency() -> None:
    with pytest.raises(InfeasibleCapError) as err:
        state_of_practice(nano_grid([16]), 2.0)  # at 76.8 MHz the model set already peaks at 2.28 W
    msg = str(err.value)
    assert "\n" not in msg and "2.00 W" in msg and f"{NANO_SOP[NANO_FREQS[0]]:.2f} W" in msg


def test_state_of_practice_point_not_profiled_predicts_none() -> None:
    # An efficient-order profile that skipped (128, 768 MHz).
    full = nano_grid([32, 128])
    profile = make_profile([p for p in full.points if (p.batch_size, p.frequency_hz) != (128, NANO_5W)])
    base = state_of_practice(profile, 5.0, relation=make_relation({32: 1.0, 128: 1.0}))
    assert (base.batch_size, base.frequency_hz) == (128, NANO_5W)
    assert base.predicted_s is None and base.peak_power_w is None


# --- proxy batch ----------------------------------------------------------------------------------------


def test_proxy_batch_takes_the_least_samples_among_profiled_batch_sizes() -> None:
    profile = nano_grid([8, 16, 32, 64])  # 128 and 256 did not fit in memory
    relation = make_relation({8: 5000.0, 16: 3000.0, 32: 3500.0, 64: 4000.0, 128: 6000.0, 256: 1000.0})
    base = proxy_batch(profile, relation, 5.0)
    assert (base.method, base.batch_size, base.frequency_hz) == (PROXY_BATCH, 16, NANO_5W)
    p = profile.point(16, NANO_5W)
    assert base.predicted_s == pytest.approx(p.seconds_for_samples * 3000.0 / 1000.0)  # r_16 = 3000/1000


def test_proxy_batch_ties_go_to_the_larger_batch() -> None:
    profile = nano_grid([8, 16, 32])
    relation = make_relation({8: 2000.0, 16: 2000.0, 32: 2500.0})
    assert proxy_batch(profile, relation, 5.0).batch_size == 16


# --- oracle ---------------------------------------------------------------------------------------------


def test_oracle_is_select_with_the_target_relation() -> None:
    profile = nano_grid([8, 16, 32, 64, 128])
    target = make_relation({8: 9000.0, 16: 5000.0, 32: 4000.0, 64: 4500.0, 128: 7000.0}, "target")
    for cap in (3.0, 4.0, 5.0, 7.0, None):
        orc = oracle(profile, target, cap)
        sel = select(profile, target, cap)
        assert orc == replace(sel, method=ORACLE)


def test_the_oracle_takes_the_least_mean_time_even_where_the_seeds_cannot_tell_the_pairs_apart() -> None:
    """A target relation from seeds whose spread the default interval rule reads as a tie between batch
    sizes (it then takes the larger): the oracle is still the pair with the least mean time."""
    profile = nano_grid([16, 32, 64])
    target = RelationVector.from_seeds(
        "resnet18",
        "target",
        0.5,
        {16: [3000.0, 6000.0, 4500.0], 32: [5000.0, 4000.0, 6500.0], 64: [9000.0, 5000.0, 7000.0]},
    )
    for cap in (4.0, None):
        by_interval = select(profile, target, cap, rule="interval")
        by_mean = select(profile, target, cap, rule="mean")
        assert (by_interval.batch_size, by_interval.frequency_hz) != (
            by_mean.batch_size,
            by_mean.frequency_hz,
        )
        orc = oracle(profile, target, cap)
        assert orc == replace(by_mean, method=ORACLE)
        r = target.as_map()
        feasible = [p for p in profile.points if cap is None or p.peak_power_w <= cap]
        assert orc.predicted_s == min(p.seconds_for_samples * r[p.batch_size] for p in feasible)


@st.composite
def nano_cases(draw: st.DrawFn) -> tuple[Profile, RelationVector, RelationVector, float]:
    """Profiles over the Nano's frequencies whose peaks never exceed the state-of-practice table (what the
    table promises for the model set: what makes the fixed cap safe),
    a proxy and a target relation over the same batch sizes, and a cap the fixed-cap table can meet."""
    profile = draw(profiles(frequencies=NANO_FREQS, peak_bound=NANO_SOP))
    bss = profile.batch_sizes()
    samples = st.floats(100.0, 1e5)
    proxy = make_relation({b: draw(samples) for b in bss})
    target = make_relation({b: draw(samples) for b in bss}, "target")
    cap = draw(st.floats(NANO_SOP[NANO_FREQS[0]], 10.0))
    return profile, proxy, target, cap


@settings(max_examples=200, deadline=None)
@given(nano_cases())
def test_oracle_is_never_slower_than_the_method_or_the_baselines(
    case: tuple[Profile, RelationVector, RelationVector, float],
) -> None:
    profile, proxy, target, cap = case
    try:
        orc = oracle(profile, target, cap)
    except InfeasibleCapError:
        return
    method = select(profile, proxy, cap)
    others = [
        (method.batch_size, method.frequency_hz),
        *(
            (b.batch_size, b.frequency_hz)
            for b in (state_of_practice(profile, cap, NANO), proxy_batch(profile, proxy, cap, NANO))
        ),
    ]
    r = target.as_map()
    for b, f in others:
        p = profile.point(b, f)
        if p is None:
            continue  # not profiled: nothing to compare
        assert p.peak_power_w <= cap  # the fixed cap keeps any workload under the limit
        assert orc.predicted_s <= p.seconds_for_samples * r[b]


# --- comparison table -----------------------------------------------------------------------------------


def test_compare_rows_and_speedups() -> None:
    profile = nano_grid([8, 16, 32, 64, 128])
    proxy = make_relation({8: 6000.0, 16: 3000.0, 32: 3200.0, 64: 4000.0, 128: 6000.0})
    target = make_relation({8: 5000.0, 16: 3500.0, 32: 3000.0, 64: 4200.0, 128: 6000.0}, "target")
    rows = compare(profile, proxy, 5.0, target_relation=target)
    assert json.loads(json.dumps(rows)) == rows
    by = {r["name"]: r for r in rows}
    assert list(by) == ["ours", STATE_OF_PRACTICE, PROXY_BATCH, ORACLE]
    method = select(profile, proxy, 5.0)
    assert (by["ours"]["batch_size"], by["ours"]["frequency_hz"]) == (
        method.batch_size,
        method.frequency_hz,
    )
    assert by["ours"]["speedup"] == 1.0 and by["ours"]["speedup_target"] == 1.0
    assert (by[STATE_OF_PRACTICE]["batch_size"], by[STATE_OF_PRACTICE]["frequency_hz"]) == (128, NANO_5W)
    assert by[PROXY_BATCH]["batch_size"] == 16
    for row in rows:
        assert row["feasible"] is True
        assert row["speedup"] == pytest.approx(row["predicted_s"] / method.predicted_s)
        assert row["speedup_target"] == pytest.approx(
            row["predicted_seconds_target"] / by["ours"]["predicted_seconds_target"]
        )
    # The method beats both baselines under the relation it optimises; the oracle is the limit under the
    # target relation.
    assert by[STATE_OF_PRACTICE]["speedup"] >= 1 and by[PROXY_BATCH]["speedup"] >= 1
    assert by[ORACLE]["predicted_seconds_target"] == min(r["predicted_seconds_target"] for r in rows)
    assert by[ORACLE]["speedup_target"] <= 1


def test_compare_without_target_has_no_oracle_and_handles_unprofiled_baselines() -> None:
    full = nano_grid([16, 128])
    profile = make_profile([p for p in full.points if (p.batch_size, p.frequency_hz) != (128, NANO_5W)])
    rows = compare(profile, make_relation({16: 1.0, 128: 1.0}), 5.0)
    assert [r["name"] for r in rows] == ["ours", STATE_OF_PRACTICE, PROXY_BATCH]
    sop = rows[1]
    assert sop["predicted_s"] is None and sop["speedup"] is None and sop["feasible"] is None
    assert "predicted_seconds_target" not in sop


def test_baseline_json() -> None:
    b = Pick(128, 614_400_000, method=STATE_OF_PRACTICE)
    assert b.to_json_dict() == {
        "batch_size": 128,
        "frequency_hz": 614_400_000,
        "predicted_s": None,
        "peak_power_w": None,
    }
    rows = compare(nano_grid([16, 128]), make_relation({16: 1.0, 128: 1.0}), 5.0)
    keys = ["name", "batch_size", "frequency_hz", "predicted_s", "peak_power_w"]
    assert all(list(r)[:5] == keys for r in rows)  # the name first, then the pick's four keys


def test_hand_built_comparison() -> None:
    # Worked by hand: r_16 = 0.5, r_64 = 1. Cap 4.5 W on a Nano → fixed 691.2 MHz (state-of-practice table).
    #   (64, 691.2)  4.0 W  T 100 → 100 s   state of practice (largest batch at the fixed cap)
    #   (64, 768)    5.5 W                  over the cap
    #   (16, 691.2)  3.0 W  T 160 →  80 s   proxy batch (fewest samples)
    #   (16, 768)    4.4 W  T 130 →  65 s   the method: smaller batch, higher frequency
    profile = make_profile(
        [
            point(64, 691.2, 4.0, 100.0),
            point(64, 768, 5.5, 70.0),
            point(16, 691.2, 3.0, 160.0),
            point(16, 768, 4.4, 130.0),
        ]
    )
    relation = make_relation({16: 500.0, 64: 1000.0})
    rows = {r["name"]: r for r in compare(profile, relation, 4.5)}
    assert (rows["ours"]["batch_size"], rows["ours"]["frequency_hz"]) == (16, 768 * MHZ)
    assert rows["ours"]["predicted_s"] == pytest.approx(65.0)
    assert rows[STATE_OF_PRACTICE]["predicted_s"] == pytest.approx(100.0)
    assert rows[STATE_OF_PRACTICE]["speedup"] == pytest.approx(100 / 65)
    assert rows[PROXY_BATCH]["batch_size"] == 16 and rows[PROXY_BATCH]["speedup"] == pytest.approx(80 / 65)
