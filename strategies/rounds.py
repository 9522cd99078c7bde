"""What one round produced: every client's report, who failed and why, and the round's summary."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from powerctl.errors import ANSI, PowerctlError
from strategies.report import ClientReport


@dataclass(frozen=True)
class NodeInfo:
    """A node as it described itself (node ids change every run; keys do not)."""

    node_id: int
    key: str
    device: str
    board: str = ""
    power_cap_w: float | None = None
    partition_id: int | None = None
    data: str = ""
    train_examples: int = 0
    test_examples: int = 0

    @classmethod
    def from_record(cls, node_id: int, record: Any) -> NodeInfo:
        """The node a query reply describes (its data as `with_data` reads it); `{}`: a node not met."""
        return cls(
            node_id=node_id,
            key=str(record.get("node-key") or f"node-{node_id}"),
            device=str(record.get("device", "?")),
            board=str(record.get("board", "")),
            power_cap_w=record.get("power-cap-w"),
            partition_id=record.get("partition-id"),
        ).with_data(record)

    def with_data(self, record: Any) -> NodeInfo:
        """This node with the data its evaluate reply names, if any (the query loads none)."""
        sizes = record.get("train-examples"), record.get("test-examples")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
            return self
        return replace(
            self, data=str(record.get("data", self.data)), train_examples=sizes[0], test_examples=sizes[1]
        )


@dataclass(frozen=True)
class Failure:
    """A node that was sent work this round and returned none."""

    node_id: int
    node_key: str
    device: str
    kind: str  # "error" (an error or unusable reply), "unavailable" (its SuperNode died) or "timeout"
    reason: str


@dataclass
class RoundRecord:
    """One round: the clients' reports, the failures, the summary, the evaluation."""

    round: int
    clients: list[dict[str, Any]]
    failed: list[Failure]
    summary: dict[str, Any]
    evaluation: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """Its fields, the evaluation left out when there was none."""
        return {k: v for k, v in asdict(self).items() if k != "evaluation" or v is not None}


REASON_LIMIT = 400
OWN_PACKAGES = ("powerctl.", "powerfed.", "strategies.", "fl_server.", "fl_client.", "simulations.")
# the line a traceback ends with; Flower's simulation's line with the ClientApp's own words; a deployed
# ClientApp's exception as the SuperNode replies it
_RAISED = re.compile(r"^(?P<cls>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): (?P<message>.+?)(?:'>)?$")
_CLIENTAPP_MESSAGE = re.compile(r"^Exception ClientAppException occurred\. Message: (?P<message>.+?)(?:'>)?$")
_WRAPPED = re.compile(r"^<class '(?P<cls>[\w.]+)'>:<'(?P<message>.+)'>$")
_NAMED = re.compile(r"^(?P<cls>[A-Za-z_][\w.]*): (?P<message>.+)$")


def _raised(cls: str, message: str) -> str:
    """The project's own error by its message alone (it says what to do); another's with its class."""
    return message if cls.startswith(OWN_PACKAGES) else f"{cls.rsplit('.', 1)[-1]}: {message}"


def _user_words(lines: list[str]) -> str | None:
    """The ClientApp's own words where Flower's wrapping says which they are, or None."""
    said = next((m["message"] for ln in reversed(lines) if (m := _CLIENTAPP_MESSAGE.match(ln))), None)
    if said is not None:
        named = (m for ln in lines if (m := _NAMED.match(ln)) and m["message"] == said)
        cls = next((m["cls"] for m in named if not m["cls"].endswith("ClientAppException")), None)
        return said if cls is None else _raised(cls, said)
    if len(lines) == 1 and (wrapped := _WRAPPED.match(lines[0])) is not None:
        return _raised(wrapped["cls"], wrapped["message"])
    return None


def one_line(reason: str | None) -> str:
    """A failure reason fit for a table row: of a multi-line text the exception it ends with, else the
    ClientApp's own words, else its first line and its last."""
    lines = [ln.strip() for ln in ANSI.sub("", reason or "").splitlines() if ln.strip()]
    if not lines:
        return "(no reason given)"
    raised = next((m for ln in reversed(lines) if (m := _RAISED.match(ln))), None) if len(lines) > 1 else None
    if raised is not None:
        text = _raised(raised["cls"], raised["message"])
    elif (words := _user_words(lines)) is not None:
        text = words
    else:
        text = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    return text if len(text) <= REASON_LIMIT else text[: REASON_LIMIT - 1] + "…"


STAND_IN = "stand-in"  # the stop reason of a round that did not train (scale mode)


