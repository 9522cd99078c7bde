"""Power caps that change over time (docs/design/changing-caps.md): `CapSource.cap_at(t)` is the cap t
seconds after the source started (None: no cap); `parse_cap_source` reads every way of writing one.
"""

from __future__ import annotations

import bisect
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powerctl.errors import PowerctlError
from powerctl.files.mapping import MAX_CAP_W, Invalid, Kind, is_number, must_be
from powerctl.files.readfile import LIVE_CAP_LIMIT, TRACE_LIMIT, read_bytes


class InvalidPowerCapError(PowerctlError, ValueError):
    """A power cap that is not a positive finite number of watts (a usage error, not an infeasible cap)."""


class CapSourceError(InvalidPowerCapError):
    """A cap source that cannot be used (unsorted times, negative watts, unreadable file); one line."""


@dataclass(frozen=True)
class PowerCapKind(Kind):
    """The one power cap check, as a `powerctl.files.mapping` kind: None (no cap) or a positive finite
    number of watts, else `Invalid`; a string may say it ("none", "", "3.5") only with `text`."""

    text: bool = True

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"a number of watts > 0 and ≤ {MAX_CAP_W:g}, or {'none' if self.text else 'None'}"

    python_type = float

    def __call__(self, value: Any) -> float | None:
        if value is None:
            return None
        if self.text and isinstance(value, str):
            stripped = value.strip()
            if stripped.lower() in ("none", ""):
                return None
            try:
                value = float(stripped)
            except ValueError:
                raise must_be(self.expected, value) from None
        if not is_number(value) or value <= 0 or value > MAX_CAP_W:
            raise must_be(self.expected, value)
        return float(value)


POWER_CAP = PowerCapKind()
POWER_CAP_VALUE = PowerCapKind(text=False)
"""A cap given in Python (`Profiler.run(power_cap_w=...)`): a number of watts or None, no text."""


def parse_power_cap(
    value: Any,
    where: str = "power cap",
    *,
    text: bool = True,
    error: type[InvalidPowerCapError] = InvalidPowerCapError,
) -> float | None:
    """The one power cap parser: `PowerCapKind`, or one `error` line ``{where} must be …, got …``."""
    try:
        return PowerCapKind(text)(value)
    except Invalid as exc:
        raise error(f"{where} {exc}") from None


MAX_TIME_S = 1e9
"""The latest time a source may name and its options' largest value: about 31 years."""

MAX_POINTS = 100_000
"""The most points `powerctl cap-source` lists or draws."""

StepList = list[tuple[float, float | None]]


class CapSource(ABC):
    """A power cap as a function of time since the source started."""

    @abstractmethod
    def cap_at(self, t_s: float) -> float | None:
        """The cap in force at `t_s` seconds (None: no cap)."""

    def steps_until(self, until_s: float) -> StepList:
        """Every (t_s, cap) at which the cap changes in [0, until_s], the first at 0 (a live file: now)."""
        return [(0.0, self.cap_at(0.0))]

    def lowest_w(self) -> float | None:
        """The lowest cap the source will ever give (None: no cap ever, or not known in advance)."""
        return None

    @property
    def is_constant(self) -> bool:
        return False

    @abstractmethod
    def describe(self) -> str:
        """One line for logs and reports."""


