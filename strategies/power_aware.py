"""Power-aware rounds around any Flower strategy, in the shape of Flower's own wrappers: the inner strategy
samples, builds the messages and aggregates; the wrapper adds each node's `TrainInstructions`, takes each
report out of its reply, and hands on the usable replies in node-key order. A failed client never stops
the round."""

from __future__ import annotations

import dataclasses
import math
import numbers
import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from flwr.supercore import log

from powerctl.errors import ArgumentError
from powerctl.files.mapping import Integer, MappingReader, check_arguments, check_callable, check_result
from powerctl.selection.methods import run_method_named
from strategies.objectives import OBJECTIVE, NodeWaits, RoundObjective
from strategies.protocol import (
    ARRAYS_KEY,
    CONFIG_KEY,
    EXAMPLES_KEY,
    METRICS_KEY,
    NODE_KEY,
    PLAN_KEY,
    RELATION_KEY,
    ProtocolError,
    TrainInstructions,
    evaluation_metrics,
    reader,
    required,
)
from strategies.report import ClientReport, Plan, take_report
from strategies.rounds import (
    Failure,
    NodeInfo,
    RoundRecord,
    no_client_reported,
    one_line,
    report_row,
    summarise,
    weights_mismatch,
)
from strategies.settings import key_of

NODE_UNAVAILABLE = 5  # Flower's ErrorCode.NODE_UNAVAILABLE: the SuperNode went away
# (node, server round, the round's instructions) → this node's instructions (e.g. its own cap)
NodeInstructions = Callable[[NodeInfo, int, TrainInstructions], TrainInstructions]


def same_for_every_node(node: NodeInfo, server_round: int, base: TrainInstructions) -> TrainInstructions:
    """The default: the round's instructions, addressed to the node."""
    return dataclasses.replace(base, server_round=server_round, node_key=node.key)


def trains_real_model(partition_id: int | None, real_share: float) -> bool:
    """Partition i trains the real model when ⌊(i+1)·s⌋ > ⌊i·s⌋: a share s spread evenly over the ids
    (s = 0.25: partitions 3, 7, 11, ...). A node without a partition id (deployment) always trains."""
    if real_share >= 1.0 or partition_id is None:
        return True
    return math.floor((partition_id + 1) * real_share + 1e-9) > math.floor(partition_id * real_share + 1e-9)


def for_method(method: str, real_share: float = 1.0) -> NodeInstructions:
    """Node instructions: `method`'s client method on every node, the real model on `real_share` of them."""
    client_method = run_method_named(method).client_method

    def instruct(node: NodeInfo, server_round: int, base: TrainInstructions) -> TrainInstructions:
        stand_in = not trains_real_model(node.partition_id, real_share)
        return dataclasses.replace(
            base, server_round=server_round, node_key=node.key, method=client_method, stand_in=stand_in
        )

    return instruct


def _inner_attr(strategy: Strategy | None, name: str, default: Any) -> Any:
    """An attribute of `strategy` or of a strategy it wraps (as `.strategy`, as Flower's wrappers do)."""
    while strategy is not None:
        if hasattr(strategy, name):
            return getattr(strategy, name)
        strategy = getattr(strategy, "strategy", None)
    return default


def _one(records: Any, key: str, where: str, what: str) -> Any:
    """`records[key]`, else the reply's only record of that type (a user's client may name it otherwise)."""
    if key not in records and len(records) == 1:
        return next(iter(records.values()))
    return required(records, key, where, what)


def _by_node(sent: list[Message], replies: Iterable[Message]) -> list[tuple[int, Message]]:
    """Each reply with the node it answers, by message id (the SuperLink sends a dead SuperNode's error)."""
    by_id = {m.metadata.message_id: m.metadata.dst_node_id for m in sent}
    return [(by_id.get(r.metadata.reply_to_message_id, r.metadata.src_node_id), r) for r in replies]


