"""Board models: frequency tables, calibrated power and throughput (powerctl/data/boards.yaml).

They drive the simulated boards and give every board with a known name its state-of-practice
frequency cap: the highest frequency at which even a full-load SGEMM stays under a power limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import yaml

from powerctl.errors import DeviceError

_FIELDS = (
    "idle_power_w",
    "gflops_per_ghz",
    "memory_bytes",
    "training_memory_bytes",
    "memory_bandwidth_gbs",
    "half_utilisation_gflop",
    "max_utilisation",
    "overhead_utilisation",
    "step_overhead_s",
)


@dataclass(frozen=True)
class BoardModel:
    name: str
    description: str
    frequencies_hz: tuple[int, ...]
    full_load_power_w: tuple[float, ...]
    """Wall power of SGEMM at full load, per frequency: the most any workload can draw."""
    idle_power_w: float
    gflops_per_ghz: float
    memory_bytes: int
    training_memory_bytes: int
    memory_bandwidth_gbs: float
    half_utilisation_gflop: float
    max_utilisation: float
    overhead_utilisation: float
    step_overhead_s: float
    rails: tuple[str, ...] = ()
    sources: dict[str, str] = field(default_factory=dict)

    def full_load_power(self, hz: int) -> float:
        try:
            return self.full_load_power_w[self.frequencies_hz.index(hz)]
        except ValueError:
            raise DeviceError(f"{hz} Hz is not a frequency of {self.name}") from None

    def fixed_frequency_cap(self, power_cap_w: float) -> int | None:
        """State of practice: the highest frequency whose full-load power is ≤ the cap (None: none)."""
        ok = [f for f, p in zip(self.frequencies_hz, self.full_load_power_w, strict=True) if p <= power_cap_w]
        return ok[-1] if ok else None


def _parse(name: str, raw: dict[str, Any]) -> BoardModel:
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
        sources=dict(raw.get("sources", {})),
        **{k: (int(raw[k]) if k.endswith("bytes") else float(raw[k])) for k in _FIELDS},
    )


@cache
def load_boards() -> dict[str, BoardModel]:
    text = resources.files("powerctl.data").joinpath("boards.yaml").read_text(encoding="utf-8")
    return {name: _parse(name, raw) for name, raw in yaml.safe_load(text).items()}


def board_names() -> list[str]:
    return sorted(load_boards())


def board_model(name: str) -> BoardModel:
    """The model of board `name` (e.g. ``jetson-nano``); unknown → one DeviceError line."""
    boards = load_boards()
    if name not in boards:
        raise DeviceError(f"no board model named {name!r}; known boards: {', '.join(sorted(boards))}")
    return boards[name]