class _HeldCap(CapSource):
    """A cap held from each of `times_s` (from 0, rising) until the next; at the end `repeat`ed (period:
    the last time plus the last interval) or `clip`ped (the last holds)."""

    times_s: tuple[float, ...]
    watts: tuple[float | None, ...]
    end: str = "clip"
    name: str = "schedule"

    @property
    def period_s(self) -> float:
        if len(self.times_s) == 1:
            return math.inf
        return self.times_s[-1] + (self.times_s[-1] - self.times_s[-2])

    def cap_at(self, t_s: float) -> float | None:
        if self.end == "repeat" and t_s >= self.period_s:
            t_s = math.fmod(t_s, self.period_s)
        i = bisect.bisect_right(self.times_s, t_s) - 1
        return self.watts[max(i, 0)]

    def steps_until(self, until_s: float) -> StepList:
        rows = list(zip(self.times_s, self.watts, strict=True))
        if self.end == "clip" or not math.isfinite(self.period_s):
            return [(t, w) for t, w in rows if t <= until_s]
        periods = math.floor(until_s / self.period_s) + 1
        if periods * len(rows) > MAX_POINTS:
            raise CapSourceError(
                f"{self.name}: {periods:,} repeats of {len(rows)} rows up to {until_s:g} s are more than "
                f"{MAX_POINTS:,} steps to draw; lower --until"
            )
        return [
            (k * self.period_s + t, w)
            for k in range(periods)
            for t, w in rows
            if k * self.period_s + t <= until_s
        ]

    def lowest_w(self) -> float | None:
        return min((w for w in self.watts if w is not None), default=None)

    @property
    def is_constant(self) -> bool:
        return len(set(self.watts)) == 1


@dataclass(frozen=True)
class ConstantCap(_HeldCap):
    """One cap from 0 on: a held cap of one step."""

    power_cap_w: float | None

    def __post_init__(self) -> None:
        parse_power_cap(self.power_cap_w, "constant cap", text=False, error=CapSourceError)
        object.__setattr__(self, "times_s", (0.0,))
        object.__setattr__(self, "watts", (self.power_cap_w,))

    def describe(self) -> str:
        return "none" if self.power_cap_w is None else f"{self.power_cap_w:g} W"


@dataclass(frozen=True)
class ScheduleCap(_HeldCap):
    """``steps[i] = (t_s, W)`` holds until the next step's time, the last for ever; times from 0, rising."""

    steps: tuple[tuple[float, float | None], ...]

    @classmethod
    def from_pairs(cls, pairs: Sequence[Sequence[object]], where: str = "schedule") -> ScheduleCap:
        """``[[t_s, W or None], ...]`` → a schedule, or one CapSourceError line naming the step."""
        if not pairs:
            raise CapSourceError(f"{where}: a schedule needs at least one [t_s, W] step")
        steps: list[tuple[float, float | None]] = []
        for i, pair in enumerate(pairs):
            here = f"{where}[{i}]"
            if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
                raise CapSourceError(f"{here}: expected a step [t_s, W], got {pair!r}")
            t, w = pair
            time = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else math.nan
            _check_time(here, time, steps[-1][0] if steps else None, repr(t))
            steps.append((time, parse_power_cap(w, here, error=CapSourceError)))
        return cls(tuple(steps))

    def __post_init__(self) -> None:
        object.__setattr__(self, "times_s", tuple(t for t, _ in self.steps))
        object.__setattr__(self, "watts", tuple(w for _, w in self.steps))

    def describe(self) -> str:
        shown = [f"{t:g}s:{'none' if w is None else f'{w:g}W'}" for t, w in self.steps[:8]]
        if len(self.steps) > 8:  # one line for logs: a schedule of thousands of steps is not listed whole
            shown.append(f"… {len(self.steps)} steps to {self.steps[-1][0]:g}s")
        return "schedule [" + ", ".join(shown) + "]"


TRACE_ENDS = ("repeat", "clip")


