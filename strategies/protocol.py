"""What travels between the power-aware strategy and its clients: message keys and their checks.

The strategy writes `TrainInstructions` into each TRAIN message's ConfigRecord; the ClientApp reads it
back with `TrainInstructions.from_config`, which names the key and the value of anything missing or
wrong. The client's reply carries a `ClientReport` (a ConfigRecord, so strings and absent values
survive) next to the weights and a MetricRecord with the examples FedAvg weighs by.
Both sides import this one module, so a key can never be spelled two ways; the instructions' keys are
kebab-case, the run settings among them spelled as their run config keys (`strategies.settings`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from flwr.app import ConfigRecord

from powerctl.capsource import POWER_CAP
from powerctl.errors import FileFormatError, PowerctlError
from powerctl.mapping import Choice, Flag, Integer, JsonObject, MappingReader, Number, Text
from powerctl.relation import RelationVector
from strategies.settings import (
    BOTH,
    METHODS,
    ORACLE,
    OURS,
    OURS_DEADLINE,
    PROFILE_ORDERS,
    PROFILE_SOURCES,
    PROXY_BATCH,
    ROUND_OBJECTIVES,
    RUN_METHODS,
    STATE_OF_PRACTICE,
    setting_fields,
    settings_of,
    to_config,
    with_settings,
)
from training.lr import scaled_lr

__all__ = [  # the method and profile names both sides use, declared with the settings
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
    """The one mapping reader (`powerctl.mapping`) over a message's record: ProtocolError lines."""
    return MappingReader(record, where, ProtocolError)


RELATION_KEY = "relation-vector"
"""The relation vector, as its file holds it (`RelationVector.to_dict`, JSON): every field it has
travels, the per-seed ones included."""
MESSAGE_KINDS = {
    "num-classes": Integer(1),
    "model-overrides": JsonObject(),
    "server-round": Integer(1),
    "node-key": Text(empty=True),
    "method": Choice(METHODS),
    "stand-in": Flag(),
    "deadline-s": Number(0.0, unit="seconds"),
}
"""The instructions' keys that are not run settings: what the server adds for the model, the round
and the node (the relation vector and the node's cap besides)."""


