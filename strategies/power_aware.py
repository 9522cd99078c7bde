"""Power-aware FedAvg: FedAvg's rounds, with the method's inputs sent per node and every report kept.

Per round:
1. ``configure_train``: sample nodes as FedAvg does; ask nodes it has not met yet who they are
   (``query``: device, cap, data size); build ONE message per node with the weights and that node's
   own ConfigRecord (`TrainInstructions`: relation vector, target, LR rule, budget, plus what
   `node_instructions` sets for it, keyed by the node's partition or name, never by list position).
2. ``aggregate_train``: map every reply to the node it answers through the message ids sent (a dead
   SuperNode's error reply comes from the SuperLink's id, not the node's); keep each report; name every
   node that failed, replied something unusable, or did not reply in time; average the weights of the
   others by examples. A failed client never stops the round.
With `round_objective="energy-under-deadline"` (ours), ``configure_train`` first asks each sampled node
once for its plan (a QUERY with its instructions: its predicted fastest time to the target), sets the
round's deadline to the slowest one's (or `round_deadline_s`), and sends it: each client then runs its
least-energy pair that meets it. A FedAvg round waits for its slowest client anyway; the others need
not race to idle.
3. ``configure_evaluate`` / ``aggregate_evaluate``: FedAvg's, plus the per-node accuracy and loss.
`on_round` receives the `RoundRecord` after training and again after evaluation, so the ServerApp can
write results as each round completes; `on_round_end(round, weights)` follows once the round is over,
so it can save the global model. `start(..., instructions=..., first_round=k)` runs the rounds with the
run's typed `TrainInstructions` and continues a run after its round k - 1.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from logging import INFO, WARNING

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg, Result
from flwr.serverapp.strategy.strategy_utils import sample_nodes
from flwr.supercore import log

from strategies.protocol import (
    ARRAYS_KEY,
    CONFIG_KEY,
    EXAMPLES_KEY,
    METRICS_KEY,
    NODE_KEY,
    PLAN_KEY,
    REPORT_KEY,
    ROUND_OBJECTIVES,
    ClientReport,
    Plan,
    ProtocolError,
    TrainInstructions,
    reader,
    required,
)
from strategies.rounds import (
    Failure,
    NodeInfo,
    RoundRecord,
    one_line,
    report_row,
    summarise,
    weighted_average,
    weights_mismatch,
)

NODE_UNAVAILABLE = 5
"""Flower's ErrorCode.NODE_UNAVAILABLE: the SuperNode went away while the message was out."""

NodeInstructions = Callable[[NodeInfo, int, TrainInstructions], TrainInstructions]
"""(node, server round, the round's instructions) → this node's instructions (e.g. its own cap)."""


def same_for_every_node(node: NodeInfo, server_round: int, base: TrainInstructions) -> TrainInstructions:
    """The default: the round's instructions, addressed to the node (its key is echoed back)."""
    return dataclasses.replace(base, server_round=server_round, node_key=node.key)


