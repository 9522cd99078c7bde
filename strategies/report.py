"""What a client reports after a round: the round's own fields and its producers' records.

Each record is written once, where it is made: the fine-tune's outcome (`Training`, the train step's),
the profile's (`Profiling`, the profile step's), the power guard's step-downs (`StepDown.to_dict`) and
the cap follower's summary (`CapFollowed`), nested in the `ClientReport`. Each field is declared once,
with its kind (`kind`), which checks it where the record is made (`check_fields`) and where a reply is
read back (the message's reader, ProtocolError lines). A ConfigRecord holds no nested records, so a report
travels as one ConfigRecord: every field of every record under its name in kebab-case (the names are
distinct across the records), None left out, a list or an object as JSON text. A client's own app may
send a record of its own beside the report (`BesideReport`: the fleet runner's,
`simulations.bench_report`), which a server that registered it reads with the report.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from flwr.app import ConfigRecord

from powerctl.files.mapping import (
    FIELD_KIND,
    Choice,
    Flag,
    Integer,
    Invalid,
    Kind,
    MappingReader,
    Maybe,
    Number,
    Text,
    check_fields,
    field_kinds,
    must_be,
    shown,
)
from powerctl.files.mapping import kind_field as kind
from powerctl.records.pick import Pick
from powerctl.selection.methods import METHODS
from powerctl.selection.names import OURS
from strategies.protocol import ARRAYS_KEY, CONFIG_KEY, METRICS_KEY, REPORT_KEY, reader
from strategies.settings import PROFILE_ORDERS

NUMBER, COUNT, TEXT = Number(0.0), Integer(0), Text(empty=True)


@dataclass(frozen=True)
class JsonItems(Kind):
    """Items that travel as JSON text (given as text, or as the list or object itself): a list of
    `item`s (`length` of them, when given), or with `keys`, an object of them by those keys. `item` is
    a kind, or a record's fields' kinds (each item an object with exactly those keys). Checked, not
    converted: the items are kept as sent."""

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


def _key(name: str) -> str:
    return name.replace("_", "-")


def nested(record: type[Record], *, required: bool = False) -> Any:
    """A field that holds another record (its defaults where it is not `required`)."""
    meta = {"record": record}
    return field(metadata=meta) if required else field(default_factory=record, metadata=meta)


R = TypeVar("R", bound="Record")


class Record:
    """A report record: each field declared with its kind (`kind`) or as a nested record (`nested`).
    A field without a default must be in a reply unless its kind takes None (`Maybe`)."""

    def __post_init__(self) -> None:
        check_fields(self, type(self).__name__, field_kinds(self))

    @classmethod
    def names(cls) -> list[str]:
        """Its fields' names, the nested records' included."""
        return [
            n
            for f in _fields(cls)
            for n in (f.metadata["record"].names() if "record" in f.metadata else [f.name])
        ]

    def config_values(self) -> dict[str, Any]:
        """Every field (the nested records' included) under its kebab-case key, None left out."""
        values: dict[str, Any] = {}
        for f in _fields(self):
            value = getattr(self, f.name)
            if "record" in f.metadata:
                values.update(value.config_values())
            elif value is not None:
                values[_key(f.name)] = f.metadata[FIELD_KIND].to_config(value)
        return values

    def to_config(self) -> ConfigRecord:
        return ConfigRecord(self.config_values())

    def columns(self) -> dict[str, Any]:
        """Every field (the nested records' included) by its name: what a results row holds."""
        values: dict[str, Any] = {}
        for f in _fields(self):
            value = getattr(self, f.name)
            values.update(value.columns() if "record" in f.metadata else {f.name: copy.deepcopy(value)})
        return values

    @classmethod
    def read(cls: type[R], r: MappingReader) -> R:
        """This record (and the records nested in it) read back from a reply, each field by its kind."""
        values: dict[str, Any] = {}
        for f in _fields(cls):
            if "record" in f.metadata:
                values[f.name] = f.metadata["record"].read(r)
            elif _key(f.name) in r:
                values[f.name] = r.value(_key(f.name), f.metadata[FIELD_KIND])
            elif f.default is MISSING and f.default_factory is MISSING:
                values[f.name] = None if isinstance(f.metadata[FIELD_KIND], Maybe) else r.get(_key(f.name))
        return cls(**values)

    @classmethod
    def from_config(cls: type[R], record: Any, where: str = "train reply report") -> R:
        return cls.read(reader(record, where))


def _fields(record: Any) -> list[Field[Any]]:
    """A record's fields that travel: those with a kind and the nested records."""
    return [f for f in fields(record) if FIELD_KIND in f.metadata or "record" in f.metadata]


@dataclass
class Training(Record):
    """The fine-tune's outcome (`FineTuneResult`), written by the train step (`Training.of`)."""

    device_seconds: float = kind(NUMBER)
    energy_j: float | None = kind(Maybe(NUMBER))
    peak_power_w: float | None = kind(Maybe(NUMBER))
    samples: int = kind(COUNT)
    accuracy: float = kind(NUMBER)
    reached_target: bool = kind(Flag())
    lr: float = kind(NUMBER, 0.0)
    stop_reason: str = kind(TEXT, "")
    steps: int = kind(COUNT, 0)
    resumed_at_samples: int | None = kind(Maybe(COUNT), None)
    """The fine-tune continued from a checkpoint taken at this many samples (a round sent again);
    equal to `samples`: the round had finished, and its end state answered without training."""

    @classmethod
    def of(cls, result: Any, *, stand_in: bool = False) -> Training:
        """A `FineTuneResult`'s outcome; a stand-in (not trained) ran no steps."""
        r, steps = result, 0 if stand_in else result.steps
        measured = (r.device_seconds, r.energy_j, r.peak_power_w, r.samples, r.final_accuracy, r.reached)
        return cls(*measured, r.lr, r.stop_reason, steps, r.extra.get("resumed_at_samples"))


@dataclass
class Profiling(Record):
    """How the round's profile was made and what it cost, written by the profile step's result
    (`fl_client.profile_step.Profiled.outcome`)."""

    profiling_seconds: float = kind(NUMBER)
    """Device seconds charged this round (only the power-aware method, for a profile it measured)."""
    profile_cached: bool = kind(Flag(), False)
    profile_points: int = kind(COUNT, 0)
    """Pairs in the profile the choice was made from."""
    profiling_choice: str = kind(TEXT, "")
    """The order measured (efficient, grid, fitted), `predicted` (a predicted profile's choice,
    confirmed by the training's first steps), `model` (scale mode: the board model's, unmeasured);
    with `profile_cached`, the way a cached profile was made."""
    profiling_predicted_from: str = kind(TEXT, "")
    """A budgeted client: the predicted profile it weighed its ways with; empty: none."""
    predicted_training_seconds: float | None = kind(Maybe(NUMBER), None)
    """... its training predicted before profiling (None: not budgeted this round)."""
    profiling_budget_seconds: float | None = kind(Maybe(NUMBER), None)
    """... the share of it profiling could spend (`profiling-budget` × the prediction)."""
    profiling_costs_predicted: dict[str, float] | None = kind(  # noqa: RUF009
        Maybe(
            JsonItems(NUMBER, "a JSON object of device seconds by way", keys=(*PROFILE_ORDERS, "predicted"))
        ),
        None,
    )
    """... and each way's predicted device seconds, which it chose by."""


CAP_EVENT = {
    **dict.fromkeys(("t_s", "fraction_done", "in_step_over_cap_s", "over_cap_s"), NUMBER),
    "kind": Choice(("start", "switch", "hold", "pause", "resume")),
    "power_cap_w": Maybe(NUMBER),
    **dict.fromkeys(("old_batch_size", "old_frequency_hz", "new_batch_size", "new_frequency_hz"), COUNT),
    "predicted_remaining_s": Maybe(NUMBER),
}
"""A cap follower's event (`powerctl.selection.follow.CapEvent.to_dict`)."""
STEP_DOWN = {
    "device_seconds": NUMBER,
    **dict.fromkeys(("old_hz", "new_hz"), COUNT),
    **dict.fromkeys(("measured_w", "power_cap_w"), NUMBER),
}
"""A power guard's step-down (`powerctl.selection.guard.StepDown.to_dict`)."""


@dataclass
class CapFollowed(Record):
    """Under a cap that changes, what the follower did (`CapFollower`), written by the train step
    (`fl_client.pinning.Pinning.trained`); the defaults: a constant cap, no follower."""

    cap_source: str = kind(TEXT, "")
    """What the client followed (a schedule, a trace, a live file)."""
    cap_events: list[dict[str, Any]] = kind(JsonItems(CAP_EVENT), factory=list)  # noqa: RUF009
    """Every start, switch, hold, pause and resume with its time, the cap, the old and new (b, f) and
    the seconds over the cap after it; the report's pair is then the first pick."""
    final_pair: list[int] | None = kind(  # noqa: RUF009
        Maybe(JsonItems(COUNT, "a JSON list [batch size, Hz]", length=2)), None
    )
    """The pair in force when training ended."""
    paused_seconds: float = kind(NUMBER, 0.0)
    """Device seconds paused because no pair fitted under the cap (not in `device_seconds`)."""
    over_cap_seconds: float | None = kind(Maybe(NUMBER), None)
    """Device seconds the measured power exceeded the cap in force × (1 + guard tolerance), steps in
    progress at cap drops included (per event in `cap_events`)."""

    @classmethod
    def of(cls, follower: Any) -> CapFollowed:
        """A `CapFollower`'s summary after the fine-tune."""
        events, pair = [e.to_dict() for e in follower.events], [follower.batch_size, follower.frequency_hz]
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
    """The power guard's actions while training: `frequency_hz` stays the selected one; the last
    step-down's `new_hz` is where training ended."""
    board: str = kind(TEXT, "")
    node_key: str = kind(TEXT, "")
    predicted_seconds: float = kind(NUMBER, 0.0)
    profiled_peak_power_w: float = kind(NUMBER, 0.0)
    """The selected point's peak power in the profile: what the method checks against the cap."""
    train_examples: int = kind(COUNT, 0)
    wall_seconds: float = kind(NUMBER, 0.0)
    startup_s: float | None = kind(Maybe(NUMBER), None)
    """Wall seconds from the start of the process that ran this round to its first profiling or training
    step: what a deployed SuperNode's `flwr-clientapp`, started for this one message, cost before the
    work began. None where one process serves many messages (simulation's Ray actors, a test)."""
    method: str = kind(Choice(METHODS), OURS)
    deadline_s: float | None = kind(Maybe(NUMBER), None)
    """Energy-under-deadline rounds: the round's deadline the client chose for (None: no deadline)."""
    meets_deadline_predicted: bool | None = kind(Maybe(Flag()), None)
    """... and whether its pair is predicted to meet it (else it ran its fastest pair)."""
    pinned: bool = kind(Flag(), True)
    """False: the GPU frequency was not pinned (no permission, or the node config's pin = false):
    `frequency_hz` is the clock in force as read, not one the client set."""
    restored: str = kind(TEXT, "")
    """The line that says what a killed process had left pinned and this round put back (empty: none)."""
    beside: dict[str, BesideReport] = field(default_factory=dict, repr=False, compare=False)
    """The records read beside this report (`BESIDE_REPORT`), by key: each travels under its own key."""

    def columns(self) -> dict[str, Any]:
        """The report's fields and its records', and the fields of each record this server reads beside
        it (`BESIDE_REPORT`): a client that sent none gets that record's defaults, so that every row has
        one shape. The results writer puts them in its order (`fl_server.results`)."""
        values = super().columns()
        for key, record in BESIDE_REPORT.items():
            values.update((self.beside.get(key) or record()).columns())
        return values


@dataclass
class BesideReport(Record):
    """A record a client's own app sends beside its report, under its own key (`KEY`), that a server
    which registered it (`register_beside_report`) reads with the report; each field has a default (a
    client that sent none)."""

    KEY: ClassVar[str] = ""

    @classmethod
    def from_config(cls: type[R], record: Any, where: str = "") -> R:
        return cls.read(reader(record, where or f"train reply {cls.KEY}"))  # type: ignore[attr-defined]


B = TypeVar("B", bound=BesideReport)

BESIDE_REPORT: dict[str, type[BesideReport]] = {}
"""The records this process reads beside a client's report, by key (`register_beside_report`: the
server side of the app that sends them). None registered: the report alone, and a record beside it is
left in the reply."""


def register_beside_report(record: type[B]) -> type[B]:
    """Read `record` beside every report from now on; its key, and that its fields are not the report's
    own, are checked here, once."""
    taken = sorted(set(record.names()) & set(ClientReport.names()))
    if not record.KEY or taken or record.KEY in (REPORT_KEY, CONFIG_KEY, METRICS_KEY, ARRAYS_KEY):
        raise TypeError(f"{record.__name__}: a KEY of its own and fields of its own (not {taken})")
    BESIDE_REPORT[record.KEY] = record
    return record


def take_report(content: Any) -> ClientReport | None:
    """A train reply's report (None: it has none), with the records registered to be read beside it
    (`BESIDE_REPORT`), all taken out of the reply's RecordDict (the inner strategy then sees the reply it
    expects); ProtocolError when any is malformed."""
    records = content.config_records
    if REPORT_KEY not in records:
        return None
    report = ClientReport.from_config(records[REPORT_KEY])
    for key, record in BESIDE_REPORT.items():
        if key in records:
            report.beside[key] = record.from_config(records[key])
            del content.config_records[key]
    del content.config_records[REPORT_KEY]
    return report


@dataclass(frozen=True)
class Plan(Record):
    """A client's answer to a planning query (energy-under-deadline rounds): its fastest pair under its
    cap and what it predicts, and the device seconds the profile cost if it was measured for the query."""

    fastest_seconds: float = kind(NUMBER)
    batch_size: int = kind(Integer(1))
    frequency_hz: int = kind(Integer(1))
    energy_j: float = kind(NUMBER)
    profiling_seconds: float = kind(NUMBER, 0.0)

    @classmethod
    def of(cls, fastest: Pick, profiling_seconds: float = 0.0) -> Plan:
        """The plan that reports `fastest` (Algorithm 1's pick under the node's cap)."""
        # a ranked pick (`powerctl.selection.joint.rank`) carries both predictions
        assert fastest.predicted_seconds is not None and fastest.predicted_energy_j is not None
        b, hz = fastest.batch_size, fastest.frequency_hz
        return cls(fastest.predicted_seconds, b, hz, fastest.predicted_energy_j, profiling_seconds)

    @property
    def pick(self) -> Pick:
        """The fastest pair the plan reports, as a pick."""
        return Pick(
            self.batch_size, self.frequency_hz, self.fastest_seconds, predicted_energy_j=self.energy_j
        )

    @classmethod
    def from_config(cls, record: Any, where: str = "plan reply") -> Plan:
        return cls.read(reader(record, where))
