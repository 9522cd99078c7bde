"""Board models (powerctl/data/boards.yaml); a board may be `derived_from` a measured one, and every
constant names its source (measured, derived or estimated)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import cache
from importlib import resources
from typing import Any, cast

import numpy as np
import yaml

from powerctl.errors import DeviceError
from powerctl.files.readfile import YAML_LIMIT, read_bytes

SOURCE_KINDS = ("measured", "derived", "estimated")


def source_kind(source: object) -> str | None:
    """``KIND[, qualifier]`` of a source line ``KIND[, qualifier] — where it comes from``, else None."""
    kind, dash, where = str(source).partition(" — ")
    ok = isinstance(source, str) and dash and where.strip() and kind.split(",")[0] in SOURCE_KINDS
    return kind if ok else None


@dataclass(frozen=True)
class StateOfPracticeTable:
    """Per frequency, the largest peak power of any training profile of the model set (`powerctl caps`)."""

    peak_training_power_w: tuple[float, ...]
    models: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    derivation: str


@dataclass(frozen=True)
class TimeCalibration:
    """The paper's training seconds (top clock, no cap) that a board's constants reproduce."""

    reference: str
    model: str
    batch_size: int
    seconds: dict[str, tuple[float, float]]  # target → (reference board's seconds, this one's)

    def paper_time_ratio(self) -> float:
        """Reference seconds over this board's, averaged over the targets."""
        return float(np.mean([ref / own for ref, own in self.seconds.values()]))


@dataclass(frozen=True)
class BoardModel:
    name: str
    description: str
    frequencies_hz: tuple[int, ...]
    full_load_power_w: tuple[float, ...]  # SGEMM at full load: the most any workload draws
    idle_power_w: float
    gflops_per_ghz: float
    memory_bytes: int
    training_memory_bytes: int
    memory_bandwidth_gbs: float
    memory_efficiency: float  # share of the DRAM's peak bandwidth training reaches
    half_utilisation_gflop_per_kernel: float  # GFLOP per kernel at half the peak utilisation
    utilisation_exponent: float  # 1: plain saturation; < 1: growth over decades
    max_utilisation: float
    overhead_utilisation: float
    step_overhead_s: float  # CPU time per step outside the kernels
    launch_s: float  # CPU time to launch one kernel
    optimizer_kernels_per_tensor: float
    rails: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)
    state_of_practice: StateOfPracticeTable | None = None
    calibration: TimeCalibration | None = None

    def source_kind(self, key: str) -> str:
        """Where constant `key` comes from: ``measured``, ``derived``, ``estimated[, calibrated]``."""
        return source_kind(self.sources[key]) or ""

    def full_load_power(self, hz: int) -> float:
        try:
            return self.full_load_power_w[self.frequencies_hz.index(hz)]
        except ValueError:
            raise DeviceError(f"{hz} Hz is not a frequency of {self.name}") from None

    def fixed_power_w(self) -> tuple[float, ...]:
        """Per frequency, the peak power the state-of-practice rule keeps under a cap."""
        table = self.state_of_practice
        return table.peak_training_power_w if table else self.full_load_power_w

    def fixed_frequency_cap(self, power_cap_w: float) -> int | None:
        """State of practice: the highest frequency whose `fixed_power_w` stays ≤ the cap (None: none)."""
        ok = [f for f, p in zip(self.frequencies_hz, self.fixed_power_w(), strict=True) if p <= power_cap_w]
        return ok[-1] if ok else None

    def overhead_power_w(self, hz: int) -> float:
        """Power of a step's frequency-independent phase at `hz`: the least any training step draws."""
        return self.idle_power_w + self.overhead_utilisation * (self.full_load_power(hz) - self.idle_power_w)

    def least_power_w(self) -> float:
        """The least peak power of any training step on this board: under it nothing runs."""
        return self.overhead_power_w(self.frequencies_hz[0])

    def least_fixed_power_w(self) -> float:
        """The lowest frequency's entry of the state-of-practice table: no fixed frequency below it."""
        return self.fixed_power_w()[0]


_NUMBERS = tuple(f.name for f in fields(BoardModel) if f.type in ("int", "float"))
"""The scalar constants (int for the byte counts, float for the rest), each read from the board entry."""
CONSTANTS = (
    "frequencies_hz",
    "full_load_power_w",
    "cuda_cores",
    "cpu_clock_ghz",
    "energy_per_flop_factor",
    "rails",
    *_NUMBERS,
)
"""Every number of a board entry (after derivation): each needs a `sources` line."""


