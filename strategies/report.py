"""What a client reports after a round: its producers' records (`Training`, `Profiling`, `CapFollowed`)
nested in the `ClientReport`, each field checked by its kind where it is made and where it is read back.
It travels as one flat ConfigRecord: every field under its kebab-case name, None left out, lists and
objects as JSON text; a registered `BesideReport` travels beside it."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator, Mapping
from dataclasses import Field, asdict, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from flwr.app import ConfigRecord

from powerctl.files.mapping import (
    FIELD_KIND,
    FIELD_RECORD,
    Choice,
    Flag,
    Integer,
    Invalid,
    Kind,
    Maybe,
    Number,
    Text,
    check_fields,
    field_kinds,
    must_be,
    read_fields,
    shown,
)
from powerctl.files.mapping import kind_field as kind
from powerctl.records.pick import Pick
from powerctl.selection.follow import CapEvent
from powerctl.selection.guard import StepDown
from powerctl.selection.methods import METHODS
from powerctl.selection.names import OURS
from strategies.protocol import ARRAYS_KEY, CONFIG_KEY, METRICS_KEY, REPORT_KEY, reader
from strategies.settings import PROFILE_ORDERS, key_of

NUMBER, COUNT, TEXT = Number(0.0), Integer(0), Text(empty=True)


@dataclass(frozen=True)
class JsonItems(Kind):
    """Items that travel as JSON text: a list of `item`s (`length` of them, when given), or with `keys`
    an object of them by those keys. `item` is a kind, or the kinds of an object's exact keys. Checked,
    kept as sent."""

    item: Kind | Mapping[str, Kind]
    expected: str = "a JSON list"
    keys: tuple[str, ...] | None = None
    length: int | None = None

    def __call__(self, value: Any) -> Any:
        try:
            data = json.loads(value) if isinstance(value, str) else copy.deepcopy(value)
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict if self.keys else list) or len(data) != (self.length or len(data)):
            raise must_be(self.expected, value)
        for k, v in data.items() if isinstance(data, dict) else enumerate(data):
            if self.keys and k not in self.keys:
                raise Invalid(f"keys must be among {', '.join(self.keys)}, got {k!r}")
            self._check(v)
        return data

    def _check(self, v: Any) -> None:
        kinds = self.item if isinstance(self.item, Mapping) else {"": self.item}
        if kinds is self.item and (not isinstance(v, dict) or set(v) != set(kinds)):
            raise Invalid(f"entries must have the keys {', '.join(kinds)}, got {shown(v)}")
        for k, of in kinds.items():
            try:
                of(v[k] if k else v)
            except Invalid as exc:
                raise Invalid(f"{k or 'an entry'} {exc}") from None

    def to_config(self, value: Any) -> str:
        return json.dumps(value, sort_keys=True)


def nested(record: type[Record], *, required: bool = False) -> Any:
    """A field that holds another record (its defaults where it is not `required`)."""
    meta = {FIELD_RECORD: record}
    return field(metadata=meta) if required else field(default_factory=record, metadata=meta)


R = TypeVar("R", bound="Record")


class Record:
    """A report record: each field declared with its kind (`kind`) or as a nested record (`nested`);
    one without a default must be in a reply unless its kind takes None (`Maybe`)."""

    def __post_init__(self) -> None:
        check_fields(self, type(self).__name__, field_kinds(self))

    @classmethod
    def names(cls) -> list[str]:
        """Its fields' names, the nested records' included."""
        return [
            n
            for f in _fields(cls)
            for n in (f.metadata[FIELD_RECORD].names() if FIELD_RECORD in f.metadata else [f.name])
        ]

    def _leaves(self) -> Iterator[tuple[Field[Any], Any]]:
        """Every field with its value, the nested records' included, in order."""
        for f in _fields(self):
            value = getattr(self, f.name)
            yield from value._leaves() if FIELD_RECORD in f.metadata else [(f, value)]

    def to_config(self) -> ConfigRecord:
        """Every field under its kebab-case key, None left out."""
        leaves = [(f, v) for f, v in self._leaves() if v is not None]
        return ConfigRecord({key_of(f.name): f.metadata[FIELD_KIND].to_config(v) for f, v in leaves})

    def columns(self) -> dict[str, Any]:
        """Every field by its name: what a results row holds."""
        return {f.name: copy.deepcopy(v) for f, v in self._leaves()}

    @classmethod
    def from_config(cls: type[R], record: Any, where: str = "train reply report") -> R:
        """This record (its nested ones too) read back from a reply, each field by its kind."""
        return cls(**read_fields(cls, reader(record, where), key_of))


