"""The baselines every comparison reports (docs/design/method.md), and a method-vs-baselines table. A
baseline's pair the profile does not hold keeps its (b, f) with no prediction ("not profiled").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from powerctl.devices.boards import BoardModel, board_model
from powerctl.errors import InfeasibleCapError
from powerctl.records.pick import Pick
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.selection.capsource import parse_power_cap
from powerctl.selection.joint import common_batch_sizes, predicted_s, select
from powerctl.selection.names import ORACLE, OURS, PROXY_BATCH, STATE_OF_PRACTICE


def predict(
    profile: Profile, relation: RelationVector | None, batch_size: int, frequency_hz: int
) -> float | None:
    """T_N(b, f) · r_b, or None when the point is not profiled or the relation lacks b."""
    point = profile.point(batch_size, frequency_hz)
    if point is None or relation is None:
        return None
    r_b = relation.as_map().get(batch_size)
    return None if r_b is None else predicted_s(point, r_b)


def _make(
    name: str, profile: Profile, relation: RelationVector | None, batch_size: int, frequency_hz: int
) -> Pick:
    point = profile.point(batch_size, frequency_hz)
    return Pick(
        batch_size,
        frequency_hz,
        predicted_s=predict(profile, relation, batch_size, frequency_hz),
        peak_power_w=None if point is None else point.peak_power_w,
        method=name,
    )


def fixed_frequency(profile: Profile, power_cap_w: float | None, board: BoardModel | None = None) -> int:
    """The state-of-practice frequency: the one clock of a profile not pinned, else the board's."""
    cap = parse_power_cap(power_cap_w, text=False)
    if profile.extra.get("pinned", True) is False and profile.frequencies():
        return profile.frequencies()[-1]
    return board_fixed_frequency(board or board_model(profile.device.removeprefix("sim:")), cap)


def board_fixed_frequency(board: BoardModel, power_cap_w: float | None) -> int:
    """The board's highest frequency keeping every model under the cap (no cap: its top one); none: one
    InfeasibleCapError line. Needs no profile, so commands check it before any work."""
    cap = parse_power_cap(power_cap_w, text=False)
    if cap is None:
        return board.frequencies_hz[-1]
    hz = board.fixed_frequency_cap(cap)
    if hz is None:
        raise InfeasibleCapError(
            f"state of practice: no fixed frequency of {board.name} keeps every model under {cap:.2f} W: "
            "even "
            f"{board.frequencies_hz[0] / 1e6:.1f} MHz reaches {board.least_fixed_power_w():.2f} W; "
            f"raise the cap to at least {board.least_fixed_power_w():.2f} W"
        )
    return hz


def state_of_practice(
    profile: Profile,
    power_cap_w: float | None,
    board: BoardModel | None = None,
    *,
    relation: RelationVector | None = None,
) -> Pick:
    """Baseline 1: the largest batch size that fits (= the largest profiled) at the fixed frequency cap."""
    hz = fixed_frequency(profile, power_cap_w, board)
    return _make(STATE_OF_PRACTICE, profile, relation, max(profile.batch_sizes()), hz)


def proxy_batch(
    profile: Profile, relation: RelationVector, power_cap_w: float | None, board: BoardModel | None = None
) -> Pick:
    """Baseline 2: the profiled batch size with the least samples to target on the proxy data (ties → the
    larger), at the fixed frequency cap. Batch sizes not profiled (out of memory) cannot be chosen."""
    hz = fixed_frequency(profile, power_cap_w, board)
    samples = relation.samples_map()
    b = min(common_batch_sizes(profile, relation), key=lambda b: (samples[b], -b))
    return _make(PROXY_BATCH, profile, relation, b, hz)


def oracle(profile: Profile, target_relation: RelationVector, power_cap_w: float | None) -> Pick:
    """The feasible pair with the least mean time to the target on the target data itself: always the
    mean rule (the other rules guard a proxy's vector against its seeds' spread)."""
    return replace(select(profile, target_relation, power_cap_w, rule="mean"), method=ORACLE)


def _speedup(base: float | None, method: float | None) -> float | None:
    return None if base is None or method is None else base / method


def compare(
    profile: Profile,
    relation: RelationVector,
    power_cap_w: float | None,
    *,
    target_relation: RelationVector | None = None,
) -> list[dict[str, Any]]:
    """A row per method and baseline (the oracle with a target relation): {name, infeasible}, else the
    pick's fields, feasible, speedup over ours and, under a target relation, *_target the same."""
    cap = parse_power_cap(power_cap_w, text=False)
    ours = replace(select(profile, relation, cap), method=OURS)
    makers: dict[str, Callable[[], Pick]] = {
        OURS: lambda: ours,
        STATE_OF_PRACTICE: lambda: state_of_practice(profile, cap, relation=relation),
        PROXY_BATCH: lambda: proxy_batch(profile, relation, cap),
    }
    if target_relation is not None:

        def _oracle() -> Pick:
            orc = oracle(profile, target_relation, cap)
            return _make(ORACLE, profile, relation, orc.batch_size, orc.frequency_hz)

        makers[ORACLE] = _oracle
    method_target = predict(profile, target_relation, ours.batch_size, ours.frequency_hz)
    rows: list[dict[str, Any]] = []
    for name, make in makers.items():
        try:
            b = make()
        except InfeasibleCapError as exc:  # one row says why; the others are still worth printing
            rows.append({"name": name, "infeasible": str(exc)})
            continue
        row = {"name": name, **b.to_json_dict()}
        row["feasible"] = None if b.peak_power_w is None else (cap is None or b.peak_power_w <= cap)
        row["speedup"] = _speedup(b.predicted_s, ours.predicted_s)
        if target_relation is not None:
            t = predict(profile, target_relation, b.batch_size, b.frequency_hz)
            row["predicted_seconds_target"] = t
            row["speedup_target"] = _speedup(t, method_target)
        rows.append(row)
    return rows
