"""What travels between the power-aware strategy and its clients: message keys and their checks.

The strategy writes `TrainInstructions` into each TRAIN message's ConfigRecord; the ClientApp reads it
back with `TrainInstructions.from_config`, which names the key and the value of anything missing or
wrong. The client's reply carries a `ClientReport` (a ConfigRecord, so strings and absent values
survive) next to the weights and a MetricRecord with the examples FedAvg weighs by. A client's own app
may send a record of its own beside the report (`BesideReport`: the fleet runner's,
`simulations.bench_report`), which a server that registered it puts in the report's results row.
Both sides import this one module, so a key can never be spelled two ways; the instructions' keys are
kebab-case, the run settings among them spelled as their run config keys (`strategies.settings`).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, ClassVar, TypeVar

from flwr.app import ConfigRecord

from powerctl.errors import ArgumentError, FileFormatError, PowerctlError
from powerctl.files.jsonfile import FrozenJson, frozen_json, plain_json
from powerctl.files.mapping import (
    MAX_ROUNDS,
    Choice,
    Flag,
    Integer,
    Invalid,
    JsonObject,
    Kind,
    MappingReader,
    Number,
    Text,
    is_integer,
    is_number,
    must_be,
)
from powerctl.records.pick import Pick
from powerctl.records.relation import RelationVector
from powerctl.selection.capsource import POWER_CAP, POWER_CAP_VALUE
from powerctl.selection.methods import METHODS, ROUND_OBJECTIVES, RUN_METHODS
from powerctl.selection.names import ORACLE, OURS, OURS_DEADLINE, PROXY_BATCH, STATE_OF_PRACTICE
from powerfed.training.lr import scaled_lr
from strategies.settings import (
    BOTH,
    PROFILE_ORDERS,
    PROFILE_SOURCES,
    SentSettings,
    setting_fields,
    settings_of,
    to_config,
)

__all__ = [  # the method names both sides use (the registry's, powerctl.selection.methods), the profile names
    "METHODS",
    "ORACLE",
    "OURS",
    "OURS_DEADLINE",
    "PROFILE_ORDERS",
    "PROFILE_SOURCES",
    "PROXY_BATCH",
    "ROUND_OBJECTIVES",
    "RUN_METHODS",
    "STATE_OF_PRACTICE",
]

ARRAYS_KEY = "arrays"
CONFIG_KEY = "config"
METRICS_KEY = "metrics"
REPORT_KEY = "report"
NODE_KEY = "node"
EXAMPLES_KEY = "num-examples"
"""The MetricRecord key the weights are averaged by (FedAvg's default `weighted_by_key`)."""
PLAN_KEY = "plan"
"""The ConfigRecord a client replies to a planning query: its predicted fastest time to target."""


class ProtocolError(PowerctlError):
    """A message lacks a key or holds a value that cannot be used; the text names both."""


def required(records: Any, key: str, where: str, what: str = "") -> Any:
    """`records[key]` (a RecordDict's array/config/metric records), or one ProtocolError naming the key."""
    if key not in records:
        raise ProtocolError(f"{where}: missing key {key!r}{f' ({what})' if what else ''}")
    return records[key]


def reader(record: Any, where: str) -> MappingReader:
    """The one mapping reader (`powerctl.files.mapping`) over a message's record: ProtocolError lines."""
    return MappingReader(record, where, ProtocolError)


EVALUATION_METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "accuracy": ("accuracy", "acc", "eval_acc", "eval_accuracy"),
    "loss": ("loss", "eval_loss"),
}
"""The names an evaluate reply's metrics may give its accuracy and loss under: the project's own and the
ones Flower's examples and templates send (`eval_acc`, `eval_loss`). The first one present counts."""


