"""State-of-practice frequency caps, derived as the paper does from training profiles: the highest
frequency at which every point of every profile stays ≤ the cap, whatever the model or batch size.
"""

from __future__ import annotations

from collections.abc import Sequence

from powerctl.devices.boards import BoardModel
from powerctl.errors import FileFormatError, InfeasibleCapError
from powerctl.records.profile import Profile
from powerctl.records.workload import Workload

SOP_BATCH_SIZES = (4, 8, 16, 32, 64, 128)
"""Batch sizes of the paper's profiles (docs/design/method.md)."""


def peak_power_by_frequency(profiles: Sequence[Profile]) -> dict[int, float]:
    """Per frequency, the largest peak power of any profile's point; only frequencies every profile holds
    at each of its batch sizes (one an efficient order skipped is not known to be safe)."""
    devices = {p.device.removeprefix("sim:") for p in profiles}
    if len(devices) > 1:
        raise FileFormatError(
            f"profiles of different devices ({', '.join(sorted(devices))}): caps are per device"
        )
    common = set.intersection(*(set(p.frequencies()) for p in profiles))
    out: dict[int, float] = {}
    for hz in sorted(common):
        at = [[pt.peak_power_w for pt in p.points if pt.frequency_hz == hz] for p in profiles]
        if all(len(w) == len(p.batch_sizes()) for w, p in zip(at, profiles, strict=True)):
            out[hz] = max(max(w) for w in at)
    return out


def frequency_cap(profiles: Sequence[Profile], power_cap_w: float) -> int:
    """The highest frequency keeping every profiled point ≤ `power_cap_w` (none: InfeasibleCapError)."""
    least = min((pt for p in profiles for pt in p.points), key=lambda pt: pt.peak_power_w)
    if least.peak_power_w > power_cap_w:  # the cap, not the profiles' coverage, rules everything out
        raise InfeasibleCapError(
            f"no profiled point stays under {power_cap_w:.2f} W: the least peak power is "
            f"{least.peak_power_w:.2f} W (batch size {least.batch_size} at "
            f"{least.frequency_hz / 1e6:.1f} MHz); raise the cap to at least {least.peak_power_w:.2f} W"
        )
    peaks = peak_power_by_frequency(profiles)
    if not peaks:
        raise InfeasibleCapError("the profiles share no frequency profiled at every batch size")
    ok = [hz for hz, w in peaks.items() if w <= power_cap_w]
    if not ok:
        hz, w = min(peaks.items(), key=lambda kv: kv[1])
        raise InfeasibleCapError(
            f"no fixed frequency keeps every profile under {power_cap_w:.2f} W: even {hz / 1e6:.1f} MHz "
            f"reaches {w:.2f} W; raise the cap to at least {w:.2f} W"
        )
    return max(ok)


def derive_peak_training_power(
    board: BoardModel, workloads: Sequence[Workload], batch_sizes: Sequence[int] = SOP_BATCH_SIZES
) -> list[float]:
    """boards.yaml's `state_of_practice.peak_training_power_w`: per frequency of `board`, the largest peak
    power of the predicted profiles of `workloads` at every batch size that fits (rounded to mW)."""
    from powerctl.devices.simulated import predicted_profile

    profiles = [predicted_profile(board, w, batch_sizes, samples=1000) for w in workloads]
    peaks = peak_power_by_frequency(profiles)
    return [round(peaks[hz], 3) for hz in board.frequencies_hz]