def _derive(name: str, raw: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """Fill what `raw` leaves out from the measured board `ref`: throughput and utilisation half-point
    scale with cores, CPU-side costs with CPU clocks, and full-load power is idle + the reference's energy
    per FLOP at the same relative clock (times `energy_per_flop_factor`) × FLOP/s."""
    out = dict(raw)
    cores = float(raw["cuda_cores"]) / float(ref["cuda_cores"])
    cpu = float(ref["cpu_clock_ghz"]) / float(raw["cpu_clock_ghz"])
    factors = {"gflops_per_ghz": cores, "half_utilisation_gflop_per_kernel": cores}
    factors |= {"launch_s": cpu, "step_overhead_s": cpu}
    kept = ("memory_efficiency", "utilisation_exponent", "max_utilisation", "overhead_utilisation")
    for key in (*factors, *kept, "optimizer_kernels_per_tensor"):
        out.setdefault(key, float(ref[key]) * factors.get(key, 1.0))
    if "full_load_power_w" not in raw:
        ref_f = np.array(ref["frequencies_hz"], dtype=float)
        ref_dyn = np.array(ref["full_load_power_w"], dtype=float) - float(ref["idle_power_w"])
        ref_j_per_flop = ref_dyn / (float(ref["gflops_per_ghz"]) * ref_f)
        f = np.array(raw["frequencies_hz"], dtype=float)
        j_per_flop = np.interp(f / f[-1], ref_f / ref_f[-1], ref_j_per_flop)
        dyn = float(raw["energy_per_flop_factor"]) * j_per_flop * float(out["gflops_per_ghz"]) * f
        out["full_load_power_w"] = [round(float(raw["idle_power_w"]) + d, 3) for d in dyn]
    return out


def _parse_table(name: str, raw: dict[str, Any] | None, n: int) -> StateOfPracticeTable | None:
    if raw is None:
        return None
    power = tuple(float(p) for p in raw["peak_training_power_w"])
    if len(power) != n:
        raise ValueError(f"boards.yaml: {name}: state_of_practice needs one peak power per frequency")
    return StateOfPracticeTable(
        peak_training_power_w=power,
        models=tuple(str(m) for m in raw["models"]),
        batch_sizes=tuple(int(b) for b in raw["batch_sizes"]),
        derivation=str(raw["derivation"]),
    )


def _parse_calibration(
    name: str, raw: dict[str, Any] | None, boards: dict[str, Any]
) -> TimeCalibration | None:
    if raw is None:
        return None
    ref = str(raw["reference"])
    if ref == name or ref not in boards:
        raise ValueError(f"calibration: reference {ref!r} must be another board of this file")
    pairs: dict[str, tuple[float, float]] = {}
    for target, v in dict(raw["seconds"]).items():
        if not (
            isinstance(v, list) and len(v) == 2 and all(math.isfinite(float(s)) and float(s) > 0 for s in v)
        ):
            raise ValueError(
                f"calibration: seconds: {target}: expected [reference board s, this board s], both > 0"
            )
        pairs[str(target)] = (float(v[0]), float(v[1]))
    if not pairs:
        raise ValueError("calibration: seconds: expected at least one target")
    return TimeCalibration(ref, str(raw["model"]), int(raw["batch_size"]), pairs)


def _parse(name: str, raw: dict[str, Any], boards: dict[str, Any]) -> BoardModel:
    if "derived_from" in raw:
        raw = _derive(name, raw, boards[raw["derived_from"]])
    sources = dict(raw.get("sources") or {})
    for key in CONSTANTS:
        if key in raw and source_kind(sources.get(key)) is None:
            raise ValueError(
                f"constant {key} has no valid source; add under sources: "
                f"`{key}: measured|derived|estimated — where it comes from`"
            )
    freqs = tuple(int(f) for f in raw["frequencies_hz"])
    power = tuple(float(p) for p in raw["full_load_power_w"])
    if len(freqs) != len(power) or list(freqs) != sorted(set(freqs)):
        raise ValueError(f"boards.yaml: {name}: frequencies must be ascending, one power value each")
    if list(power) != sorted(power):
        raise ValueError(f"boards.yaml: {name}: full-load power must not fall as frequency rises")
    return BoardModel(
        name=name,
        description=str(raw["description"]),
        frequencies_hz=freqs,
        full_load_power_w=power,
        rails=tuple(raw.get("rails", ())),
        sources=sources,
        state_of_practice=_parse_table(name, raw.get("state_of_practice"), len(freqs)),
        calibration=_parse_calibration(name, raw.get("calibration"), boards),
        **cast(
            "dict[str, Any]", {k: (int(raw[k]) if k.endswith("bytes") else float(raw[k])) for k in _NUMBERS}
        ),
    )


def _raw_boards() -> dict[str, Any]:
    """The decoded boards.yaml, read bounded."""
    with resources.as_file(resources.files("powerctl.data").joinpath("boards.yaml")) as path:
        try:
            raw = read_bytes(path, limit=YAML_LIMIT, what="the board models (boards.yaml)", error=DeviceError)
        except OSError as exc:
            raise DeviceError(f"{path}: cannot read the board models ({exc.strerror}); reinstall") from None
    return dict(yaml.safe_load(raw.decode()))


def parse_boards(raw: Any, where: str = "boards.yaml") -> dict[str, BoardModel]:
    """Board models from the decoded YAML; anything malformed is one DeviceError line naming the board."""
    if not isinstance(raw, dict) or not raw:
        raise DeviceError(f"{where}: expected a mapping of board names to board models")
    boards = {}
    for name, r in raw.items():
        try:
            if not isinstance(r, dict):
                raise TypeError("expected a mapping")
            boards[str(name)] = _parse(str(name), r, raw)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as exc:
            what = f"missing {exc}" if isinstance(exc, KeyError) else str(exc).removeprefix(f"{where}: ")
            raise DeviceError(f"{where}: board {name!r}: {what}") from None
    return boards


@cache
def load_boards() -> dict[str, BoardModel]:
    return parse_boards(_raw_boards())


def board_names() -> list[str]:
    return sorted(load_boards())


def board_model(name: str) -> BoardModel:
    """The model of board `name` (e.g. ``jetson-nano``); unknown → one DeviceError line."""
    boards = load_boards()
    if name not in boards:
        raise DeviceError(f"no board model named {name!r}; known boards: {', '.join(sorted(boards))}")
    return boards[name]