def evaluation_metrics(metrics: MappingReader) -> dict[str, float | None]:
    """An evaluate reply's accuracy and loss under any of their usual names (None where it has neither);
    a value that is not a number ≥ 0 is one ProtocolError naming its key."""
    found: dict[str, float | None] = {}
    for metric, names in EVALUATION_METRIC_NAMES.items():
        name = next((n for n in names if n in metrics), None)
        found[metric] = None if name is None else metrics.number(name)
    return found


RELATION_KEY = "relation-vector"
"""The relation vector, as its file holds it (`RelationVector.to_dict`, JSON): every field it has
travels, the per-seed ones included."""
MESSAGE_KINDS = {
    "num-classes": Integer(1),
    "model-overrides": JsonObject(),
    "server-round": Integer(1, MAX_ROUNDS),
    "node-key": Text(empty=True),
    "method": Choice(METHODS),
    "stand-in": Flag(),
    "deadline-s": Number(0.0, unit="seconds"),
}
"""The instructions' keys that are not run settings: what the server adds for the model, the round
and the node (the relation vector and the node's cap besides)."""
MESSAGE_SETTING_KINDS = {"model": Text()}
"""Settings read from a message by another kind than the run config's: a model is any non-empty name
(a user's own model included); whether it names a model is checked where the model is built, from the
registry (`powerfed.training.models`), on the server and on the client alike."""