def _fields(record: Any) -> list[Field[Any]]:
    """A record's fields that travel: those with a kind and the nested records."""
    return [f for f in fields(record) if FIELD_KIND in f.metadata or FIELD_RECORD in f.metadata]


@dataclass
class Training(Record):
    """The fine-tune's outcome, written by the train step."""

    device_s: float = kind(NUMBER)
    energy_j: float | None = kind(Maybe(NUMBER))
    peak_power_w: float | None = kind(Maybe(NUMBER))
    samples: int = kind(COUNT)
    accuracy: float = kind(NUMBER)
    reached_target: bool = kind(Flag())
    lr: float = kind(NUMBER, 0.0)
    stop_reason: str = kind(TEXT, "")
    steps: int = kind(COUNT, 0)
    resumed_at_samples: int | None = kind(Maybe(COUNT), None)
    """Resumed from a checkpoint at this many samples; equal to `samples`: answered without training."""

    @classmethod
    def of(cls, result: Any, *, stand_in: bool = False) -> Training:
        """A `FineTuneResult`'s outcome; a stand-in (not trained) ran no steps."""
        r, steps = result, 0 if stand_in else result.steps
        measured = (r.device_s, r.energy_j, r.peak_power_w, r.samples, r.final_accuracy, r.reached)
        return cls(*measured, r.lr, r.stop_reason, steps, r.extra.get("resumed_at_samples"))


@dataclass
class Profiling(Record):
    """How the round's profile was made and what it cost, written by the profile step."""

    profiling_s: float = kind(NUMBER)
    """Device seconds charged this round (ours only, for a profile it measured)."""
    profile_cached: bool = kind(Flag(), False)
    profile_points: int = kind(COUNT, 0)  # pairs in the profile the choice was made from
    profiling_choice: str = kind(TEXT, "")
    """The order measured, `predicted` (confirmed by the training's first steps) or `model` (scale
    mode); with `profile_cached`, how the cached profile was made."""
    # a budgeted client: the predicted profile it weighed its ways with, its training predicted before
    # profiling, the share of it profiling could spend, and each way's predicted device seconds
    profiling_predicted_from: str = kind(TEXT, "")
    predicted_training_s: float | None = kind(Maybe(NUMBER), None)
    profiling_budget_s: float | None = kind(Maybe(NUMBER), None)
    profiling_costs_predicted: dict[str, float] | None = kind(  # noqa: RUF009
        Maybe(
            JsonItems(NUMBER, "a JSON object of device seconds by way", keys=(*PROFILE_ORDERS, "predicted"))
        ),
        None,
    )


CAP_EVENT, STEP_DOWN = field_kinds(CapEvent), field_kinds(StepDown)
"""What a cap follower's event and a power guard's step-down hold (`asdict`), as their fields declare."""


@dataclass
class CapFollowed(Record):
    """What the cap follower did under a changing cap; the defaults: a constant cap."""

    cap_source: str = kind(TEXT, "")  # a schedule, a trace, a live file
    cap_events: list[dict[str, Any]] = kind(JsonItems(CAP_EVENT), factory=list)  # noqa: RUF009
    """Every start, switch, hold, pause and resume; the report's pair is the first pick."""
    final_pair: list[int] | None = kind(  # noqa: RUF009  the pair in force when training ended
        Maybe(JsonItems(COUNT, "a JSON list [batch size, Hz]", length=2)), None
    )
    paused_s: float = kind(NUMBER, 0.0)
    """Device seconds paused because no pair fitted under the cap (not in `device_s`)."""
    over_cap_s: float | None = kind(Maybe(NUMBER), None)
    """Device seconds over the cap in force × (1 + guard tolerance), steps in progress at drops included."""

    @classmethod
    def of(cls, follower: Any) -> CapFollowed:
        events, pair = [asdict(e) for e in follower.events], [follower.batch_size, follower.frequency_hz]
        return cls(follower.caps.describe(), events, pair, follower.paused_s, follower.over_cap_s)

    def unprevented_over_cap_s(self) -> float:
        """Time over the cap beyond the steps in progress at its changes."""
        return float(sum(e.get("over_cap_s", 0.0) for e in self.cap_events))