class PowerAware(Strategy):
    """Wraps any Flower strategy: its clients each choose (batch size, GPU frequency) under their own
    power cap from the plan the train config carries, and report what it cost.

    `instructions` is the run's plan (a run may change it between rounds), from which `node_instructions`
    makes each node's; with `first_round` > 1 the rounds before it are done. `on_round` hears the
    `RoundRecord` after training and after evaluation, `on_round_end(round, weights)` once the round is over.
    """

    def __init__(
        self,
        strategy: Strategy,
        instructions: TrainInstructions,
        *,
        node_instructions: NodeInstructions = same_for_every_node,
        on_round: Callable[[RoundRecord], None] | None = None,
        on_round_end: Callable[[int, ArrayRecord], None] | None = None,
        round_objective: RoundObjective | str = "time",
        waits: NodeWaits = NodeWaits(),
        first_round: int = 1,
    ) -> None:
        checked = check_arguments(  # kept as checked: plain numbers where numpy's were given
            "PowerAware",
            round_objective=(round_objective, OBJECTIVE),
            first_round=(first_round, Integer(1)),
        )
        if not isinstance(waits, NodeWaits):  # a NodeWaits checks itself
            raise ArgumentError(f"PowerAware: 'waits' must be a NodeWaits, got {type(waits).__name__}")
        if not isinstance(strategy, Strategy):
            raise ArgumentError(f"PowerAware wraps a Flower Strategy, got {type(strategy).__name__}")
        if not isinstance(instructions, TrainInstructions):  # a TrainInstructions checks itself
            raise ArgumentError(
                f"PowerAware: 'instructions' must be a TrainInstructions (TrainInstructions.for_relation "
                f"makes one), got {type(instructions).__name__}"
            )
        args = "(node, server_round, instructions)"  # checked now, else a TypeError mid-round
        check_callable("PowerAware", "node_instructions", node_instructions, args, 3)
        check_callable("PowerAware", "on_round", on_round, "(record)", 1, optional=True)
        check_callable("PowerAware", "on_round_end", on_round_end, "(server_round, arrays)", 2, optional=True)
        self.strategy, self.instructions, self.node_instructions = strategy, instructions, node_instructions
        self.on_round, self.on_round_end, self.waits = on_round, on_round_end, waits
        self.round_objective: RoundObjective = checked["round_objective"]
        self.first_round = checked["first_round"]
        self.nodes: dict[int, NodeInfo] = {}
        self.rounds: dict[int, RoundRecord] = {}
        self.plans: dict[int, Plan] = {}
        self.deadlines: dict[int, float] = {}
        self._sent: dict[str, list[Message]] = {}
        self._global: ArrayRecord | None = None
        self._eval_arrays: ArrayRecord | None = None
        self._gathered, self._most_seen = False, 0
        self._unbilled_profiling: dict[int, float] = {}

    def __repr__(self) -> str:
        return f"PowerAware({self.strategy!r})"

    def summary(self) -> None:
        """Log the wrapper's settings, then the inner strategy's."""
        log(INFO, "\t├──> Power-aware settings:")
        log(INFO, "\t│\t├── Model: %s", self.instructions.model)
        log(INFO, "\t│\t├── Target accuracy: %s", self.instructions.target_accuracy)
        log(INFO, "\t│\t├── Round objective: %r", self.round_objective)
        log(INFO, "\t│\t└── Relation vector: %s", self.instructions.relation_vector.as_map())
        self.strategy.summary()

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Flower's `Strategy.start`; a resumed run evaluates `initial_arrays` as round `first_round - 1`'s.
        Every client failing in every round raises `NoClientReported`, one line naming why."""
        if evaluate_fn is not None and self.first_round > 1:
            evaluate_all, done = evaluate_fn, self.first_round - 1

            def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord | None:
                return evaluate_all(server_round, arrays) if server_round >= done else None

        result = super().start(
            grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn
        )
        if (failed := no_client_reported(self.rounds.values())) is not None:
            raise failed  # a run with no result is a failed run, not an exit 0 with the starting model
        return result

    def connected(self, grid: Grid) -> list[int]:
        """The nodes to sample from, after waiting for `waits.min_available_nodes` once, then up to
        `waits.rejoin_wait_s` for the most nodes seen so far."""
        if not self._gathered:
            sample_nodes(grid, self.waits.min_available_nodes, 0)  # Flower's wait for the fleet, no sample
            self._gathered = True
        deadline = time.monotonic() + self.waits.rejoin_wait_s
        while len(nodes := sorted(grid.get_node_ids())) < self._most_seen and time.monotonic() < deadline:
            time.sleep(min(1.0, self.waits.rejoin_wait_s))
        self._most_seen = len(nodes)  # whoever did not come back in time is gone: wait for them once
        return nodes

    def _query(self, grid: Grid, contents: dict[int, RecordDict]) -> list[tuple[int, Message]]:
        """Send each node its QUERY; every reply with its node."""
        queries = [
            Message(content, dst_node_id=nid, message_type=MessageType.QUERY)
            for nid, content in contents.items()
        ]
        return _by_node(
            queries, grid.send_and_receive(queries, timeout=self.waits.query_timeout_s) if queries else []
        )

    def learn_nodes(self, grid: Grid, node_ids: Iterable[int]) -> None:
        """Ask every node not met yet for its device, board and cap."""
        new = [nid for nid in node_ids if nid not in self.nodes]
        self.nodes.update({nid: NodeInfo.from_record(nid, {}) for nid in new})  # until it describes itself
        for nid, reply in self._query(grid, {nid: RecordDict({}) for nid in new}):
            if reply.has_error() or NODE_KEY not in reply.content.config_records:
                why = one_line(reply.error.reason) if reply.has_error() else "no node record"
                log(WARNING, "query: node %s did not describe itself: %s", nid, why)
                continue
            try:
                self.nodes[nid] = NodeInfo.from_record(nid, reply.content.config_records[NODE_KEY])
            except (TypeError, ValueError) as exc:  # a malformed description must not stop the run
                log(WARNING, "query: node %s described itself unreadably: %s", nid, exc)

    def plan(self, grid: Grid, instructions: dict[int, TrainInstructions]) -> list[Plan]:
        """The plans of the round's sampled nodes, each not planned yet asked with its instructions; a node
        that fails to answer is logged and left out."""
        new = {
            nid: RecordDict({CONFIG_KEY: instr.to_config()})
            for nid, instr in instructions.items()
            if nid not in self.plans
        }
        for nid, reply in self._query(grid, new):
            try:
                if reply.has_error():
                    raise ProtocolError(one_line(reply.error.reason))
                plan = Plan.from_config(
                    required(reply.content.config_records, PLAN_KEY, "plan reply"), "plan reply"
                )
            except ProtocolError as exc:
                log(WARNING, "plan: node %s gave no plan: %s", self.node(nid).key, exc)
                continue
            self.plans[nid] = plan
            self._unbilled_profiling[nid] = plan.profiling_s
        return [self.plans[nid] for nid in instructions if nid in self.plans]

    def node(self, node_id: int) -> NodeInfo:
        return self.nodes.get(node_id) or NodeInfo.from_record(node_id, {})

    def _failure(self, node_id: int, kind: str, reason: str) -> Failure:
        info = self.node(node_id)
        return Failure(node_id, info.key, info.device, kind, reason)

    def instructions_for(self, node_id: int, server_round: int) -> TrainInstructions:
        """This node's instructions for the round (`node_instructions`), checked."""
        given = self.node_instructions(self.node(node_id), server_round, self.instructions)
        expected = "a TrainInstructions (e.g. dataclasses.replace(instructions, ...))"
        call = "node_instructions(node, server_round, instructions)"
        return check_result("PowerAware", call, given, TrainInstructions, expected)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The inner strategy's TRAIN messages, each with its own RecordDict holding its node's plan."""
        if not self._configure(MessageType.TRAIN, server_round, grid):
            return []
        plan = self.instructions.to_config()
        config = ConfigRecord({**dict(config), **dict(plan)})
        messages = list(self.strategy.configure_train(server_round, arrays, config, grid))
        node_ids = sorted(m.metadata.dst_node_id for m in messages)
        self.learn_nodes(grid, node_ids)
        log(INFO, "configure_train: %d nodes, power-aware", len(node_ids))
        instructions = {nid: self.instructions_for(nid, server_round) for nid in node_ids}
        deadline = check_result(
            "PowerAware",
            "round_objective.round_deadline(plans)",
            self.round_objective.round_deadline(lambda: self.plan(grid, instructions)),
            numbers.Real,
            "a number of seconds (0: no deadline)",
        )
        if deadline > 0:
            self.deadlines[server_round] = deadline
            instructions = {n: dataclasses.replace(i, deadline_s=deadline) for n, i in instructions.items()}
        config_key = _inner_attr(self.strategy, "configrecord_key", CONFIG_KEY)
        own = []
        for msg in messages:
            node_config = instructions[msg.metadata.dst_node_id].to_config()
            records: dict[str, Any] = dict(msg.content.items())
            key = next((k for k, r in msg.content.config_records.items() if RELATION_KEY in r), None)
            if key is None:  # the inner strategy sent its own config: the plan goes in whole
                key, changed = config_key, dict(node_config)
            else:  # only what differs for this node: what the inner strategy set stays
                changed = {k: v for k, v in node_config.items() if plan.get(k) != v}
            records[key] = ConfigRecord({**dict(records.get(key) or {}), **changed})
            m = msg.metadata  # a message of its own: Flower's strategies share one RecordDict between theirs
            content = RecordDict(records)
            own.append(Message(content, m.dst_node_id, m.message_type, ttl=m.ttl, group_id=m.group_id))
        self._sent[MessageType.TRAIN] = own
        self._global = arrays
        return own

    def _configure(self, kind: str, server_round: int, grid: Grid) -> bool:
        """Whether the round runs (it is not before `first_round`), after waiting for the nodes."""
        self._sent[kind] = []
        if server_round < self.first_round:
            return False
        self.connected(grid)
        return True

    def _collect(
        self, kind: str, replies: Iterable[Message], read: Callable[[int, Message], tuple[str, Any]]
    ) -> tuple[list[Any], list[Message], list[Failure]]:
        """The replies to the `kind` messages sent, each read by `read(node_id, reply)` into (node key, row
        or None): the rows and the inner strategy's replies in node-key order (the same sum in every run),
        and the failures (an error reply, none in time, one `read` refuses)."""
        sent = self._sent.pop(kind, [])
        paired = _by_node(sent, replies)
        errors = [(nid, reply) for nid, reply in paired if reply.has_error()]
        failed = [
            self._failure(
                nid,
                "unavailable" if reply.error.code == NODE_UNAVAILABLE else "error",
                f"{one_line(reply.error.reason)} (code {reply.error.code})",
            )
            for nid, reply in errors
        ]
        for nid in sorted({m.metadata.dst_node_id for m in sent} - {nid for nid, _ in paired}):
            failed.append(self._failure(nid, "timeout", "no reply within the round's timeout"))
        usable: list[tuple[str, Any, Message]] = []  # (node key, row, reply)
        for nid, reply in paired:
            if not reply.has_error():
                try:
                    usable.append((*read(nid, reply), reply))
                except ProtocolError as exc:
                    failed.append(self._failure(nid, "error", str(exc)))
        usable.sort(key=lambda u: u[0])
        inner = [reply for _, _, reply in usable] + [reply for _, reply in errors]
        return [row for _, row, _ in usable if row is not None], inner, failed

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Keep each report, hand the inner strategy the usable replies without it, record the round."""
        if server_round < self.first_round:
            return None, None
        unreported: list[str] = []

        def read(nid: int, reply: Message) -> tuple[str, tuple[int, ClientReport] | None]:
            arrays = _one(reply.content.array_records, ARRAYS_KEY, "train reply", "the weights")
            if self._global is not None and (why := weights_mismatch(arrays, self._global)):
                raise ProtocolError(f"train reply: {why}")
            self._metrics(reply.content, "train reply")
            report, key = take_report(reply.content), self.node(nid).key  # the report taken out of the reply
            if report is None:
                unreported.append(key)
                return key, None
            report.node_key = report.node_key or key
            # profiling a planning query measured belongs to the first round the node then trains
            report.profiling.profiling_s += self._unbilled_profiling.pop(nid, 0.0)
            return report.node_key, (nid, report)

        good, inner, failed = self._collect(MessageType.TRAIN, replies, read)
        for f in failed:
            log(WARNING, "round %d: %s (%s) failed: %s", server_round, f.node_key, f.kind, f.reason)
        reports = [report for _, report in good]
        record = RoundRecord(
            round=server_round,
            clients=[report_row(report, self.node(nid)) for nid, report in good],
            failed=sorted(failed, key=lambda f: f.node_key),
            summary=summarise(reports, failed, len(good) + len(unreported) + len(failed)),
        )
        if unreported:
            record.summary["unreported"] = sorted(unreported)
        if server_round in self.deadlines:
            record.summary["deadline_s"] = self.deadlines[server_round]
            record.summary["met_deadline_predicted"] = sum(bool(r.meets_deadline_predicted) for r in reports)
        self.rounds[server_round] = record
        if self.on_round is not None:
            self.on_round(record)
        # the inner strategy hears every round, an empty one too (its own bookkeeping, e.g. DP's)
        arrays, metrics = self.strategy.aggregate_train(server_round, inner)
        if not good and not unreported:
            return arrays, metrics
        s = record.summary  # its figures under their metric keys, then the counts
        figures = {key_of(k): s[k] for k in ("makespan_s", "total_energy_j", "share_at_target", "reported")}
        counts = {"unreported": len(unreported), "failed": len(s["failed"]), "over-cap": len(s["over_cap"])}
        return arrays, MetricRecord({**dict(metrics or {}), **figures, **counts})

    def _metrics(self, content: RecordDict, where: str) -> tuple[MappingReader, float]:
        """A reply's metrics and its examples (what the inner strategy weighs by), or ProtocolError."""
        r = reader(_one(content.metric_records, METRICS_KEY, where, ""), f"{where} metrics")
        return r, r.number(_inner_attr(self.strategy, "weighted_by_key", EXAMPLES_KEY), positive=True)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """The inner strategy's EVALUATE messages."""
        if not self._configure(MessageType.EVALUATE, server_round, grid):
            return []
        self._eval_arrays = arrays  # the round's global model: what `on_round_end` hears
        messages = list(self.strategy.configure_evaluate(server_round, arrays, config, grid))
        self._sent[MessageType.EVALUATE] = messages
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Each node's accuracy and loss into the round's record; the inner strategy aggregates."""
        if server_round < self.first_round:
            return None
        if self._sent.get(MessageType.EVALUATE):

            def read(nid: int, reply: Message) -> tuple[str, dict[str, Any]]:
                info = self.node(nid)
                r, examples = self._metrics(reply.content, "evaluate reply")
                row = dict(node_key=info.key, device=info.device, examples=examples, **evaluation_metrics(r))
                # the node's data (name and sizes), which its query leaves out
                if nid in self.nodes and NODE_KEY in reply.content.config_records:
                    self.nodes[nid] = info.with_data(reply.content.config_records[NODE_KEY])
                return info.key, row

            clients, replies, failed = self._collect(MessageType.EVALUATE, replies, read)
            if (record := self.rounds.get(server_round)) is not None:
                record.evaluation = {
                    "clients": clients,
                    "failed": [dataclasses.asdict(f) for f in sorted(failed, key=lambda f: f.node_key)],
                    "accuracy": _mean(clients, "accuracy"),
                    "loss": _mean(clients, "loss"),
                }
                if self.on_round is not None:
                    self.on_round(record)
        # no evaluation this round (fraction_evaluate = 0): nothing to record
        metrics = self.strategy.aggregate_evaluate(server_round, replies)
        if self.on_round_end is not None and self._eval_arrays is not None:
            self.on_round_end(server_round, self._eval_arrays)
        return metrics


def _mean(clients: list[dict[str, Any]], key: str) -> float | None:
    """The examples-weighted mean of `key` over the clients that reported it (None: none did)."""
    having = [c for c in clients if c[key] is not None]
    total = sum(c["examples"] for c in having)
    return sum(c[key] * c["examples"] for c in having) / total if total else None