@dataclass(frozen=True, kw_only=True)
class TrainInstructions(SentSettings):
    """Everything a client needs for one round besides the weights: the method's inputs and the budget.

    Its fields are the run settings the server sends (`strategies.settings.SentSettings`: model, target
    accuracy, learning rate, budget, profiling, guard, ...), then these."""

    num_classes: int
    model_overrides: Mapping[str, Any]
    """The model's options, held read-only (a `FrozenJson`): a plan cannot change behind its back."""
    relation_vector: RelationVector
    """Samples to the target per batch size on the proxy data, as the server estimated (or loaded) it."""
    server_round: int = 1
    node_key: str = ""
    """Which node this message was built for (partition or node name), echoed in the report."""
    power_cap_w: float | None = None
    """A cap the server sets for this node this round; None: the node's own (node config) cap."""
    method: str = OURS
    """How the client chooses (b, f) this round: one of METHODS (`powerctl.selection.methods`)."""
    stand_in: bool = False
    """Scale mode: this client runs the cheap stand-in (no training; the board model charges the proxy's
    samples to target at the chosen pair) instead of fine-tuning the real model."""
    deadline_s: float = 0.0
    """Energy-under-deadline rounds (ours only): pick the least-energy pair predicted to reach the
    target within this many seconds under the cap, else the fastest pair (0: no deadline, the fastest)."""

    @classmethod
    def for_run(
        cls, settings: Any, *, num_classes: int, model_overrides: dict[str, Any], relation: RelationVector
    ) -> TrainInstructions:
        """The run's instructions: every setting the server sends (from its checked `RunSettings`), the
        model's classes and options, and the relation vector."""
        sent = {s.attr: getattr(settings, s.attr) for s in settings_of([BOTH])}
        return cls(**sent, num_classes=num_classes, model_overrides=model_overrides, relation_vector=relation)

    @classmethod
    def for_relation(
        cls,
        relation: RelationVector,
        *,
        num_classes: int,
        model_overrides: dict[str, Any] | None = None,
        **settings: Any,
    ) -> TrainInstructions:
        """A user's plan from a relation vector: its model and target are the vector's, and so is its
        learning-rate rule (`lr_max`, `lr_rule`, where the vector records them: an estimate's do) unless
        given; every other run setting (`strategies.settings`, as attributes: budget_samples, ...) its
        default unless given."""
        if not isinstance(relation, RelationVector):
            raise ArgumentError(
                "TrainInstructions.for_relation: 'relation' must be a RelationVector (estimate_relation "
                f"returns one), got {type(relation).__name__}"
            )
        for key in ("model", "target_accuracy"):
            if key in settings:
                raise ArgumentError(
                    f"TrainInstructions.for_relation: {key!r} is the relation vector's "
                    f"({getattr(relation, key, None)!r}); estimate a vector for another one"
                )
        for key in ("lr_max", "lr_rule"):  # the rule the relation was measured with is the one to train by
            if key not in settings and key in relation.extra:
                settings[key] = relation.extra[key]
        return cls(
            model=relation.model,
            target_accuracy=relation.target_accuracy,
            num_classes=num_classes,
            model_overrides=dict(model_overrides or {})
            if isinstance(model_overrides, (dict, type(None)))
            else model_overrides,
            relation_vector=relation,
            **settings,
        )

    def __post_init__(self) -> None:
        """Checked as a client reads it (`from_config`), so that a plan every client would refuse is
        refused where it is made: one ArgumentError line (a ValueError) naming the field."""
        check_instructions(self)

    def relation(self) -> RelationVector:
        return self.relation_vector

    def lr_for(self, batch_size: int) -> float:
        return scaled_lr(
            self.lr_max,
            batch_size,
            max(self.relation_vector.batch_sizes),
            self.lr_rule,
        )

    def overrides_text(self) -> str:
        """The model's options as the message and the profile cache key hold them: JSON, keys sorted."""
        return json.dumps(plain_json(self.model_overrides), sort_keys=True)

    def to_config(self) -> ConfigRecord:
        d = to_config(setting_fields(self))
        d.update(
            {
                "num-classes": self.num_classes,
                "model-overrides": self.overrides_text(),
                RELATION_KEY: json.dumps(self.relation_vector.to_dict(), sort_keys=True),
                "server-round": self.server_round,
                "node-key": self.node_key,
                "method": self.method,
                "stand-in": self.stand_in,
                "deadline-s": self.deadline_s,
            }
        )
        if self.power_cap_w is not None:
            d["power-cap-w"] = self.power_cap_w
        return ConfigRecord(d)

    @classmethod
    def from_config(cls, record: Any, where: str = "train message config") -> TrainInstructions:
        r = reader(record, where)
        settings = {
            s.attr: r.value(s.key, MESSAGE_SETTING_KINDS.get(s.key, s.kind)) for s in settings_of([BOTH])
        }
        message = {key.replace("-", "_"): r.value(key, kind) for key, kind in MESSAGE_KINDS.items()}
        try:
            relation = RelationVector.from_dict(r.json_object(RELATION_KEY), f"{where}: {RELATION_KEY!r}")
        except FileFormatError as exc:
            raise ProtocolError(str(exc)) from None
        if relation.model != settings["model"]:
            raise r.fail(
                RELATION_KEY, f"is for model {relation.model!r}, the instructions for {settings['model']!r}"
            )
        return cls(
            **settings,
            **message,
            relation_vector=relation,
            power_cap_w=r.value("power-cap-w", POWER_CAP, None),
        )


INT32_MAX = 2**31 - 1