class PowerAwareFedAvg(FedAvg):
    """FedAvg whose clients each choose (batch size, GPU frequency) under their own power cap."""

    def __init__(
        self,
        *,
        node_instructions: NodeInstructions = same_for_every_node,
        on_round: Callable[[RoundRecord], None] | None = None,
        on_round_end: Callable[[int, ArrayRecord], None] | None = None,
        query_timeout: float = 120.0,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 1,
        min_evaluate_nodes: int = 1,
        min_available_nodes: int = 1,
        round_objective: str = "time",
        round_deadline_s: float = 0.0,
        rejoin_wait_s: float = 30.0,
    ) -> None:
        if round_objective not in ROUND_OBJECTIVES:
            raise ValueError(
                f"round objective must be one of {', '.join(ROUND_OBJECTIVES)}, got {round_objective!r}"
            )
        if not round_deadline_s >= 0:
            raise ValueError(
                f"round deadline must be ≥ 0 seconds (0: the slowest client's), got {round_deadline_s!r}"
            )
        super().__init__(
            fraction_train=fraction_train,
            fraction_evaluate=fraction_evaluate,
            min_train_nodes=min_train_nodes,
            min_evaluate_nodes=min_evaluate_nodes,
            min_available_nodes=min_available_nodes,
            arrayrecord_key=ARRAYS_KEY,
            configrecord_key=CONFIG_KEY,
            weighted_by_key=EXAMPLES_KEY,
        )
        self.node_instructions = node_instructions
        self.on_round = on_round
        self.on_round_end = on_round_end
        self.query_timeout = query_timeout
        self.nodes: dict[int, NodeInfo] = {}
        self.rounds: dict[int, RoundRecord] = {}
        self._sent: dict[str, list[Message]] = {}
        self._global: ArrayRecord | None = None
        self._gathered = False
        self._most_seen = 0
        self.rejoin_wait_s = rejoin_wait_s
        """How long a round waits for nodes seen before to reconnect (after a SuperLink restart they come
        back one by one). A node still missing after it is taken as gone: later rounds do not wait for
        it again unless it comes back."""
        self.round_objective, self.round_deadline_s = round_objective, round_deadline_s
        self.instructions: TrainInstructions | None = None
        """The run's train instructions (`start`); each node's are made from them every round."""
        self.plans: dict[int, Plan] = {}
        self.deadlines: dict[int, float] = {}
        self._unbilled_profiling: dict[int, float] = {}

    # --- the rounds ---------------------------------------------------------------------------
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
        *,
        instructions: TrainInstructions,
        first_round: int = 1,
    ) -> Result:
        """Flower's `Strategy.start` (train, then evaluate, every round), from `first_round`, with the
        run's train instructions typed (Flower's `train_config` record is not used: each node's own
        record is written from them, `node_instructions`, every round).

        A resumed run passes the weights its last completed round produced and the round after it.
        The result's weights are the last round's average, or `initial_arrays` when no client
        ever reported (Flower's own loop would return no weights at all then).
        """
        self.instructions = instructions
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        result = Result(arrays=initial_arrays)
        arrays = initial_arrays
        log(INFO, "Starting %s from round %d of %d", type(self).__name__, first_round, num_rounds)
        for current_round in range(first_round, num_rounds + 1):
            log(INFO, "[ROUND %s/%s]", current_round, num_rounds)
            replies = grid.send_and_receive(
                messages=self.configure_train(current_round, arrays, ConfigRecord(), grid), timeout=timeout
            )
            agg_arrays, train_metrics = self.aggregate_train(current_round, replies)
            if agg_arrays is not None:
                result.arrays = arrays = agg_arrays
            if train_metrics is not None:
                result.train_metrics_clientapp[current_round] = train_metrics
            replies = grid.send_and_receive(
                messages=self.configure_evaluate(current_round, arrays, evaluate_config, grid),
                timeout=timeout,
            )
            eval_metrics = self.aggregate_evaluate(current_round, replies)
            if eval_metrics is not None:
                result.evaluate_metrics_clientapp[current_round] = eval_metrics
            if evaluate_fn is not None and (res := evaluate_fn(current_round, arrays)) is not None:
                result.evaluate_metrics_serverapp[current_round] = res
            if self.on_round_end is not None:
                self.on_round_end(current_round, arrays)
        return result

    # --- nodes --------------------------------------------------------------------------------
    def _sample(self, grid: Grid, fraction: float, minimum: int) -> list[int]:
        """FedAvg's sampling. `min_available_nodes` gathers the fleet once, before the first round;
        after that, whoever is connected: Flower's sampling waits for that many nodes without a limit,
        so one SuperNode that died would otherwise hold the run forever. The sample's size is counted
        after that wait: counted before it, a node that connected during the wait was left out."""
        if not self._gathered:
            sample_nodes(grid, self.min_available_nodes, 0)  # Flower's wait for the fleet, sampling none
            self._gathered = True
        num = int(self._wait_for_rejoining(grid) * fraction)
        node_ids, _ = sample_nodes(grid, 1, max(num, minimum))
        return sorted(node_ids)

    def _wait_for_rejoining(self, grid: Grid) -> int:
        """Wait up to `rejoin_wait_s` for the most nodes seen so far; returns how many are connected."""
        deadline = time.monotonic() + self.rejoin_wait_s
        while (connected := len(list(grid.get_node_ids()))) < self._most_seen and time.monotonic() < deadline:
            time.sleep(min(1.0, self.rejoin_wait_s))
        self._most_seen = connected  # whoever did not come back in time is gone: wait for them once
        return connected

    def _query(self, grid: Grid, contents: dict[int, RecordDict]) -> list[tuple[int, Message]]:
        """Send each node its QUERY and pair every reply with the node it answers (by message id: a
        dead SuperNode's error reply comes from the SuperLink)."""
        if not contents:
            return []
        queries = [
            Message(content, dst_node_id=nid, message_type=MessageType.QUERY)
            for nid, content in contents.items()
        ]
        sent = {m.metadata.message_id: m.metadata.dst_node_id for m in queries}
        replies = grid.send_and_receive(queries, timeout=self.query_timeout)
        return [(sent.get(r.metadata.reply_to_message_id, r.metadata.src_node_id), r) for r in replies]

    def learn_nodes(self, grid: Grid, node_ids: Iterable[int]) -> None:
        """Ask every node not met yet for its device, cap and data size (``query``)."""
        new = [nid for nid in node_ids if nid not in self.nodes]
        if not new:
            return
        for nid, reply in self._query(grid, {nid: RecordDict({}) for nid in new}):
            if reply.has_error() or NODE_KEY not in reply.content.config_records:
                why = one_line(reply.error.reason) if reply.has_error() else "no node record"
                log(WARNING, "query: node %s did not describe itself: %s", nid, why)
                continue
            try:
                self.nodes[nid] = NodeInfo.from_record(nid, reply.content.config_records[NODE_KEY])
            except (TypeError, ValueError) as exc:  # a malformed description must not stop the run
                log(WARNING, "query: node %s described itself unreadably: %s", nid, exc)
        for nid in new:
            self.nodes.setdefault(nid, NodeInfo.unknown(nid))

    def plan_deadline(self, grid: Grid, instructions: dict[int, TrainInstructions]) -> float:
        """Energy-under-deadline: ask every sampled node not planned yet for its predicted fastest time
        to the target (a QUERY carrying its train instructions: the node profiles, cached, and
        selects), and return the round's deadline: the user's, else the slowest node's fastest time
        (0 when no node answered: everyone then runs its fastest pair). A node that fails to answer is
        named in the log; the deadline comes from the others, and it receives it too."""
        new = {
            nid: RecordDict({CONFIG_KEY: instr.to_config()})
            for nid, instr in instructions.items()
            if nid not in self.plans
        }
        for nid, reply in self._query(grid, new):
            try:
                if reply.has_error():
                    raise ProtocolError(one_line(reply.error.reason))
                plan = Plan.from_config(required(reply.content.config_records, PLAN_KEY, "plan reply"))
            except ProtocolError as exc:
                log(WARNING, "plan: node %s gave no plan: %s", self.node(nid).key, exc)
                continue
            self.plans[nid] = plan
            self._unbilled_profiling[nid] = plan.profiling_seconds
        if self.round_deadline_s > 0:
            return self.round_deadline_s
        planned = [self.plans[nid].fastest_seconds for nid in instructions if nid in self.plans]
        return max(planned, default=0.0)

    def node(self, node_id: int) -> NodeInfo:
        return self.nodes.get(node_id) or NodeInfo.unknown(node_id)

    def _failure(self, node_id: int, kind: str, reason: str) -> Failure:
        info = self.node(node_id)
        return Failure(node_id, info.key, info.device, kind, reason)

    # --- training -----------------------------------------------------------------------------
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """One TRAIN message per sampled node, its record written from the instructions `start` took
        (Flower's `config` is not read)."""
        if self.fraction_train == 0.0:
            return []
        base = self.instructions
        if base is None:
            raise RuntimeError(
                "configure_train needs the run's instructions: call start(..., instructions=...)"
            )
        node_ids = self._sample(grid, self.fraction_train, self.min_train_nodes)
        self.learn_nodes(grid, node_ids)
        log(INFO, "configure_train: %d nodes", len(node_ids))
        instructions = {nid: self.node_instructions(self.node(nid), server_round, base) for nid in node_ids}
        if self.round_objective == "energy-under-deadline":
            deadline = self.plan_deadline(grid, instructions)
            if deadline > 0:
                self.deadlines[server_round] = deadline
                instructions = {
                    n: dataclasses.replace(i, deadline_s=deadline) for n, i in instructions.items()
                }
        messages = []
        for nid in node_ids:
            instr = instructions[nid]
            content = RecordDict({ARRAYS_KEY: arrays, CONFIG_KEY: instr.to_config()})
            messages.append(Message(content, dst_node_id=nid, message_type=MessageType.TRAIN))
        self._sent[MessageType.TRAIN] = messages
        self._global = arrays
        return messages

    def _match(
        self, kind: str, replies: Iterable[Message]
    ) -> tuple[list[tuple[int, Message]], list[Failure]]:
        """Pair each reply with the node it answers; failures for errors and for missing replies."""
        sent = self._sent.pop(kind, [])
        by_id = {m.metadata.message_id: m.metadata.dst_node_id for m in sent}
        answered: set[int] = set()
        ok: list[tuple[int, Message]] = []
        failed: list[Failure] = []
        for reply in replies:
            nid = by_id.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
            answered.add(nid)
            if reply.has_error():
                code = reply.error.code
                why = "unavailable" if code == NODE_UNAVAILABLE else "error"
                failed.append(self._failure(nid, why, f"{one_line(reply.error.reason)} (code {code})"))
            else:
                ok.append((nid, reply))
        for nid in sorted(set(by_id.values()) - answered):
            failed.append(self._failure(nid, "timeout", "no reply within the round's timeout"))
        return ok, failed

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        matched, failed = self._match(MessageType.TRAIN, replies)
        sampled = len(matched) + len(failed)
        good: list[tuple[int, ClientReport, ArrayRecord, float]] = []
        for nid, reply in matched:
            try:
                report, arrays, examples = self._read_train_reply(reply)
            except ProtocolError as exc:
                failed.append(self._failure(nid, "error", str(exc)))
                continue
            report.node_key = report.node_key or self.node(nid).key
            # profiling a planning query measured belongs to the first round the node then trains
            report.profiling_seconds += self._unbilled_profiling.pop(nid, 0.0)
            good.append((nid, report, arrays, examples))
        good.sort(key=lambda g: g[1].node_key)  # node keys, not ids: the same order (and sum) in every run
        for f in failed:
            log(WARNING, "round %d: %s (%s) failed: %s", server_round, f.node_key, f.kind, f.reason)
        reports = [g[1] for g in good]
        record = RoundRecord(
            round=server_round,
            clients=[report_row(report, self.node(nid)) for nid, report, _, _ in good],
            failed=sorted(failed, key=lambda f: f.node_key),
            summary=summarise(reports, failed, sampled),
        )
        if server_round in self.deadlines:
            record.summary["deadline_s"] = self.deadlines[server_round]
            record.summary["met_deadline_predicted"] = sum(bool(r.meets_deadline_predicted) for r in reports)
        self.rounds[server_round] = record
        if self.on_round is not None:
            self.on_round(record)
        if not good:
            return None, None
        arrays = weighted_average([(g[2], g[3]) for g in good], self._global or good[0][2])
        s = record.summary
        metrics = MetricRecord(
            {
                "makespan-s": s["makespan_s"],
                "total-energy-j": s["total_energy_j"],
                "share-at-target": s["share_at_target"],
                "reported": s["reported"],
                "failed": len(s["failed"]),
                "over-cap": len(s["over_cap"]),
            }
        )
        return arrays, metrics

    def _read_train_reply(self, reply: Message) -> tuple[ClientReport, ArrayRecord, float]:
        content = reply.content
        report = ClientReport.from_config(required(content.config_records, REPORT_KEY, "train reply"))
        arrays = required(content.array_records, ARRAYS_KEY, "train reply", "the weights")
        if self._global is not None and (why := weights_mismatch(arrays, self._global)):
            raise ProtocolError(f"train reply: {why}")
        metrics = required(content.metric_records, METRICS_KEY, "train reply")
        examples = reader(metrics, "train reply metrics").number(EXAMPLES_KEY, positive=True)
        return report, arrays, examples

    # --- evaluation ---------------------------------------------------------------------------
    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.fraction_evaluate == 0.0:
            return []
        node_ids = self._sample(grid, self.fraction_evaluate, self.min_evaluate_nodes)
        messages = []
        for nid in node_ids:  # one RecordDict per message: nothing shared that a node could alter
            cfg = ConfigRecord({**dict(config), "server-round": server_round, "node-key": self.node(nid).key})
            content = RecordDict({ARRAYS_KEY: arrays, CONFIG_KEY: cfg})
            messages.append(Message(content, dst_node_id=nid, message_type=MessageType.EVALUATE))
        self._sent[MessageType.EVALUATE] = messages
        return messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        if not self._sent.get(MessageType.EVALUATE):
            return None  # no evaluation this round (fraction_evaluate = 0)
        matched, failed = self._match(MessageType.EVALUATE, replies)
        clients = []
        for nid, reply in matched:
            info = self.node(nid)
            try:
                metrics = required(reply.content.metric_records, METRICS_KEY, "evaluate reply")
                r = reader(metrics, "evaluate reply metrics")
                clients.append(
                    {
                        "node_key": info.key,
                        "device": info.device,
                        "examples": r.number(EXAMPLES_KEY, positive=True),
                        "accuracy": r.number("accuracy"),
                        "loss": r.number("loss"),
                    }
                )
            except ProtocolError as exc:
                failed.append(self._failure(nid, "error", str(exc)))
        clients.sort(key=lambda c: c["node_key"])
        total = sum(c["examples"] for c in clients)
        evaluation = {
            "clients": clients,
            "failed": [dataclasses.asdict(f) for f in sorted(failed, key=lambda f: f.node_key)],
            "accuracy": sum(c["accuracy"] * c["examples"] for c in clients) / total if total else None,
            "loss": sum(c["loss"] * c["examples"] for c in clients) / total if total else None,
        }
        record = self.rounds.get(server_round)
        if record is not None:
            record.evaluation = evaluation
            if self.on_round is not None:
                self.on_round(record)
        if not total:
            return None
        return MetricRecord({"accuracy": evaluation["accuracy"], "loss": evaluation["loss"]})
