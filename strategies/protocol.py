"""What travels between the power-aware strategy and its clients: the message keys and the
`TrainInstructions` a TRAIN message's ConfigRecord carries. Both sides import this one module, so a key is
never spelled two ways."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flwr.app import ConfigRecord

from powerctl.errors import ArgumentError, FileFormatError, PowerctlError
from powerctl.files.jsonfile import FrozenJson, frozen_json, plain_json
from powerctl.files.mapping import (
    MAX_ROUNDS,
    Choice,
    Flag,
    Integer,
    JsonObject,
    Kind,
    MappingReader,
    Number,
    Text,
)
from powerctl.records.relation import RelationVector
from powerctl.selection.capsource import POWER_CAP, POWER_CAP_VALUE
from powerctl.selection.methods import METHODS, RUN_METHODS
from powerctl.selection.names import ORACLE, OURS, OURS_DEADLINE, STATE_OF_PRACTICE
from powerfed.training.lr import scaled_lr
from strategies.settings import BOTH, SentSettings, settings_of, to_config

__all__ = ["METHODS", "ORACLE", "OURS", "OURS_DEADLINE", "RUN_METHODS", "STATE_OF_PRACTICE"]  # re-exported

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
    """A message lacks a key or holds an unusable value; the text names both."""


def required(records: Any, key: str, where: str, what: str = "") -> Any:
    """`records[key]` (a RecordDict's array/config/metric records), or one ProtocolError naming the key."""
    if key not in records:
        raise ProtocolError(f"{where}: missing key {key!r}{f' ({what})' if what else ''}")
    return records[key]


def reader(record: Any, where: str) -> MappingReader:
    """The mapping reader over a message's record: ProtocolError lines."""
    return MappingReader(record, where, ProtocolError)


EVALUATION_METRIC_NAMES: dict[str, tuple[str, ...]] = {
    "accuracy": ("accuracy", "acc", "eval_acc", "eval_accuracy"),
    "loss": ("loss", "eval_loss"),
}
"""The names an evaluate reply may give its accuracy and loss under (the project's and Flower's
templates'); the first one present counts."""


def evaluation_metrics(metrics: MappingReader) -> dict[str, float | None]:
    """An evaluate reply's accuracy and loss under any of their names (None where it has neither); a
    value that is not a number ≥ 0 is one ProtocolError."""
    found: dict[str, float | None] = {}
    for metric, names in EVALUATION_METRIC_NAMES.items():
        name = next((n for n in names if n in metrics), None)
        found[metric] = None if name is None else metrics.number(name)
    return found


RELATION_KEY = "relation-vector"
"""The relation vector, as JSON of its file (`RelationVector.to_dict`), the per-seed fields included."""
INT32_MAX = 2**31 - 1  # a message's integers are int64; no board trains more classes
MESSAGE_KINDS = {
    "num-classes": Integer(1, INT32_MAX),
    "model-overrides": JsonObject(),
    "server-round": Integer(1, MAX_ROUNDS),
    "node-key": Text(empty=True),
    "method": Choice(METHODS),
    "stand-in": Flag(),
    "deadline-s": Number(0.0, unit="seconds"),
}
"""The instructions' keys that are not run settings (the relation vector and the cap besides)."""


def _fields_kinds() -> dict[str, Kind]:
    """{attribute: kind} of the instructions' fields a message holds under their keys, in message order.
    A model is any name (a user's own too): whether it is registered is checked where it is built."""
    sent = {s.key: Text() if s.key == "model" else s.kind for s in settings_of([BOTH])}
    return {key.replace("-", "_"): kind for key, kind in {**sent, **MESSAGE_KINDS}.items()}


@dataclass(frozen=True, kw_only=True)
class TrainInstructions(SentSettings):
    """Everything a client needs for one round besides the weights: the method's inputs and the budget.

    Its fields are the run settings the server sends (`SentSettings`), then these."""

    num_classes: int
    model_overrides: Mapping[str, Any]
    """The model's options, held read-only (a `FrozenJson`)."""
    relation_vector: RelationVector
    """Samples to the target per batch size on the proxy data."""
    server_round: int = 1
    node_key: str = ""
    """The node this message was built for, echoed in the report."""
    power_cap_w: float | None = None
    """A cap the server sets for this node this round; None: the node's own (node config) cap."""
    method: str = OURS
    """How the client chooses (b, f) this round: one of METHODS."""
    stand_in: bool = False
    """Scale mode: this client runs the stand-in (the board model charges the proxy's samples to target
    at the chosen pair) instead of fine-tuning."""
    deadline_s: float = 0.0
    """Energy-under-deadline rounds (ours only): the least-energy pair predicted to reach the target in
    this many seconds, else the fastest (0: no deadline)."""

    @classmethod
    def for_run(
        cls, settings: Any, *, num_classes: int, model_overrides: dict[str, Any], relation: RelationVector
    ) -> TrainInstructions:
        """The run's instructions from its checked `RunSettings`, the model's classes and options, and
        the relation vector."""
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
        learning-rate rule where the vector records it, unless given; every other setting (as an
        attribute) its default unless given."""
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
            model_overrides={} if model_overrides is None else model_overrides,
            relation_vector=relation,
            **settings,
        )

    def __post_init__(self) -> None:
        """Checked as a client reads it: a plan every client would refuse is refused where it is made."""
        check_instructions(self)

    def lr_for(self, batch_size: int) -> float:
        return scaled_lr(self.lr_max, batch_size, max(self.relation_vector.batch_sizes), self.lr_rule)

    def overrides_text(self) -> str:
        """The model's options as the message and the profile cache key hold them."""
        return json.dumps(plain_json(self.model_overrides), sort_keys=True)

    def to_config(self) -> ConfigRecord:
        d = to_config(self)
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
        values = {attr: r.value(attr.replace("_", "-"), kind) for attr, kind in _fields_kinds().items()}
        try:
            raw = r.value(RELATION_KEY, JsonObject())
            relation = RelationVector.from_dict(raw, f"{where}: {RELATION_KEY!r}")
        except FileFormatError as exc:
            raise ProtocolError(str(exc)) from None
        if relation.model != values["model"]:
            raise r.fail(
                RELATION_KEY, f"is for model {relation.model!r}, the instructions for {values['model']!r}"
            )
        return cls(**values, relation_vector=relation, power_cap_w=r.value("power-cap-w", POWER_CAP, None))


def check_instructions(instr: TrainInstructions) -> None:
    """Each field of `instr` as it travels, read back by its reader's kind (one ArgumentError line); a
    number or a choice is kept as its kind gives it back (a plain number where numpy's was given, a name
    stripped, as the client reads it). The relation vector must be of the instructions' model."""
    r = MappingReader({}, "TrainInstructions", ArgumentError)
    kinds = _fields_kinds()
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
    from powerfed.training.errors import ModelError
    from powerfed.training.models import check_size, model_names

    if instr.model in model_names():  # one a client registers itself is checked there
        try:
            check_size(instr.model, instr.num_classes, json.loads(text))
        except ModelError as exc:  # what every client's build_model would say
            raise ArgumentError(f"TrainInstructions: {exc}") from None


def _thawed(value: Any) -> dict[str, Any]:
    """A read-only option mapping (`FrozenJson`) as JSON writes it; any other value is a TypeError."""
    if isinstance(value, FrozenJson):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not a JSON value")