def check_instructions(instr: TrainInstructions) -> None:
    """Each field of `instr` as it travels (`to_config`), read back by the kind its reader uses; the
    relation vector checks itself (`RelationVector`) and must be of the instructions' model. A number
    or a name of a few is kept as its kind gives it back (a plain int or float where numpy's was given:
    a ConfigRecord refuses numpy's; a name stripped, as the client reads it)."""
    r = MappingReader({}, "TrainInstructions", ArgumentError)
    kinds = {s.attr: MESSAGE_SETTING_KINDS.get(s.key, s.kind) for s in settings_of([BOTH])}
    kinds.update({key.replace("-", "_"): kind for key, kind in MESSAGE_KINDS.items()})
    del kinds["model_overrides"]  # travels as JSON text (`to_config`), checked below
    if instr.power_cap_w is not None:  # a number of watts in Python, never the text "none" a file may hold
        kinds["power_cap_w"] = POWER_CAP_VALUE
    for attr, kind in kinds.items():
        value = getattr(instr, attr)
        try:
            sent = kind.to_config(value)
        except (TypeError, ValueError, AttributeError):
            raise r.fail(attr, f"must be {kind.expected}, got {value!r}") from None
        checked = r.check(attr, sent, kind)
        if kind.python_type in (int, float) or isinstance(kind, Choice):
            # frozen: set once, as __post_init__ may; a name as the client reads it ("ours " is ours)
            object.__setattr__(instr, attr, checked)
    if not isinstance(instr.relation_vector, RelationVector):
        raise r.fail(
            "relation_vector", f"must be a RelationVector, got {type(instr.relation_vector).__name__}"
        )
    if instr.relation_vector.model != instr.model:
        raise r.fail(
            "relation_vector",
            f"is for model {instr.relation_vector.model!r}, the instructions for {instr.model!r} "
            "(TrainInstructions.for_relation takes the vector's)",
        )
    overrides = instr.model_overrides
    try:
        if not isinstance(overrides, Mapping) or not all(isinstance(k, str) for k in overrides):
            raise TypeError
        text = json.dumps(overrides, sort_keys=True, allow_nan=False, default=_thawed)
    except (TypeError, ValueError):
        raise r.fail("model_overrides", f"must be a dict of JSON option values, got {overrides!r}") from None
    object.__setattr__(instr, "model_overrides", frozen_json(json.loads(text)))  # read-only, as sent
    if instr.num_classes > INT32_MAX:  # a message's integers are int64; no board trains that many classes
        raise r.fail("num_classes", f"must be an integer in [1, {INT32_MAX}], got {instr.num_classes!r}")
    from powerfed.training.models import get_model_spec, model_names

    spec = get_model_spec(instr.model) if instr.model in model_names() else None
    if spec is not None and (why := _model_refusal(instr.model, id(spec), instr.num_classes, text)):
        raise ArgumentError(f"TrainInstructions: {why}")  # what every client's build_model would say


@functools.lru_cache(maxsize=256)
def _thawed(value: Any) -> dict[str, Any]:
    """A read-only option mapping (`FrozenJson`, from another plan's options) as JSON writes it; any
    other value JSON cannot hold is a TypeError, as `json.dumps` raises."""
    if isinstance(value, FrozenJson):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _model_refusal(model: str, spec_id: int, num_classes: int, overrides: str) -> str | None:
    """Why the model registered here cannot be built with these classes and options (an unknown option,
    more parameters than a board trains), as `build_model` on the clients would refuse it; None: it can.
    A model not registered on this side is not checked (a client may register it). Cached, keyed by the
    registry entry (`spec_id`): a plan is replaced for every node of every round."""
    from powerfed.training.errors import ModelError
    from powerfed.training.models import check_size

    try:
        check_size(model, num_classes, json.loads(overrides))
    except ModelError as exc:
        return str(exc)
    return None


def _json(value: Any, expected: str, python_type: type) -> Any:
    """A report field that carries JSON (a ConfigRecord holds no nested records)."""
    try:
        items = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        items = None
    if not isinstance(items, python_type):
        raise must_be(expected, value)
    return items


def _number_at_least_0(v: Any) -> bool:
    return is_number(v) and v >= 0


CAP_EVENT_KINDS = ("start", "switch", "hold", "pause", "resume")
CAP_EVENT_NUMBERS = (
    "t_s",
    "old_batch_size",
    "old_frequency_hz",
    "new_batch_size",
    "new_frequency_hz",
    "fraction_done",
    "in_step_over_cap_s",
    "over_cap_s",
)


