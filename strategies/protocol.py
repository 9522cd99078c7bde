"""What travels between the power-aware strategy and its clients: message keys and their checks.

The strategy writes `TrainInstructions` into each TRAIN message's ConfigRecord; the ClientApp reads it
back with `TrainInstructions.from_config`, which names the key and the value of anything missing or
wrong. The client's reply carries a `ClientReport` (a ConfigRecord, so strings and absent values
survive) next to the weights and a MetricRecord with the examples FedAvg weighs by.
Both sides import this one module, so a key can never be spelled two ways.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from flwr.app import ConfigRecord

from powerctl.baselines import ORACLE, PROXY_BATCH, STATE_OF_PRACTICE
from powerctl.errors import PowerctlError
from powerctl.follow import DEFAULT_PAUSE_TIMEOUT_S, DEFAULT_POLL_S
from powerctl.guard import DEFAULT_TOLERANCE, DEFAULT_WINDOW
from powerctl.relation import RelationVector
from training.lr import LR_RULES, scaled_lr

ARRAYS_KEY = "arrays"
CONFIG_KEY = "config"
METRICS_KEY = "metrics"
REPORT_KEY = "report"
NODE_KEY = "node"
EXAMPLES_KEY = "num-examples"
"""The MetricRecord key the weights are averaged by (FedAvg's default `weighted_by_key`)."""

PROFILE_ORDERS = ("efficient", "grid", "fitted")
"""How a client measures its profile (powerctl.profiler): efficient (stop each batch size at the cap),
grid (every pair), fitted (a few points, a fit, and measurements confirming the choice)."""
PROFILE_SOURCES = ("measured", "predicted")
"""measured: profile the device (cached); predicted: a simulated board's model profile (no device time)."""
OURS = "ours"
METHODS = (OURS, STATE_OF_PRACTICE, PROXY_BATCH, ORACLE)
"""How a client chooses (b, f): the power-aware method, or one of powerctl.baselines' baselines."""
OURS_DEADLINE = "ours-deadline"
RUN_METHODS = (*METHODS, OURS_DEADLINE)
"""What a run compares: the client methods, and `ours-deadline` = ours with energy-under-deadline
rounds (the server sets a deadline; each client picks its least-energy pair that meets it)."""
ROUND_OBJECTIVES = ("time", "energy-under-deadline")
"""time: every client its fastest pair (the paper); energy-under-deadline: see `OURS_DEADLINE`."""
PLAN_KEY = "plan"
"""The ConfigRecord a client replies to a planning query: its predicted fastest time to target."""


class ProtocolError(PowerctlError):
    """A message lacks a key or holds a value that cannot be used; the text names both."""


class _Reader:
    """Typed access to a ConfigRecord (or any mapping); every failure names the key and the value."""

    def __init__(self, record: Any, where: str) -> None:
        self.record, self.where = record, where

    def fail(self, key: str, why: str) -> ProtocolError:
        return ProtocolError(f"{self.where}: {key!r} {why}")

    def get(self, key: str) -> Any:
        if key not in self.record:
            raise ProtocolError(f"{self.where}: missing key {key!r}")
        return self.record[key]

    def string(self, key: str) -> str:
        v = self.get(key)
        if not isinstance(v, str) or not v:
            raise self.fail(key, f"must be a non-empty string, got {v!r}")
        return v

    def number(self, key: str, *, minimum: float = 0.0, allow_min: bool = True) -> float:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.fail(key, f"must be a finite number, got {v!r}")
        if v < minimum or (v == minimum and not allow_min):
            op = "≥" if allow_min else ">"
            raise self.fail(key, f"must be {op} {minimum:g}, got {v!r}")
        return float(v)

    def integer(self, key: str, *, minimum: int = 1) -> int:
        v = self.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self.fail(key, f"must be an integer ≥ {minimum}, got {v!r}")
        return int(v)

    def choice(self, key: str, allowed: tuple[str, ...]) -> str:
        v = self.string(key)
        if v not in allowed:
            raise self.fail(key, f"must be one of {', '.join(allowed)}, got {v!r}")
        return v

    def flag(self, key: str) -> bool:
        v = self.get(key)
        if not isinstance(v, bool):
            raise self.fail(key, f"must be true or false, got {v!r}")
        return v

    def int_list(self, key: str) -> list[int]:
        v = self.get(key)
        if not isinstance(v, list) or not v or any(isinstance(b, bool) or not isinstance(b, int) for b in v):
            raise self.fail(key, f"must be a non-empty list of integers, got {v!r}")
        return [int(b) for b in v]

    def float_list(self, key: str) -> list[float]:
        v = self.get(key)
        if not isinstance(v, list) or not v:
            raise self.fail(key, f"must be a non-empty list of numbers, got {v!r}")
        out = []
        for x in v:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0:
                raise self.fail(key, f"must hold positive finite numbers, got {x!r}")
            out.append(float(x))
        return out

    def json_object(self, key: str) -> dict[str, Any]:
        v = self.string(key)
        try:
            obj = json.loads(v)
        except ValueError:
            raise self.fail(key, f"must be a JSON object, got {v!r}") from None
        if not isinstance(obj, dict):
            raise self.fail(key, f"must be a JSON object, got {v!r}")
        return obj


def required(records: Any, key: str, where: str, what: str = "") -> Any:
    """`records[key]` (a RecordDict's array/config/metric records), or one ProtocolError naming the key."""
    if key not in records:
        raise ProtocolError(f"{where}: missing key {key!r}{f' ({what})' if what else ''}")
    return records[key]


def reader(record: Any, where: str) -> _Reader:
    """A checked view of `record` whose errors start with `where`."""
    return _Reader(record, where)


@dataclass(frozen=True)
class TrainInstructions:
    """Everything a client needs for one round besides the weights: the method's inputs and the budget."""

    model: str
    num_classes: int
    model_overrides: dict[str, Any]
    target_accuracy: float
    relation_batch_sizes: list[int]
    relation_samples: list[float]
    """Samples to the target per batch size on the proxy data (the relation is these over the last)."""
    lr_max: float
    lr_rule: str = "sqrt"
    """How the rate scales from the largest batch size: sqrt (Adam, the paper), linear, constant."""
    budget_samples: int = 0
    """Stop after this many training samples this round (0: no sample budget)."""
    budget_device_seconds: float = 0.0
    """Stop after this many device seconds of training this round (0: no time budget)."""
    eval_every_samples: int = 128
    eval_max_samples: int = 512
    profile_order: str = "efficient"
    profile_samples: int = 4000
    profile_warmup: int = 1
    profile_steps: int = 2
    seed: int = 0
    server_round: int = 1
    node_key: str = ""
    """Which node this message was built for (partition or node name), echoed in the report."""
    power_cap_w: float | None = None
    """A cap the server sets for this node this round; None: the node's own (node config) cap."""
    proxy_dataset: str = ""
    guard_window: int = DEFAULT_WINDOW
    """The power guard: consecutive over-cap training steps before a step-down (powerctl.guard)."""
    guard_tolerance: float = DEFAULT_TOLERANCE
    """The power guard: relative excess over the cap a reading may show (the sensor's noise band)."""
    method: str = OURS
    """How the client chooses (b, f) this round: one of METHODS (powerctl.baselines for the baselines)."""
    profile_source: str = "measured"
    stand_in: bool = False
    """Scale mode: this client runs the cheap stand-in (no training; the board model charges the proxy's
    samples to target at the chosen pair) instead of fine-tuning the real model."""
    checkpoint_every_samples: int = 0
    """The client saves its fine-tune this often, to resume it if killed mid-round (0: never)."""
    deadline_s: float = 0.0
    """Energy-under-deadline rounds (ours only): pick the least-energy pair predicted to reach the
    target within this many seconds under the cap, else the fastest pair (0: no deadline, the fastest)."""
    cap_poll_s: float = DEFAULT_POLL_S
    """A client paused because nothing fits under its (changing) cap reads the cap this often."""
    cap_pause_timeout_s: float = DEFAULT_PAUSE_TIMEOUT_S
    """... and gives up (one error line, frequency restored) after this long paused."""

    def relation(self) -> RelationVector:
        return RelationVector.from_samples(
            self.model,
            self.proxy_dataset or "proxy",
            self.target_accuracy,
            dict(zip(self.relation_batch_sizes, self.relation_samples, strict=True)),
        )

    def lr_for(self, batch_size: int) -> float:
        return scaled_lr(self.lr_max, batch_size, max(self.relation_batch_sizes), self.lr_rule)

    def to_config(self) -> ConfigRecord:
        d = asdict(self)
        d["model_overrides"] = json.dumps(self.model_overrides, sort_keys=True)
        if self.power_cap_w is None:
            del d["power_cap_w"]
        return ConfigRecord({k.replace("_", "-"): v for k, v in d.items()})

    @classmethod
    def from_config(cls, record: Any, where: str = "train message config") -> TrainInstructions:
        r = reader(record, where)
        bs = r.int_list("relation-batch-sizes")
        samples = r.float_list("relation-samples")
        if len(bs) != len(samples):
            raise r.fail("relation-samples", f"has {len(samples)} entries for {len(bs)} batch sizes")
        if sorted(set(bs)) != bs or bs[0] < 1:
            raise r.fail("relation-batch-sizes", f"must be distinct positive integers, ascending; got {bs}")
        target = r.number("target-accuracy", allow_min=False)
        if target > 1:
            raise r.fail("target-accuracy", f"must be in (0, 1], got {target}")
        cap = None
        if "power-cap-w" in record:
            cap = r.number("power-cap-w", allow_min=False)
        return cls(
            model=r.string("model"),
            num_classes=r.integer("num-classes"),
            model_overrides=r.json_object("model-overrides"),
            target_accuracy=target,
            relation_batch_sizes=bs,
            relation_samples=samples,
            lr_max=r.number("lr-max", allow_min=False),
            lr_rule=r.choice("lr-rule", LR_RULES),
            budget_samples=r.integer("budget-samples", minimum=0),
            budget_device_seconds=r.number("budget-device-seconds"),
            eval_every_samples=r.integer("eval-every-samples"),
            eval_max_samples=r.integer("eval-max-samples"),
            profile_order=r.choice("profile-order", PROFILE_ORDERS),
            profile_samples=r.integer("profile-samples"),
            profile_warmup=r.integer("profile-warmup", minimum=0),
            profile_steps=r.integer("profile-steps"),
            seed=r.integer("seed", minimum=0),
            server_round=r.integer("server-round"),
            node_key=str(record.get("node-key", "")),
            power_cap_w=cap,
            proxy_dataset=str(record.get("proxy-dataset", "")),
            guard_window=r.integer("guard-window") if "guard-window" in record else DEFAULT_WINDOW,
            guard_tolerance=_tolerance(r) if "guard-tolerance" in record else DEFAULT_TOLERANCE,
            method=r.choice("method", METHODS) if "method" in record else OURS,
            profile_source=r.choice("profile-source", PROFILE_SOURCES)
            if "profile-source" in record
            else "measured",
            stand_in=r.flag("stand-in") if "stand-in" in record else False,
            checkpoint_every_samples=(
                r.integer("checkpoint-every-samples", minimum=0)
                if "checkpoint-every-samples" in record
                else 0
            ),
            deadline_s=r.number("deadline-s") if "deadline-s" in record else 0.0,
            cap_poll_s=r.number("cap-poll-s", allow_min=False) if "cap-poll-s" in record else DEFAULT_POLL_S,
            cap_pause_timeout_s=(
                r.number("cap-pause-timeout-s", allow_min=False)
                if "cap-pause-timeout-s" in record
                else DEFAULT_PAUSE_TIMEOUT_S
            ),
        )


def _tolerance(r: _Reader) -> float:
    v = r.number("guard-tolerance")
    if v >= 1:
        raise r.fail("guard-tolerance", f"must be in [0, 1), got {v!r}")
    return v


def _json_list(r: _Reader, key: str) -> list[Any]:
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


def _cap_events(r: _Reader) -> list[dict[str, Any]]:
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


def _step_downs(r: _Reader) -> list[dict[str, float]]:
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
    """What a client reports after a round (docs/reference/files.md); None = not measured / no cap."""

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