def summarise(reports: list[ClientReport], failed: list[Failure], sampled: int) -> dict[str, Any]:
    """The round's summary: the makespan is the slowest client's device, profiling and paused seconds;
    a failed client counts as not at target."""

    def cost(r: ClientReport) -> float:
        return r.training.device_s + r.profiling.profiling_s + r.cap.paused_s

    slowest = max(reports, key=cost, default=None)
    energies = [r.training.energy_j for r in reports if r.training.energy_j is not None]
    over_cap = [
        {"node": r.node_key, "peak_power_w": peak, "power_cap_w": r.power_cap_w}
        for r in reports
        if not r.cap.cap_events
        and r.power_cap_w is not None
        and (peak := r.training.peak_power_w) is not None
        and peak > r.power_cap_w
    ]
    # under a changing cap: the follower's time over the caps in force, beyond the steps at the changes
    over_cap += [
        {"node": r.node_key, "over_cap_s": r.cap.unprevented_over_cap_s(), "power_cap_w": r.power_cap_w}
        for r in reports
        if r.cap.cap_events and r.cap.unprevented_over_cap_s() > 0
    ]
    examples = sum(r.train_examples for r in reports)
    return {
        "sampled": sampled,
        "reported": len(reports),
        "failed": [f"{f.node_key} ({f.kind}): {f.reason}" for f in failed],
        "makespan_s": cost(slowest) if slowest else 0.0,
        "slowest": slowest.node_key if slowest else None,
        "total_energy_j": float(sum(energies)),
        "energy_complete": len(energies) == len(reports),
        "share_at_target": sum(r.training.reached_target for r in reports) / sampled if sampled else 0.0,
        "over_cap": over_cap,
        "accuracy": (sum(r.training.accuracy * r.train_examples for r in reports) / examples)
        if examples
        else None,
        "profiling_s": float(sum(r.profiling.profiling_s for r in reports)),
        "stand_ins": sum(r.training.stop_reason == STAND_IN for r in reports),
    }


def weights_mismatch(arrays: ArrayRecord, like: ArrayRecord) -> str | None:
    """Why `arrays` cannot be averaged with the global weights `like`, or None when it can."""
    if set(arrays.keys()) != set(like.keys()):
        missing = sorted(set(like.keys()) - set(arrays.keys()))
        extra = sorted(set(arrays.keys()) - set(like.keys()))
        return f"weights do not match the global model (missing {missing[:3]}, unexpected {extra[:3]})"
    for key, ref in like.items():
        if (shape := tuple(arrays[key].shape)) != tuple(ref.shape):
            return (
                f"weights do not match the global model ({key!r} has shape {shape}, not {tuple(ref.shape)})"
            )
        if not np.all(np.isfinite(arrays[key].numpy())):
            return f"weights hold NaN or infinity ({key!r})"
    return None


def weighted_average(items: list[tuple[ArrayRecord, float]], like: ArrayRecord) -> ArrayRecord:
    """FedAvg: Σ w_i · x_i / Σ w_i per array in float64, cast back to its dtype (integers rounded), summed
    in the order given."""
    total = float(sum(w for _, w in items))
    out: dict[str, Array] = {}
    for key, ref in like.items():
        acc = sum(rec[key].numpy().astype(np.float64) * (w / total) for rec, w in items)
        dtype = ref.numpy().dtype
        if np.issubdtype(dtype, np.integer):
            acc = np.rint(acc)
        out[key] = Array(np.asarray(acc, dtype=dtype))
    return ArrayRecord(out)


def report_row(report: ClientReport, info: NodeInfo) -> dict[str, Any]:
    """A client's row in the results file: its report's columns and the node's partition."""
    return {**report.columns(), "node_key": report.node_key or info.key, "partition_id": info.partition_id}


class NoClientReported(PowerctlError):
    """Every client failed in every round: the run has no result (a failed run, not an empty one)."""


def no_client_reported(rounds: Iterable[RoundRecord], most: int = 3) -> NoClientReported | None:
    """The error for rounds in which no client ever reported, naming why the first ones failed (None:
    one did, or no round ran)."""
    records = list(rounds)
    if not records or any(r.clients for r in records):
        return None
    why = [f"{f.node_key} ({f.kind}) failed: {one_line(f.reason)}" for r in records for f in r.failed]
    distinct = list(dict.fromkeys(why))
    more = f"; and {len(distinct) - most} more" if len(distinct) > most else ""
    shown = "; ".join(distinct[:most]) + more
    return NoClientReported(
        f"every client failed in every round ({len(records)} round{'s' * (len(records) > 1)}): "
        + (shown or "no client was sent work")
    )