def _cap_events(value: Any) -> list[dict[str, Any]]:
    """A changing cap's events: a JSON list of {t_s, kind, power_cap_w, old/new (b, f), ...}."""
    items = _json(value, "a JSON list", list)
    for item in items:
        if not isinstance(item, dict) or item.get("kind") not in CAP_EVENT_KINDS:
            raise Invalid(f"entries need a kind in {', '.join(CAP_EVENT_KINDS)}, got {item!r}")
        for key in CAP_EVENT_NUMBERS:
            if not _number_at_least_0(item.get(key)):
                raise Invalid(f"{key} must be a finite number ≥ 0, got {item.get(key)!r}")
        for key in ("power_cap_w", "predicted_remaining_s"):
            if item.get(key) is not None and not _number_at_least_0(item[key]):
                raise Invalid(f"{key} must be a number ≥ 0 or null, got {item[key]!r}")
    return items


STEP_DOWN_KEYS = ("device_seconds", "old_hz", "new_hz", "measured_w", "power_cap_w")


def _step_downs(value: Any) -> list[dict[str, float]]:
    """The power guard's step-downs: a JSON list of {device_seconds, old_hz, new_hz, measured_w, ...}."""
    items = _json(value, "a JSON list", list)
    for item in items:
        if not isinstance(item, dict) or set(item) != set(STEP_DOWN_KEYS):
            raise Invalid(f"entries must have the keys {', '.join(STEP_DOWN_KEYS)}, got {item!r}")
        for key, v in item.items():
            if not _number_at_least_0(v):
                raise Invalid(f"{key} must be a finite number ≥ 0, got {v!r}")
        if not item["new_hz"] < item["old_hz"]:
            raise Invalid(f"a step-down must lower the frequency, got {item!r}")
    return items


def _seconds_by_way(value: Any) -> dict[str, float]:
    """A budgeted client's predicted costs: a JSON object way → device seconds ≥ 0."""
    items = _json(value, "a JSON object", dict)
    for way, v in items.items():
        if way not in (*PROFILE_ORDERS, "predicted") or not _number_at_least_0(v):
            raise Invalid(f"must map ways of profiling to seconds ≥ 0, got {way!r}: {v!r}")
    return items


def _pair(value: Any) -> list[int]:
    items = _json(value, "a JSON list [batch size, Hz]", list)
    if len(items) != 2 or not all(is_integer(v) and v >= 0 for v in items):
        raise must_be("a JSON list [batch size, Hz]", value)
    return items


def _as_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


@dataclass(frozen=True)
class _Json(Kind):
    """A field that travels as JSON text, checked by `parse`."""

    parse: Callable[[Any], Any]
    expected: str = "JSON"

    def __call__(self, value: Any) -> Any:
        return self.parse(value)

    def to_config(self, value: Any) -> Any:
        return _as_json(value)


def _kind(kind: Kind, *, required: bool = False, after: str = "") -> dict[str, Any]:
    """A report field's metadata: how it is checked when read back, whether a reply must carry it; a
    field of a record beside the report, the report field it follows in a results row
    (`ClientReport.row`)."""
    return {"kind": kind, "required": required, "after": after}


def _travelling(record: Any) -> list[Any]:
    """The fields of a report record that travel in its ConfigRecord (not a companion record)."""
    return [f for f in fields(record) if f.metadata.get("kind") is not None]


def _record_to_config(record: Any) -> ConfigRecord:
    """A report record as its ConfigRecord: each field under its kebab-case key; None left out."""
    return ConfigRecord(
        {
            _key(f): f.metadata["kind"].to_config(getattr(record, f.name))
            for f in _travelling(record)
            if getattr(record, f.name) is not None
        }
    )


def _record_values(cls: type, record: Any, where: str) -> dict[str, Any]:
    """A report record's fields read back from its ConfigRecord, each checked by its kind."""
    r = reader(record, where)
    values = {}
    for f in _travelling(cls):
        key, kind = _key(f), f.metadata["kind"]
        if key in r:
            values[f.name] = r.value(key, kind)
        elif f.metadata["required"] and f.name not in OPTIONAL_REQUIRED:
            r.get(key)  # one "missing key" line
    return values


NUMBER = Number(0.0)
COUNT = Integer(0)
TEXT = Text(empty=True)