@with_settings(BOTH)
class TrainInstructions:
    """Everything a client needs for one round besides the weights: the method's inputs and the budget.

    Its fields are the run settings the server sends (`strategies.settings`, readers "both": model,
    target accuracy, learning rate, budget, profiling, guard, ...), plus these."""

    num_classes: int
    model_overrides: dict[str, Any]
    relation_vector: RelationVector
    """Samples to the target per batch size on the proxy data, as the server estimated (or loaded) it."""
    server_round: int = 1
    node_key: str = ""
    """Which node this message was built for (partition or node name), echoed in the report."""
    power_cap_w: float | None = None
    """A cap the server sets for this node this round; None: the node's own (node config) cap."""
    method: str = OURS
    """How the client chooses (b, f) this round: one of METHODS (powerctl.baselines for the baselines)."""
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

    def relation(self) -> RelationVector:
        return self.relation_vector

    def lr_for(self, batch_size: int) -> float:
        return scaled_lr(
            self.lr_max,
            batch_size,
            max(self.relation_vector.batch_sizes),
            self.lr_rule,
        )

    def to_config(self) -> ConfigRecord:
        d = to_config(setting_fields(self))
        d.update(
            {
                "num-classes": self.num_classes,
                "model-overrides": json.dumps(self.model_overrides, sort_keys=True),
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
        settings = {s.attr: r.value(s.key, s.kind) for s in settings_of([BOTH])}
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


def _json_list(r: MappingReader, key: str) -> list[Any]:
    """A report field that carries a JSON list (a ConfigRecord holds no nested records)."""
    text = r.string(key)
    try:
        items = json.loads(text)
    except ValueError:
        raise r.fail(key, f"must be a JSON list, got {text!r}") from None
    if not isinstance(items, list):
        raise r.fail(key, f"must be a JSON list, got {text!r}")
    return items


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


def _cap_events(r: MappingReader) -> list[dict[str, Any]]:
    """A changing cap's events: a JSON list of {t_s, kind, power_cap_w, old/new (b, f), ...}."""
    items = _json_list(r, "cap_events")
    for item in items:
        if not isinstance(item, dict) or item.get("kind") not in CAP_EVENT_KINDS:
            raise r.fail("cap_events", f"entries need a kind in {', '.join(CAP_EVENT_KINDS)}, got {item!r}")
        for key in CAP_EVENT_NUMBERS:
            v = item.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise r.fail("cap_events", f"{key} must be a finite number ≥ 0, got {v!r}")
        for key in ("power_cap_w", "predicted_remaining_s"):
            v = item.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0):
                raise r.fail("cap_events", f"{key} must be a number ≥ 0 or null, got {v!r}")
    return items


STEP_DOWN_KEYS = ("device_seconds", "old_hz", "new_hz", "measured_w", "power_cap_w")


def _step_downs(r: MappingReader) -> list[dict[str, float]]:
    """The power guard's step-downs: a JSON list of {device_seconds, old_hz, new_hz, measured_w, ...}."""
    items = _json_list(r, "step_downs")
    out = []
    for item in items:
        if not isinstance(item, dict) or set(item) != set(STEP_DOWN_KEYS):
            raise r.fail(
                "step_downs", f"entries must have the keys {', '.join(STEP_DOWN_KEYS)}, got {item!r}"
            )
        for key, v in item.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise r.fail("step_downs", f"{key} must be a finite number ≥ 0, got {v!r}")
        if not item["new_hz"] < item["old_hz"]:
            raise r.fail("step_downs", f"a step-down must lower the frequency, got {item!r}")
        out.append(item)
    return out


@dataclass
class ClientReport:
    """What a client reports after a round of training (DESIGN §2); None = not measured / no cap."""

    device: str
    power_cap_w: float | None
    batch_size: int
    frequency_hz: int
    device_seconds: float
    energy_j: float | None
    peak_power_w: float | None
    samples: int
    accuracy: float
    reached_target: bool
    profiling_seconds: float
    board: str = ""
    node_key: str = ""
    predicted_seconds: float = 0.0
    profiled_peak_power_w: float = 0.0
    """The selected point's peak power in the profile: what the method checks against the cap (the
    measured `peak_power_w` of a long run can exceed it by sensor noise or a board that drifts)."""
    profile_cached: bool = False
    lr: float = 0.0
    stop_reason: str = ""
    train_examples: int = 0
    wall_seconds: float = 0.0
    method: str = OURS
    stand_in: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    step_downs: list[dict[str, float]] = field(default_factory=list)
    """The power guard's actions while training (powerctl.guard.StepDown): time (training device
    seconds), old and new frequency in Hz, the measured W that caused it, the cap. `frequency_hz` stays
    the selected one; the last step-down's `new_hz` is where training ended."""
    cap_events: list[dict[str, Any]] = field(default_factory=list)
    """Under a cap that changes (powerctl.follow.CapEvent): every start, switch, hold, pause and resume
    with its time, the cap, the old and new (b, f) and the seconds measured over the cap after it.
    `batch_size`/`frequency_hz` are then the first pick."""
    paused_seconds: float = 0.0
    """Device seconds paused because no pair fitted under the cap (not in `device_seconds`)."""
    over_cap_seconds: float | None = None
    """Device seconds the measured power exceeded the cap in force × (1 + guard tolerance), steps in
    progress at cap drops included (measured only under a changing cap; per event in `cap_events`)."""
    restored: str = ""
    """When the board was found left pinned by a killed process and put back before this round: the
    line that says what was restored (empty: nothing was)."""

    def unprevented_over_cap_s(self) -> float:
        """Under a changing cap: time over it beyond the steps in progress at its changes."""
        return float(sum(e.get("over_cap_s", 0.0) for e in self.cap_events))

    def to_config(self) -> ConfigRecord:
        d = asdict(self)
        d["extra"] = json.dumps(self.extra, sort_keys=True)
        d["step_downs"] = json.dumps(self.step_downs)
        d["cap_events"] = json.dumps(self.cap_events)
        return ConfigRecord({k: v for k, v in d.items() if v is not None})

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_config(cls, record: Any, where: str = "train reply report") -> ClientReport:
        r = reader(record, where)

        def optional(key: str) -> float | None:
            return r.number(key) if key in record else None

        reached = r.get("reached_target")
        if not isinstance(reached, bool):
            raise r.fail("reached_target", f"must be true or false, got {reached!r}")
        extra = r.json_object("extra") if "extra" in record else {}
        return cls(
            device=r.string("device"),
            power_cap_w=optional("power_cap_w"),
            batch_size=r.integer("batch_size"),
            frequency_hz=r.integer("frequency_hz", minimum=0),
            device_seconds=r.number("device_seconds"),
            energy_j=optional("energy_j"),
            peak_power_w=optional("peak_power_w"),
            samples=r.integer("samples", minimum=0),
            accuracy=r.number("accuracy"),
            reached_target=reached,
            profiling_seconds=r.number("profiling_seconds"),
            board=str(record.get("board", "")),
            node_key=str(record.get("node_key", "")),
            predicted_seconds=optional("predicted_seconds") or 0.0,
            profiled_peak_power_w=optional("profiled_peak_power_w") or 0.0,
            profile_cached=record.get("profile_cached") is True,
            lr=optional("lr") or 0.0,
            stop_reason=str(record.get("stop_reason", "")),
            train_examples=r.integer("train_examples", minimum=0) if "train_examples" in record else 0,
            wall_seconds=optional("wall_seconds") or 0.0,
            method=r.choice("method", METHODS) if "method" in record else OURS,
            stand_in=record.get("stand_in") is True,
            extra=extra,
            step_downs=_step_downs(r) if "step_downs" in record else [],
            cap_events=_cap_events(r) if "cap_events" in record else [],
            paused_seconds=optional("paused_seconds") or 0.0,
            over_cap_seconds=optional("over_cap_seconds"),
            restored=str(record.get("restored", "")),
        )


@dataclass(frozen=True)
class Plan:
    """A client's answer to a planning query (energy-under-deadline rounds): its fastest pair under its
    cap and what it predicts, and the device seconds the profile cost if it was measured for the query."""

    fastest_seconds: float
    batch_size: int
    frequency_hz: int
    energy_j: float
    profiling_seconds: float = 0.0

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
