"""`power_aware_mod`, the Flower Mod that makes any ClientApp's train function power-aware, and
`describe_node`, a query function; bad input is an error reply whose reason is one line."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Error, Message, MessageType, RecordDict

from fl_client.node import NodeSettings, resolve_node
from powerctl.devices import open_device
from powerctl.errors import PowerctlError
from strategies.fleet import NodeConfigError
from strategies.protocol import CONFIG_KEY, NODE_KEY, PLAN_KEY, REPORT_KEY, TrainInstructions, required
from strategies.settings import client_setting

log = logging.getLogger(__name__)

Planner = Callable[[Message, Context, NodeSettings], ConfigRecord]  # a query's plan (`fl_client.app`)
CLIENT_ERROR_CODE = 2  # ErrorCode.CLIENT_APP_RAISED_EXCEPTION: what Flower uses when a ClientApp fails


def error_reply(msg: Message, settings: NodeSettings | None, exc: Exception) -> Message:
    """The one-line error reply for this node (logged here too, in the same words)."""
    who = f"{settings.key} ({settings.device})" if settings else "node"
    reason = f"{who}: {exc}".replace("\n", " ")
    log.error("powerfed client: %s", reason)
    return Message(Error(code=CLIENT_ERROR_CODE, reason=reason), reply_to=msg)


def message_config(msg: Message) -> ConfigRecord:
    """The message's config record (the plan), required."""
    return required(msg.content.config_records, CONFIG_KEY, f"{msg.metadata.message_type} message")


def profile_cache(run_config: Any) -> Path | None:
    """The run's own profile cache (`profile-cache`, an absolute folder), else the shared default."""
    value = client_setting(run_config, "profile_cache", NodeConfigError)
    return Path(value) if value else None


def node_reply(msg: Message, context: Context, plan: Planner | None = None) -> Message:
    """A query's reply: who this node is (`strategies.rounds.NodeInfo`) and, when the query holds train
    instructions, `plan`'s record (without `plan`: refused)."""
    settings = None
    try:
        settings = resolve_node(context.node_config, context.run_config, needs_data=plan is not None)
        if plan is None and CONFIG_KEY in msg.content.config_records:
            raise PowerctlError(
                "energy-under-deadline rounds ask the built-in ClientApp for a plan; this app only "
                "describes itself"
            )
        with open_device(settings.device, pin=settings.pin) as dev:
            info: dict[str, Any] = {"node-key": settings.key, "device": settings.device, "board": dev.board}
        optional = {"power-cap-w": settings.power_cap_w, "partition-id": settings.partition_id}
        info.update({k: v for k, v in optional.items() if v is not None})
        content = RecordDict({NODE_KEY: ConfigRecord(info)})
        if plan is not None and CONFIG_KEY in msg.content.config_records:
            content[PLAN_KEY] = plan(msg, context, settings)
    except PowerctlError as exc:
        return error_reply(msg, settings, exc)
    return Message(content, reply_to=msg)


def describe_node(msg: Message, context: Context) -> Message:
    """A query function for a user's ClientApp (`app.query()(describe_node)`): the node's device, board
    and cap, which `PowerAware` asks every node it has not met (planning queries need the built-in
    ClientApp)."""
    return node_reply(msg, context)


def power_aware_mod(
    msg: Message, context: Context, call_next: Callable[[Message, Context], Message]
) -> Message:
    """A ClientApp Mod: the train function runs with this round's node and plan open for its
    `PowerSession`, and its reply carries the session's report."""
    if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
        return call_next(msg, context)
    # the session (torch, the training core) only for a train message: a board's query imports none of it
    from fl_client.session import CURRENT_ROUND, RoundContext

    settings = None
    try:
        settings = resolve_node(context.node_config, context.run_config, needs_data=False)
        instr = TrainInstructions.from_config(message_config(msg))
        round_ = RoundContext(settings, instr, profile_cache(context.run_config))
        token = CURRENT_ROUND.set(round_)
        try:
            reply = call_next(msg, context)
        finally:
            CURRENT_ROUND.reset(token)
    except PowerctlError as exc:
        return error_reply(msg, settings, exc)
    if reply.has_error():
        return reply
    reports = [s.report for s in round_.sessions if s.report is not None]
    if len(reports) != 1:
        what = "opened no PowerSession" if not reports else f"ran {len(reports)} PowerSessions"
        problem = PowerctlError(f"the train function {what}: run its loop in one `with PowerSession(...)`")
        return error_reply(msg, settings, problem)
    reply.content[REPORT_KEY] = reports[0].to_config()
    return reply
