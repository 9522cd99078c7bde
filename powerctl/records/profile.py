"""The profile table: peak power and time per (batch size, GPU frequency) — `powerctl.profile/2`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from powerctl.errors import ArgumentError
from powerctl.files.jsonfile import Fields, frozen_json, plain_json, read_json, write_json
from powerctl.files.mapping import (
    MAX_BATCH_SIZE,
    MAX_CAP_W,
    MAX_COUNT,
    Custom,
    Integer,
    Maybe,
    Number,
    Text,
    check_fields,
    field_kinds,
    is_integer,
    kind_field,
    must_be,
    read_fields,
)

PROFILE_SCHEMA = "powerctl.profile/2"

_WATTS = Number(0.0, MAX_CAP_W, above=True)
_SECONDS = Number(0.0, above=True)
MEAN_OVER_PEAK = 1 + 1e-9  # how far a point's mean power may sit above its peak: rounding


@dataclass(frozen=True)
class ProfilePoint:
    batch_size: int = kind_field(Integer(1, MAX_BATCH_SIZE))
    frequency_hz: int = kind_field(Integer(1))
    peak_power_w: float = kind_field(_WATTS)
    mean_power_w: float = kind_field(_WATTS)
    seconds_per_batch: float = kind_field(_SECONDS)
    seconds_for_samples: float = kind_field(_SECONDS)  # T_N(b, f): seconds to process `samples` here

    def __post_init__(self) -> None:
        """Checked as a file's point is, one ArgumentError line naming the field."""
        check_fields(self, "ProfilePoint", POINT_KINDS)
        if self.mean_power_w > self.peak_power_w * MEAN_OVER_PEAK:
            raise ArgumentError(
                f"ProfilePoint: 'mean_power_w' {self.mean_power_w!r} exceeds 'peak_power_w' "
                f"{self.peak_power_w!r}; the mean of a step's power is never above its peak"
            )

    @classmethod
    def measured(
        cls,
        batch_size: int,
        frequency_hz: int,
        peak_w: float,
        mean_w: float,
        per_batch_s: float,
        samples: int,
    ) -> ProfilePoint:
        """A pair measured over steps (the mean power capped at the peak), T_N for `samples`."""
        return cls(
            batch_size=batch_size,
            frequency_hz=frequency_hz,
            peak_power_w=peak_w,
            mean_power_w=min(mean_w, peak_w),
            seconds_per_batch=per_batch_s,
            seconds_for_samples=per_batch_s * samples / batch_size,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "peak_power_w": round(self.peak_power_w, 4),
            "mean_power_w": round(self.mean_power_w, 4),
        }


POINT_KINDS = field_kinds(ProfilePoint)
"""What each field of a profiled point must be, in a file and in Python alike."""


def _tuple_of(what: str, item: Callable[[Any], bool], made: Callable[[Any], Any] = int) -> Custom:
    """The kind of a list or tuple whose items pass `item`, kept as a tuple of `made` of them."""

    def parse(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, (list, tuple)) or not all(item(v) for v in value):
            raise must_be(what, value)
        return tuple(made(v) for v in value)

    return Custom(parse, what, tuple)


_SHAPE = _tuple_of("a list of integers ≥ 1", lambda d: is_integer(d) and d >= 1)
_POINTS = _tuple_of("a list of ProfilePoint", lambda q: isinstance(q, ProfilePoint), lambda q: q)
_SKIPPED = _tuple_of("a list", lambda _: True, frozen_json)  # each batch size left out, with why


@dataclass
class Profile:
    """Measured on one device for one model and input shape; a missing point = not profiled. Its
    sequences are tuples (compare them with tuples; `to_dict` writes lists)."""

    device: str = kind_field(Text())
    model: str = kind_field(Text())
    input_shape: Sequence[int] = kind_field(_SHAPE)
    samples: int = kind_field(Integer(1, MAX_COUNT))
    points: Sequence[ProfilePoint] = kind_field(_POINTS)
    profiling_s: float | None = kind_field(Maybe(Number(0.0)), None)  # device seconds profiling cost
    skipped: Sequence[Mapping[str, Any]] = kind_field(_SKIPPED, factory=tuple)
    extra: dict[str, Any] = field(default_factory=dict)
    predicted: Sequence[ProfilePoint] = kind_field(_POINTS, factory=tuple)
    """Points predicted, not measured (file key `predicted_points`); selection reads `points` only."""

    def __post_init__(self) -> None:
        """A profile made in Python has the shape a file's reader gives (one ArgumentError line)."""
        check_fields(self, "Profile", PROFILE_KINDS)
        if not isinstance(self.extra, dict):
            raise ArgumentError(f"Profile: 'extra' must be a dict, got {self.extra!r:.80}")

    def batch_sizes(self) -> list[int]:
        return sorted({p.batch_size for p in self.points})

    def frequencies(self) -> list[int]:
        return sorted({p.frequency_hz for p in self.points})

    def point(self, batch_size: int, frequency_hz: int) -> ProfilePoint | None:
        return next(
            (p for p in self.points if (p.batch_size, p.frequency_hz) == (batch_size, frequency_hz)), None
        )

    def to_dict(self) -> dict[str, Any]:
        head = ("device", "model", "input_shape", "samples")  # the input shape as a list
        d = {"schema": PROFILE_SCHEMA, **{k: plain_json(getattr(self, k)) for k in head}}
        d["points"] = [p.to_dict() for p in self.points]
        if self.profiling_s is not None:
            d["profiling_s"] = self.profiling_s
        if self.skipped:
            d["skipped"] = plain_json(self.skipped)
        if self.predicted:
            d["predicted_points"] = [p.to_dict() for p in self.predicted]
        d.update(self.extra)
        return d

    def save(self, path: str | Path) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "profile") -> Profile:
        f = Fields(data, where)
        if f.get("input_shape") == []:  # a file names the shape it was measured for
            raise f.fail("input_shape", "must be a list of integers ≥ 1, got []")
        seen: set[tuple[int, int]] = set()
        points = _points(f, "points", where, seen)
        if not points:
            raise f.fail("no profiled points")
        predicted = _points(f, "predicted_points", where, seen) if "predicted_points" in data else []
        read = {**data, "points": points, "predicted": predicted, "skipped": data.get("skipped") or ()}
        return cls(
            **read_fields(cls, Fields(read, where)),
            extra={k: v for k, v in data.items() if k not in _KNOWN},
        )

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.from_dict(read_json(path, PROFILE_SCHEMA), str(path))


PROFILE_KINDS = field_kinds(Profile)
"""What a profile's fields must be, in a file and in Python alike."""
_KNOWN = {"schema", "predicted_points", *PROFILE_KINDS} - {"predicted"}  # a file's other keys: `extra`


def _points(f: Fields, key: str, where: str, seen: set[tuple[int, int]]) -> list[ProfilePoint]:
    """The points under `key`; a pair already in `seen` is refused."""
    points: list[ProfilePoint] = []
    for i, raw in enumerate(f.list_of(key)):
        if not isinstance(raw, dict):
            raise f.fail(f"{key}[{i}] must be an object")
        pf = Fields(raw, f"{where}: {key}[{i}]")
        values = read_fields(ProfilePoint, pf)
        if values["mean_power_w"] > values["peak_power_w"] * MEAN_OVER_PEAK:
            raise pf.fail("mean_power_w exceeds peak_power_w")
        p = ProfilePoint(**values)
        pair = (p.batch_size, p.frequency_hz)
        if pair in seen:
            raise pf.fail(f"duplicate point for batch size {pair[0]} at {pair[1]} Hz")
        seen.add(pair)
        points.append(p)
    return points