@dataclass(frozen=True)
class TraceCap(_HeldCap):
    """A recorded power budget: rows ``seconds,watts``, by default repeated."""

    times_s: tuple[float, ...]
    watts: tuple[float, ...]
    end: str = "repeat"
    name: str = "trace"

    @classmethod
    def load(
        cls, path: str | Path, *, end: str = "repeat", scale: float = 1.0, time_scale: float = 1.0
    ) -> TraceCap:
        """Read a CSV trace (an optional header; `#` comments), or one CapSourceError line naming the row.
        `scale` multiplies the watts, `time_scale` the times (both > 0: `parse_cap_source` checks them)."""
        path = Path(path)
        if end not in TRACE_ENDS:
            raise CapSourceError(f"{path}: end must be one of {', '.join(TRACE_ENDS)}, got {end!r}")
        text = _read_text(path, TRACE_LIMIT, "a cap trace (CSV)", "cap trace")
        times: list[float] = []
        watts: list[float] = []
        header_seen = False
        for lineno, line in enumerate(text.splitlines(), 1):
            row = line.split("#", 1)[0].strip()
            if not row:
                continue
            cells = [c.strip() for c in row.split(",")]
            here = f"{path}:{lineno}"
            try:
                t, w = (float(c) for c in cells)
            except ValueError:
                if not times and not header_seen and len(cells) == 2 and not any(map(_is_number, cells)):
                    header_seen = True  # a header line, e.g. seconds,watts
                    continue
                raise CapSourceError(f"{here}: expected 'seconds,watts' (two numbers), got {row!r}") from None
            _check_time(
                here, t * time_scale, times[-1] if times else None, _scaled(cells[0], time_scale, "timescale")
            )
            try:  # the one cap check: a trace (after scale) holds no cap a constant or a schedule may not
                watts.append(POWER_CAP_VALUE(w * scale))  # type: ignore[arg-type]
            except Invalid:
                got = _scaled(cells[1], scale, "scale")
                raise CapSourceError(
                    f"{here}: a cap must be a number of watts > 0 and ≤ {MAX_CAP_W:g}, got {got}"
                ) from None
            times.append(t * time_scale)
        if not times:
            raise CapSourceError(f"{path}: the cap trace has no 'seconds,watts' rows")
        return cls(tuple(times), tuple(watts), end, str(path))

    def describe(self) -> str:
        return (
            f"trace {self.name} ({len(self.times_s)} rows, {min(self.watts):g}–{max(self.watts):g} W, "
            f"{'repeats every ' + format(self.period_s, 'g') + ' s' if self.end == 'repeat' else 'clipped'})"
        )


class LiveFileCap(CapSource):
    """A file an operator rewrites (watts or `none`), read at most every `poll_s` seconds of the caller's
    clock. Unreadable or senseless later: the last good cap stays, with a warning."""

    def __init__(self, path: str | Path, poll_s: float = 1.0) -> None:
        self.path, self.poll_s = Path(path), poll_s
        self.warnings: list[str] = []
        self._cap = self._read()  # unreadable at the start: one error line
        self._next_poll_s = poll_s
        self._last_t_s = 0.0

    def _read(self) -> float | None:
        # never blocks and never reads much: this runs inside the training loop
        text = _read_text(self.path, LIVE_CAP_LIMIT, "a live cap file", "live cap file").strip()
        if text.lower() == "none":
            return None
        try:
            return POWER_CAP_VALUE(float(text))
        except ValueError:  # not a number, or not a cap (Invalid)
            raise CapSourceError(
                f"{self.path}: the live cap file must hold a number of watts or none, got {text[:40]!r}"
            ) from None

    def cap_at(self, t_s: float) -> float | None:
        # time going back = another run (or another board) following the same file: read it now
        if t_s >= self._next_poll_s or t_s < self._last_t_s:
            self._next_poll_s = t_s + self.poll_s
            try:
                self._cap = self._read()
            except CapSourceError as exc:
                self.warnings.append(f"at {t_s:.1f} s: {exc}; keeping {cap_text(self._cap)}")
        self._last_t_s = t_s
        return self._cap

    def describe(self) -> str:
        return f"live file {self.path} (read every {self.poll_s:g} s)"


