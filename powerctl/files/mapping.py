"""One reader for every mapping the project reads: a value is read by its key and `Kind`; any problem is
ONE line naming the place, the key and the value (``quick.yaml: task: 'lr-max' must be a number > 0``)."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import math
import numbers
import os
import reprlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powerctl.errors import ArgumentError, PowerctlError

MISSING: Any = object()  # the default of a key that must be present

# Bounds far above any real value, low enough that a typo is one line, not an overflow.
MAX_COUNT = 10**9  # a count or amount a flag takes unless it says a lower one (samples, seconds, days)
MAX_SEED = 2**32 - 1  # what every generator here takes (numpy's legacy seed is 32 bits)
MAX_STEPS = 1000  # warm-up or measured training steps per profiled pair
MAX_ROUNDS = 100_000  # rounds of a run (Flower's counter is an int64)
MAX_BATCH_SIZE = 65_536  # far above what an edge GPU holds
MAX_CAP_W = 100_000.0  # above any board or GPU (a rack is tens of kW)


class Invalid(ValueError):
    """A kind's refusal of a value: "must be …, got …"."""


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 160
_SHOWN.maxlong = 120
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxdict = _SHOWN.maxset = 12
_SHOWN.maxlevel = 3
SHOWN_MAX = 400


def shown(value: Any) -> str:
    """`repr(value)` cut to a line (a refused value may be huge)."""
    text = _SHOWN.repr(value)
    return text if len(text) <= SHOWN_MAX else text[: SHOWN_MAX - 3] + "..."


def must_be(expected: str, value: Any) -> Invalid:
    return Invalid(f"must be {expected}, got {shown(value)}")