@dataclass
class ClientReport:
    """What a client reports after a round (docs/reference/files.md); None = not measured / no cap.

    Each field says how it is checked when it comes back (`metadata["kind"]`); in the message its key is
    the field's name in kebab-case, like every key of the protocol; absent values (None) are left out."""

    device: str = field(metadata=_kind(Text(), required=True))
    power_cap_w: float | None = field(metadata=_kind(NUMBER, required=True))
    batch_size: int = field(metadata=_kind(Integer(1), required=True))
    frequency_hz: int = field(metadata=_kind(COUNT, required=True))
    device_seconds: float = field(metadata=_kind(NUMBER, required=True))
    energy_j: float | None = field(metadata=_kind(NUMBER, required=True))
    peak_power_w: float | None = field(metadata=_kind(NUMBER, required=True))
    samples: int = field(metadata=_kind(COUNT, required=True))
    accuracy: float = field(metadata=_kind(NUMBER, required=True))
    reached_target: bool = field(metadata=_kind(Flag(), required=True))
    profiling_seconds: float = field(metadata=_kind(NUMBER, required=True))
    board: str = field(default="", metadata=_kind(TEXT))
    node_key: str = field(default="", metadata=_kind(TEXT))
    predicted_seconds: float = field(default=0.0, metadata=_kind(NUMBER))
    profiled_peak_power_w: float = field(default=0.0, metadata=_kind(NUMBER))
    """The selected point's peak power in the profile: what the method checks against the cap (the
    measured `peak_power_w` of a long run can exceed it by sensor noise or a board that drifts)."""
    profile_cached: bool = field(default=False, metadata=_kind(Flag()))
    profile_points: int = field(default=0, metadata=_kind(COUNT))
    """Pairs in the profile the choice was made from."""
    lr: float = field(default=0.0, metadata=_kind(NUMBER))
    stop_reason: str = field(default="", metadata=_kind(TEXT))
    steps: int = field(default=0, metadata=_kind(COUNT))
    train_examples: int = field(default=0, metadata=_kind(COUNT))
    wall_seconds: float = field(default=0.0, metadata=_kind(NUMBER))
    startup_s: float | None = field(default=None, metadata=_kind(NUMBER))
    """Wall seconds from the start of the process that ran this round to its first profiling or training
    step (interpreter, imports, the message read, the data loaded): what a deployed SuperNode's
    `flwr-clientapp`, started for this one message, cost before the work began. None where one process
    serves many messages (simulation's Ray actors, a test)."""
    method: str = field(default=OURS, metadata=_kind(Choice(METHODS)))
    resumed_at_samples: int | None = field(default=None, metadata=_kind(COUNT))
    """The fine-tune continued from a checkpoint taken at this many samples (a round sent again);
    equal to `samples`: the round had finished, and its end state answered without training."""
    deadline_s: float | None = field(default=None, metadata=_kind(NUMBER))
    """Energy-under-deadline rounds: the round's deadline the client chose for (None: no deadline)."""
    meets_deadline_predicted: bool | None = field(default=None, metadata=_kind(Flag()))
    """... and whether its pair is predicted to meet it (else it ran its fastest pair)."""
    step_downs: list[dict[str, float]] = field(
        default_factory=list, metadata=_kind(_Json(_step_downs, "a JSON list"))
    )
    """The power guard's actions while training (powerctl.selection.guard.StepDown): time (training device
    seconds), old and new frequency in Hz, the measured W that caused it, the cap. `frequency_hz` stays
    the selected one; the last step-down's `new_hz` is where training ended."""
    cap_source: str = field(default="", metadata=_kind(TEXT))
    """A cap that changes: what the client followed (a schedule, a trace, a live file)."""
    cap_events: list[dict[str, Any]] = field(
        default_factory=list, metadata=_kind(_Json(_cap_events, "a JSON list"))
    )
    """Under a cap that changes (powerctl.selection.follow.CapEvent): every start, switch, hold, pause and
    resume
    with its time, the cap, the old and new (b, f) and the seconds measured over the cap after it.
    `batch_size`/`frequency_hz` are then the first pick."""
    final_pair: list[int] | None = field(default=None, metadata=_kind(_Json(_pair, "[batch size, Hz]")))
    """A cap that changes: the pair in force when training ended."""
    paused_seconds: float = field(default=0.0, metadata=_kind(NUMBER))
    """Device seconds paused because no pair fitted under the cap (not in `device_seconds`)."""
    over_cap_seconds: float | None = field(default=None, metadata=_kind(NUMBER))
    """Device seconds the measured power exceeded the cap in force × (1 + guard tolerance), steps in
    progress at cap drops included (measured only under a changing cap; per event in `cap_events`)."""
    pinned: bool = field(default=True, metadata=_kind(Flag()))
    """False: the GPU frequency was not pinned (no permission, or the node config's pin = false): the
    client profiled and trained at the clock in force and chose the batch size alone; `frequency_hz`
    is that clock as read (the governor's), not one the client set."""
    restored: str = field(default="", metadata=_kind(TEXT))
    """When the board was found left pinned by a killed process and put back before this round: the
    line that says what was restored (empty: nothing was)."""
    profiling_choice: str = field(default="", metadata=_kind(TEXT))
    """How the profile was made: the order measured (efficient, grid, fitted), `predicted` (a predicted
    profile's choice, confirmed by the training's first steps), `model` (scale mode: the board model's,
    unmeasured); with `profile_cached`, the way a cached profile was made."""
    profiling_predicted_from: str = field(default="", metadata=_kind(TEXT))
    """The predicted profile a budgeted client weighed its ways with (the simulated board's model, or a
    profile of the same kind of board measured earlier); empty: none."""
    predicted_training_seconds: float | None = field(default=None, metadata=_kind(NUMBER))
    """A budgeted client: its training predicted before profiling (samples to the target × one measured
    step's seconds per sample); None: not budgeted this round."""
    profiling_budget_seconds: float | None = field(default=None, metadata=_kind(NUMBER))
    """... the share of it profiling could spend (`profiling-budget` × the prediction)."""
    profiling_costs_predicted: dict[str, float] | None = field(
        default=None, metadata=_kind(_Json(_seconds_by_way, "a JSON object"))
    )
    """... and each way's predicted device seconds (efficient, grid, fitted, predicted), which it chose
    by; `profiling_seconds` is what the chosen way cost."""
    beside: dict[str, BesideReport] = field(
        default_factory=dict, repr=False, compare=False, metadata={"kind": None}
    )
    """The records read beside this report (`BESIDE_REPORT`), by key: not report fields, each travels
    under its own key, and the results row holds their fields."""

    def unprevented_over_cap_s(self) -> float:
        """Under a changing cap: time over it beyond the steps in progress at its changes."""
        return float(sum(e.get("over_cap_s", 0.0) for e in self.cap_events))

    def to_config(self) -> ConfigRecord:
        return _record_to_config(self)

    def to_dict(self) -> dict[str, Any]:
        """The report's own fields (the records beside it apart: `row` holds them all)."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in _travelling(self)}

    def row(self) -> dict[str, Any]:
        """The report as a results row (docs/reference/files.md): its fields, and the fields of each record
        this server reads beside it (`BESIDE_REPORT`) after the ones they name; a client that sent none
        gets that record's defaults, so that every row has one shape."""
        after: dict[str, dict[str, Any]] = {}
        for key, record in BESIDE_REPORT.items():
            values = (self.beside.get(key) or record()).to_dict()
            for f in _travelling(record):
                after.setdefault(f.metadata["after"], {})[f.name] = values[f.name]
        row: dict[str, Any] = {}
        for name, value in self.to_dict().items():
            row[name] = value
            row.update(after.get(name, {}))
        return row

    @classmethod
    def from_config(cls, record: Any, where: str = "train reply report") -> ClientReport:
        values = _record_values(cls, record, where)
        return cls(**{**dict.fromkeys(OPTIONAL_REQUIRED), **values})