def _check_time(here: str, t: float, last: float | None, got: str) -> None:
    """The next time of a schedule or trace, after `last` (seconds), else one CapSourceError line."""
    if not math.isfinite(t) or t < 0:
        raise CapSourceError(f"{here}: a time must be a number of seconds ≥ 0, got {got}")
    if t > MAX_TIME_S:
        raise CapSourceError(f"{here}: a time must be at most {MAX_TIME_S:g} s (about 31 years), got {got}")
    if last is None and t != 0:
        raise CapSourceError(f"{here}: times start at 0 s, got {got}")
    if last is not None and t <= last:
        raise CapSourceError(f"{here}: times must increase, got {got} after {last:g}")


def _scaled(cell: str, factor: float, option: str) -> str:
    return cell if factor == 1 else f"{cell} × {option} {factor:g}"


def _read_text(path: Path, limit: int, what: str, name: str) -> str:
    """The file's text, or one CapSourceError line ``PATH: cannot read the {name} (why)``."""
    try:
        return read_bytes(path, limit=limit, what=what, error=CapSourceError).decode()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise CapSourceError(f"{path}: cannot read the {name} ({why})") from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def cap_text(cap: float | None) -> str:
    """A cap in words: "no cap" or "3.5 W"."""
    return "no cap" if cap is None else f"{cap:g} W"


SOURCE_FORMS = (
    "a number of watts, none, a schedule [[t_s, W], ...], trace:PATH[?end=repeat|clip&scale=X&timescale=X] "
    "or live:PATH[?poll=S]"
)


def parse_cap_source(value: Any, where: str, base_dir: Path | None = None) -> CapSource:
    """Every way a cap is given (`SOURCE_FORMS`; a schedule as a list or JSON) → a source, relative paths
    from `base_dir` (default: the working directory); anything else: one CapSourceError line."""
    if isinstance(value, (list, tuple)):
        return ScheduleCap.from_pairs(value, where)
    text = value.strip() if isinstance(value, str) else ""
    if text.startswith("["):
        try:
            pairs = json.loads(text)
        except ValueError:
            raise CapSourceError(
                f"{where}: a schedule must be JSON like [[0, 5], [60, 3]], got {text!r}"
            ) from None
        return ScheduleCap.from_pairs(pairs, where)  # JSON text starting with [ is a list
    kind, sep, rest = text.partition(":")
    if sep and kind in ("trace", "live"):
        path_text, _, query = rest.partition("?")
        if not path_text:
            raise CapSourceError(f"{where}: {kind}: needs a file path, e.g. {kind}:caps/solar.csv")
        path = Path(path_text).expanduser()
        if not path.is_absolute():
            path = ((base_dir or Path.cwd()) / path).resolve()
        options = _options(query, where, {"trace": ("end", "scale", "timescale"), "live": ("poll",)}[kind])
        if kind == "live":
            return LiveFileCap(path, _number(options.get("poll", "1"), "poll", where))
        return TraceCap.load(
            path,
            end=options.get("end", "repeat"),
            scale=_number(options.get("scale", "1"), "scale", where),
            time_scale=_number(options.get("timescale", "1"), "timescale", where),
        )
    if isinstance(value, str) and not _is_number(text) and text.lower() not in ("", "none"):
        raise CapSourceError(f"{where} must be {SOURCE_FORMS}, got {value!r}")
    return ConstantCap(parse_power_cap(value, where, error=CapSourceError))


def _options(query: str, where: str, allowed: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, query.split("&")):
        key, eq, val = item.partition("=")
        if not eq or key not in allowed:
            raise CapSourceError(f"{where}: unknown option {item!r}; options are {', '.join(allowed)}")
        if key in out:  # which one was meant? the last silently winning hides a typo
            raise CapSourceError(f"{where}: option {key} is given twice ({out[key]!r}, {val!r}); keep one")
        out[key] = val
    return out


def _number(text: str, name: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise CapSourceError(f"{where}: {name} must be a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0 or value > MAX_TIME_S:
        raise CapSourceError(f"{where}: {name} must be a positive number ≤ {MAX_TIME_S:g}, got {text!r}")
    return value