def is_integer(value: Any) -> bool:
    """An int or a numpy integer scalar, not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float, numpy's scalars included, not a bool."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int beyond any float (10**400)
        return False


class Kind:
    """What a value must be (`expected`); `__call__` returns it typed or raises `Invalid`."""

    expected: str = "a value"
    python_type: Any = object

    def __call__(self, value: Any) -> Any:
        raise NotImplementedError

    def to_config(self, value: Any) -> Any:
        return value


@dataclass(frozen=True)
class Integer(Kind):
    minimum: int | None = None
    maximum: int | None = None

    @property
    def expected(self) -> str:  # type: ignore[override]
        return "an integer" + _bounds(self.minimum, self.maximum, False, False)

    python_type = int

    def __call__(self, value: Any) -> int:
        if not is_integer(value) or not _within(value, self.minimum, self.maximum, False, False):
            raise must_be(self.expected, value)
        return int(value)


@dataclass(frozen=True)
class Number(Kind):
    """A finite number (an int is taken as a float); `above`/`below` make a bound strict."""

    minimum: float | None = None
    maximum: float | None = None
    above: bool = False
    below: bool = False
    unit: str = ""

    @property
    def expected(self) -> str:  # type: ignore[override]
        bounds = _bounds(self.minimum, self.maximum, self.above, self.below)
        what = f"a number of {self.unit}" if self.unit else "a number"
        return what + bounds if bounds else ("a finite number" if not self.unit else what)

    python_type = float

    def __call__(self, value: Any) -> float:
        if not is_number(value) or not _within(value, self.minimum, self.maximum, self.above, self.below):
            raise must_be(self.expected, value)
        return float(value)


@dataclass(frozen=True)
class Flag(Kind):
    expected = "true or false"
    python_type = bool

    def __call__(self, value: Any) -> bool:
        if not isinstance(value, bool):
            raise must_be(self.expected, value)
        return value


@dataclass(frozen=True)
class Text(Kind):
    """A string, stripped; `empty` allows ""."""

    empty: bool = False
    what: str = ""

    @property
    def expected(self) -> str:  # type: ignore[override]
        return self.what or ("a string" if self.empty else "a non-empty string")

    python_type = str

    def __call__(self, value: Any) -> str:
        if not isinstance(value, str) or not (self.empty or value.strip()):
            raise must_be(self.expected, value)
        if not encodable(value):
            raise must_be(f"{self.expected} that UTF-8 can write", value)
        return value.strip()


def encodable(text: str) -> bool:
    """Whether UTF-8 can write `text` (a lone surrogate cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Choice(Kind):
    options: tuple[str, ...]

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"one of {', '.join(self.options)}"

    python_type = str

    def __call__(self, value: Any) -> str:
        if not isinstance(value, str) or value.strip() not in self.options:
            raise must_be(self.expected, value)
        return value.strip()


@dataclass(frozen=True)
class Distinct(Kind):
    """Distinct values `item` accepts: a list, or text separated by commas (a run config holds no lists);
    `what` names them in the plural; `ascending` gives them back sorted."""

    item: Kind
    what: str
    example: str
    ascending: bool = False

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"distinct {self.what}, a list or separated by commas (e.g. {self.example})"

    python_type = list

    def __call__(self, value: Any) -> list[Any]:
        # separated by commas (or semicolons); an empty item stays, for the item's kind to refuse
        items = [t.strip() for t in value.replace(";", ",").split(",")] if isinstance(value, str) else value
        if isinstance(value, str) and isinstance(self.item, Integer):
            items = [int(v) if v.lstrip("-").isdigit() else v for v in items]
        try:
            checked = [self.item(v) for v in items] if isinstance(items, list) else None
        except Invalid:
            checked = None
        if not checked or len(set(checked)) != len(checked):
            raise must_be(self.expected, value)
        return sorted(checked) if self.ascending else checked

    def to_config(self, value: Any) -> str:
        return ",".join(str(v) for v in value)


def distinct_ints(minimum: int, example: str, *, maximum: int, ascending: bool = False) -> Distinct:
    return Distinct(Integer(minimum, maximum), f"integers ≥ {minimum} and ≤ {maximum}", example, ascending)


def distinct_names(options: tuple[str, ...]) -> Distinct:
    return Distinct(Choice(options), f"names from {', '.join(options)}", ",".join(options[:2]))


@dataclass(frozen=True)
class JsonObject(Kind):
    """A JSON object written as text (a ConfigRecord holds no nested records)."""

    expected = "a JSON object"
    python_type = dict

    def __call__(self, value: Any) -> dict[str, Any]:
        try:
            obj = json.loads(value) if isinstance(value, str) else None
        except ValueError:
            obj = None
        except RecursionError:
            raise must_be(f"{self.expected} nested less deeply", value) from None
        if not isinstance(obj, dict):
            raise must_be(self.expected, value)
        return obj


@dataclass(frozen=True)
class FolderPath(Kind):
    """A folder a Python caller names, as a Path: not '' or '.'; `expected` in the caller's words."""

    expected: str = "a folder path"
    python_type = Path

    def __call__(self, value: Any) -> Path:
        text = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
        if not isinstance(text, str) or not text or Path(text) == Path(".") or not encodable(text):
            raise must_be(f"{self.expected}, not empty or '.'", value)
        return Path(text)


@dataclass(frozen=True)
class Maybe(Kind):
    """`kind`, or None ("not given")."""

    kind: Kind

    @property
    def expected(self) -> str:  # type: ignore[override]
        return f"{self.kind.expected} or None"

    @property
    def python_type(self) -> Any:
        return self.kind.python_type

    def __call__(self, value: Any) -> Any:
        if value is None:
            return None
        try:
            return self.kind(value)
        except Invalid:
            raise must_be(self.expected, value) from None

    def to_config(self, value: Any) -> Any:
        return None if value is None else self.kind.to_config(value)


@dataclass(frozen=True)
class Custom(Kind):
    """A kind made from a function that returns the value or raises `Invalid`."""

    parse: Callable[[Any], Any]
    expected: str = "a value"
    python_type: Any = object

    def __call__(self, value: Any) -> Any:
        return self.parse(value)


def number_text(v: float) -> str:
    """A bound as people write it: 1000000000, not 1e+09."""
    return str(int(v)) if float(v).is_integer() and abs(v) < 1e16 else f"{v:g}"


def _bounds(lo: float | None, hi: float | None, above: bool, below: bool) -> str:
    if lo is not None and hi is not None:
        return f" in {'(' if above else '['}{number_text(lo)}, {number_text(hi)}{')' if below else ']'}"
    if lo is not None:
        return f" {'>' if above else '≥'} {number_text(lo)}"
    if hi is not None:
        return f" {'<' if below else '≤'} {number_text(hi)}"
    return ""


def bounds_text(kind: Integer | Number) -> str:
    """The range of a bounded kind in words for a flag's help: "in [1, 1000000000]", "> 0"."""
    strict = (kind.above, kind.below) if isinstance(kind, Number) else (False, False)
    return _bounds(kind.minimum, kind.maximum, *strict).strip()


def _within(v: float, lo: float | None, hi: float | None, above: bool, below: bool) -> bool:
    if lo is not None and (v < lo or (above and v == lo)):
        return False
    return not (hi is not None and (v > hi or (below and v == hi)))


class MappingReader:
    """Typed reads of one mapping; every failure is one line of `error` naming `where`, the key, the value."""

    def __init__(self, data: Any, where: str, error: type[PowerctlError] = PowerctlError) -> None:
        self.data, self.where, self.error = data, where, error

    def fail(self, key_or_text: str, why: str | None = None) -> PowerctlError:
        """``{where}: {key!r} {why}``; with one argument, ``{where}: {text}``."""
        if why is None:
            return self.error(f"{self.where}: {key_or_text}")
        return self.error(f"{self.where}: {key_or_text!r} {why}")

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def get(self, key: str, default: Any = MISSING) -> Any:
        if key in self.data:
            return self.data[key]
        if default is MISSING:
            raise self.fail(f"missing key {key!r}")
        return default

    def value(self, key: str, kind: Kind, default: Any = MISSING) -> Any:
        """The value of `key` checked by `kind`; `default` (returned as given) when absent."""
        return self.check(key, self.data[key], kind) if key in self.data else self.get(key, default)

    def check(self, key: str, value: Any, kind: Kind | Callable[[Any], Any]) -> Any:
        """`value` (found under `key`, or inside it) checked by `kind`, or this reader's one-line error."""
        try:
            return kind(value)
        except Invalid as exc:
            raise self.fail(key, str(exc)) from None

    def only(self, known: Collection[str]) -> MappingReader:
        """Refuse any key not in `known`, naming the nearest known one (or all of them)."""
        for key in sorted(str(k) for k in self.data):
            if key not in known:
                near = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
                hint = f"did you mean {near[0]!r}?" if near else f"keys are {', '.join(known)}"
                raise self.fail(f"unknown key {key!r}; {hint}")
        return self

    def section(self, key: str, known: Collection[str]) -> MappingReader:
        """The mapping under `key` (absent or empty: {}), its keys checked; errors name ``{where}: {key}``."""
        raw = self.data.get(key)
        return mapping_reader(raw if raw is not None else {}, f"{self.where}: {key}", self.error, known)

    def number(self, key: str, *, positive: bool = False, default: Any = MISSING) -> float:
        """A finite number ≥ 0; `positive`: > 0."""
        return self.value(key, Number(0.0, above=positive), default)

    def list_of(self, key: str) -> list[Any]:
        v = self.get(key)
        if not isinstance(v, list):
            raise self.fail(key, f"must be a list, got {v!r}")
        return v


def mapping_reader(
    data: Any, where: str, error: type[PowerctlError], known: Collection[str]
) -> MappingReader:
    """A reader of `data`, which must be a mapping with only the `known` keys."""
    if not isinstance(data, Mapping):
        keys = f" with keys {', '.join(known)}" if known else ""
        raise error(f"{where}: must be a mapping{keys}, got {data!r}")
    return MappingReader(data, where, error).only(known)


FIELD_KIND = "kind"  # the metadata key of a record field's kind
FIELD_RECORD = "record"  # the metadata key of a field holding another record, read from the same mapping


def kind_field(kind: Kind, default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING) -> Any:
    """A record's dataclass field declared with its kind, which `field_kinds` gives to `check_fields`."""
    return dataclasses.field(default=default, default_factory=factory, metadata={FIELD_KIND: kind})


def field_kinds(record: Any) -> dict[str, Kind]:
    """{field: kind} of a record (or record class) whose fields were declared with `kind_field`."""
    return {f.name: f.metadata[FIELD_KIND] for f in dataclasses.fields(record) if FIELD_KIND in f.metadata}


def read_fields(record: Any, r: MappingReader, key: Callable[[str], str] = str) -> dict[str, Any]:
    """The arguments of `record` (a class) read from `r`: each `kind_field` under `key(name)` by its kind
    (absent: its default; none: None where its kind takes None, else `r`'s missing-key line), and each
    nested record made in turn."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        if FIELD_RECORD in f.metadata:
            values[f.name] = f.metadata[FIELD_RECORD](**read_fields(f.metadata[FIELD_RECORD], r, key))
        elif FIELD_KIND in f.metadata and key(f.name) in r:
            values[f.name] = r.value(key(f.name), f.metadata[FIELD_KIND])
        elif FIELD_KIND in f.metadata and f.default is f.default_factory is dataclasses.MISSING:
            values[f.name] = None if isinstance(f.metadata[FIELD_KIND], Maybe) else r.get(key(f.name))
    return values


def check_fields(record: Any, where: str, kinds: Mapping[str, Kind]) -> None:
    """In a record's `__post_init__`: its fields named in `kinds` checked and set to what they give back."""
    checked = check_arguments(where, **{name: (getattr(record, name), kind) for name, kind in kinds.items()})
    for name, value in checked.items():
        object.__setattr__(record, name, value)


def check_arguments(where: str, **arguments: tuple[Any, Kind]) -> dict[str, Any]:
    """A Python call's arguments, each `name=(value, kind)`, checked (one ArgumentError line) and typed."""
    reader = MappingReader({}, where, ArgumentError)
    return {name: reader.check(name, value, kind) for name, (value, kind) in arguments.items()}


def accepts(fn: Callable[..., Any], count: int) -> bool | None:
    """Whether `fn` takes `count` positional arguments; None when its signature cannot be read."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*range(count))
    except TypeError:
        return False
    return True


def check_callable(
    where: str, name: str, fn: Any, arguments: str, *counts: int, optional: bool = False
) -> None:
    """A callback checked where it is given: not callable, or taking none of `counts` positional
    arguments (`arguments` names them), is one ArgumentError line; None passes if `optional`."""
    if fn is None and optional:
        return
    if not callable(fn):
        raise ArgumentError(
            f"{where}: {name!r} must be callable, got {shown(fn)}; it is called as {name}{arguments}"
        )
    if all(accepts(fn, n) is False for n in counts):
        label = f"{getattr(fn, '__name__', type(fn).__name__)}{inspect.signature(fn)}"
        raise ArgumentError(f"{where}: {name!r} must take {arguments}, got {shown(label)}")


def check_result(where: str, name: str, value: Any, types: Any, what: str) -> Any:
    """A callback's result not one of `types` is one ArgumentError line (`what` it must return)."""
    bool_ok = bool in (types if isinstance(types, tuple) else (types,))
    if not isinstance(value, types) or (isinstance(value, bool) and not bool_ok):
        raise ArgumentError(f"{where}: {name} returned {shown(value)}; it must return {what}")
    return value
