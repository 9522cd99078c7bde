"""An in-process Grid that runs the real ClientApp per node and can make nodes fail like Flower does.

Failure modes, as the FLOWER-1.41 notes record them on a real SuperLink:
- "raise": the ClientApp raised → an error reply (code 2) from the node;
- "dead": the SuperNode died → an error reply with code 5 whose src_node_id is the SuperLink's (1);
- "silent": slower than the round's timeout → no reply at all;
- "garbage": a reply without a report (train) or without metrics (evaluate): a buggy or hostile client;
- "bad-report": a report with a missing field; "nan": a report (train) or metrics (evaluate) with a NaN
  accuracy; "wrong-types": a report whose batch size is a string; "nan-weights": weights holding NaN.
Each applies to train and evaluate messages; "query-MODE" makes the node fail its query too, and
"eval-MODE" only its evaluate messages.
Message ids are filled in on push as Flower's grids do, so the strategy's mapping is exercised.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

from flwr.app import Array, ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

SUPERLINK_NODE_ID = 1
_ids = itertools.count(1)


def set_task_identity() -> None:
    """Messages built outside a Flower runtime need a run id (FLOWER-1.41 notes)."""
    TaskIdentity.run_id = 7
    TaskIdentity.node_id = 0
    TaskIdentity.task_id = 0


class FakeGrid(Grid):
    def __init__(
        self,
        app: Any,
        node_configs: dict[int, dict[str, Any]],
        run_config: dict[str, Any],
        behaviour: dict[int, str] | None = None,
        on_call: Callable[[int, Message], None] | None = None,
    ) -> None:
        set_task_identity()
        self.app = app
        self.node_configs = node_configs
        self.run_config = run_config
        self.behaviour = behaviour or {}
        self.on_call = on_call
        self.sent: list[Message] = []
        self._pending: dict[str, Message] = {}
        self._contexts = {
            nid: Context(run_id=7, node_id=nid, node_config=cfg, state=RecordDict(), run_config=run_config)
            for nid, cfg in node_configs.items()
        }

    # unused parts of the Grid interface
    def set_run(self, run: Any) -> None: ...

    @property
    def run(self) -> Any:  # type: ignore[override]
        raise NotImplementedError

    def create_message(self, *args: Any, **kwargs: Any) -> Message:  # type: ignore[override]
        raise NotImplementedError

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Every node answers at once; the replies wait to be pulled (a silent node's never come)."""
        messages = list(messages)
        for reply in self.send_and_receive(messages):
            self._pending[reply.metadata.reply_to_message_id] = reply
        return [m.metadata.message_id for m in messages]

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._pending.pop(i) for i in list(message_ids) if i in self._pending]

    def get_node_ids(self) -> Iterable[int]:
        return list(self.node_configs)

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        replies = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = f"msg-{next(_ids)}"
            self.sent.append(msg)
            nid = msg.metadata.dst_node_id
            if self.on_call is not None:
                self.on_call(nid, msg)
            mode = self.behaviour.get(nid, "ok")
            kind = msg.metadata.message_type
            if kind == "query" and not mode.startswith("query-"):
                mode = "ok"  # these nodes describe themselves, then fail at work
            if kind != "evaluate" and mode.startswith("eval-"):
                mode = "ok"  # these nodes train, then fail to evaluate
            mode = mode.removeprefix("query-").removeprefix("eval-")
            if mode == "silent":
                continue
            if mode == "dead":
                reply = Message(Error(code=5, reason="node unavailable"), reply_to=msg)
                reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
            elif mode == "raise":
                reply = Message(Error(code=2, reason="<class 'RuntimeError'>:<'boom'>"), reply_to=msg)
            elif mode == "garbage" and kind == "train":
                reply = Message(RecordDict({"metrics": MetricRecord({"num-examples": 3})}), reply_to=msg)
            elif mode == "garbage" and kind == "evaluate":
                reply = Message(RecordDict({"node": ConfigRecord({"node-key": "x"})}), reply_to=msg)
            else:
                reply = self.app(message=msg, context=self._contexts[nid])
                if not reply.has_error() and kind in ("train", "evaluate"):
                    spoil(reply, kind, mode)
            replies.append(reply)
        return replies


def spoil(reply: Message, kind: str, mode: str) -> None:
    """Make a good reply bad the way `mode` says (see the module's docstring)."""
    content = reply.content
    if kind == "train" and mode == "bad-report":
        content.config_records["report"] = ConfigRecord({"device": "x"})
    elif kind == "train" and mode == "nan":
        content.config_records["report"]["accuracy"] = float("nan")
    elif kind == "train" and mode == "wrong-types":
        content.config_records["report"]["batch-size"] = "eight"
    elif kind == "train" and mode == "nan-weights":
        arrays = content.array_records["arrays"]
        name = next(k for k in arrays.keys() if arrays[k].numpy().dtype.kind == "f")  # noqa: SIM118
        bad = arrays[name].numpy().copy()
        bad.flat[0] = float("nan")
        arrays[name] = Array(bad)
    elif kind == "evaluate" and mode == "nan":
        content.metric_records["metrics"]["accuracy"] = float("nan")