@dataclass
class BesideReport:
    """A record a client's own app sends beside its report, under its own key (`KEY`), that a server
    which registered it (`register_beside_report`) puts in the report's results row. Each field has a
    default (a client that sent none) and `beside` metadata: its kind and the report field it follows
    in a row."""

    KEY: ClassVar[str] = ""

    def to_config(self) -> ConfigRecord:
        return _record_to_config(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_config(cls: type[B], record: Any, where: str = "") -> B:
        return cls(**_record_values(cls, record, where or f"train reply {cls.KEY}"))


B = TypeVar("B", bound=BesideReport)

BESIDE_REPORT: dict[str, type[BesideReport]] = {}
"""The records this process reads beside a client's report, by key (`register_beside_report`: the
server side of the app that sends them). None registered: the report alone, and a record beside it is
left in the reply."""


def beside(kind: Kind, *, after: str) -> dict[str, Any]:
    """A `BesideReport` field's metadata: checked by `kind` when read back, placed after the report field
    `after` in a results row."""
    return _kind(kind, after=after)


def register_beside_report(record: type[B]) -> type[B]:
    """Read `record` beside every report from now on; its key and the report fields it follows are
    checked here, once."""
    names = {f.name for f in fields(ClientReport)}
    unknown = [f.metadata["after"] for f in _travelling(record) if f.metadata["after"] not in names]
    if not record.KEY or unknown or record.KEY in (REPORT_KEY, CONFIG_KEY, METRICS_KEY, ARRAYS_KEY):
        raise TypeError(f"{record.__name__}: a KEY of its own and fields after report fields (not {unknown})")
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


OPTIONAL_REQUIRED = ("power_cap_w", "energy_j", "peak_power_w")
"""Fields every report has that may be None (no cap, no sensor): absent from the message then."""


def _key(f: Any) -> str:
    return f.name.replace("_", "-")


@dataclass(frozen=True)
class Plan:
    """A client's answer to a planning query (energy-under-deadline rounds): its fastest pair under its
    cap and what it predicts, and the device seconds the profile cost if it was measured for the query."""

    fastest_seconds: float
    batch_size: int
    frequency_hz: int
    energy_j: float
    profiling_seconds: float = 0.0

    @classmethod
    def of(cls, fastest: Pick, profiling_seconds: float = 0.0) -> Plan:
        """The plan that reports `fastest` (Algorithm 1's pick under the node's cap)."""
        # a ranked pick (`powerctl.selection.joint.rank`) carries both predictions
        assert fastest.predicted_seconds is not None and fastest.predicted_energy_j is not None
        return cls(
            fastest_seconds=float(fastest.predicted_seconds),
            batch_size=fastest.batch_size,
            frequency_hz=fastest.frequency_hz,
            energy_j=float(fastest.predicted_energy_j),
            profiling_seconds=profiling_seconds,
        )

    @property
    def pick(self) -> Pick:
        """The fastest pair the plan reports, as a pick."""
        return Pick(
            self.batch_size, self.frequency_hz, self.fastest_seconds, predicted_energy_j=self.energy_j
        )

    def to_config(self) -> ConfigRecord:
        return ConfigRecord({k.replace("_", "-"): v for k, v in asdict(self).items()})

    @classmethod
    def from_config(cls, record: Any, where: str = "plan reply") -> Plan:
        r = reader(record, where)
        return cls(
            fastest_seconds=r.number("fastest-seconds"),
            batch_size=r.integer("batch-size"),
            frequency_hz=r.integer("frequency-hz"),
            energy_j=r.number("energy-j"),
            profiling_seconds=r.number("profiling-seconds"),
        )