@dataclass
class ClientReport(Record):
    """What a client reports after a round (docs/reference/files.md); None = not measured / no cap."""

    device: str = kind(Text())
    power_cap_w: float | None = kind(Maybe(NUMBER))
    batch_size: int = kind(Integer(1))
    frequency_hz: int = kind(COUNT)
    training: Training = nested(Training, required=True)  # noqa: RUF009
    profiling: Profiling = nested(Profiling, required=True)  # noqa: RUF009
    cap: CapFollowed = nested(CapFollowed)  # noqa: RUF009
    step_downs: list[dict[str, float]] = kind(JsonItems(STEP_DOWN), factory=list)  # noqa: RUF009
    """The power guard's actions; `frequency_hz` stays the selected one."""
    board: str = kind(TEXT, "")
    node_key: str = kind(TEXT, "")
    predicted_s: float = kind(NUMBER, 0.0)
    profiled_peak_power_w: float = kind(NUMBER, 0.0)
    train_examples: int = kind(COUNT, 0)
    wall_s: float = kind(NUMBER, 0.0)
    startup_s: float | None = kind(Maybe(NUMBER), None)
    method: str = kind(Choice(METHODS), OURS)
    deadline_s: float | None = kind(Maybe(NUMBER), None)
    """Energy-under-deadline rounds: the deadline the client chose for (None: none)."""
    meets_deadline_predicted: bool | None = kind(Maybe(Flag()), None)  # else it ran its fastest pair
    pinned: bool = kind(Flag(), True)
    restored: str = kind(TEXT, "")
    beside: dict[str, BesideReport] = field(default_factory=dict, repr=False, compare=False)
    """The records read beside this report (`BESIDE_REPORT`), by key."""

    def columns(self) -> dict[str, Any]:
        """The report's and its records' fields, and each registered beside record's (its defaults where
        a client sent none: every row has one shape)."""
        values = super().columns()
        for key, record in BESIDE_REPORT.items():
            values.update((self.beside.get(key) or record()).columns())
        return values


@dataclass
class BesideReport(Record):
    """A record a client's own app sends beside its report under its own `KEY`, which a server that
    registered it (`register_beside_report`) reads with the report; each field has a default."""

    KEY: ClassVar[str] = ""


B = TypeVar("B", bound=BesideReport)

BESIDE_REPORT: dict[str, type[BesideReport]] = {}
"""The records read beside a client's report, by key (an unregistered one stays in the reply)."""


def register_beside_report(record: type[B]) -> type[B]:
    """Read `record` beside every report from now on (its key and fields must be its own)."""
    taken = sorted(set(record.names()) & set(ClientReport.names()))
    if not record.KEY or taken or record.KEY in (REPORT_KEY, CONFIG_KEY, METRICS_KEY, ARRAYS_KEY):
        raise TypeError(f"{record.__name__}: a KEY of its own and fields of its own (not {taken})")
    BESIDE_REPORT[record.KEY] = record
    return record


def take_report(content: Any) -> ClientReport | None:
    """A train reply's report (None: it has none) with its beside records, all taken out of the reply (the
    inner strategy then sees the reply it expects); ProtocolError when any is malformed."""
    records = content.config_records
    if REPORT_KEY not in records:
        return None
    report = ClientReport.from_config(records[REPORT_KEY])
    for key, record in BESIDE_REPORT.items():
        if key in records:
            report.beside[key] = record.from_config(records[key], f"train reply {key}")
            del content.config_records[key]
    del content.config_records[REPORT_KEY]
    return report


@dataclass(frozen=True)
class Plan(Record):
    """A client's answer to a planning query: its fastest pair under its cap, what it predicts, and the
    device seconds the profile cost if it was measured for the query."""

    fastest_s: float = kind(NUMBER)
    batch_size: int = kind(Integer(1))
    frequency_hz: int = kind(Integer(1))
    energy_j: float = kind(NUMBER)
    profiling_s: float = kind(NUMBER, 0.0)

    @classmethod
    def of(cls, fastest: Pick, profiling_s: float = 0.0) -> Plan:
        """The plan that reports `fastest`, a ranked pick (it carries both predictions)."""
        assert fastest.predicted_s is not None and fastest.predicted_energy_j is not None
        b, hz = fastest.batch_size, fastest.frequency_hz
        return cls(fastest.predicted_s, b, hz, fastest.predicted_energy_j, profiling_s)
