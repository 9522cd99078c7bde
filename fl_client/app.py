"""The ClientApp: Flower messages (query, train, evaluate) to `fl_client.round` and back. Each function
imports only what it needs (a process per message); bad input is an error reply of one line."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fl_client.faults import before_training, parse_faults
from fl_client.local_data import data_plan, load_local_data
from fl_client.mod import error_reply, message_config, node_reply, profile_cache
from fl_client.node import NodeSettings, resolve_node
from powerctl.cli.util import library_lines_on_stderr, say
from powerctl.errors import PowerctlError
from strategies.protocol import (
    ARRAYS_KEY,
    EXAMPLES_KEY,
    METRICS_KEY,
    NODE_KEY,
    REPORT_KEY,
    ProtocolError,
    TrainInstructions,
    reader,
    required,
)

if TYPE_CHECKING:
    from flwr.clientapp.typing import Mod

    from fl_client.round import RoundOutcome, RoundSteps, State


def _library_lines(
    msg: Message, context: Context, call_next: Callable[[Message, Context], Message]
) -> Message:
    """A Mod: what the library logs while a message is handled is shown on stderr, as the CLIs show it."""
    with library_lines_on_stderr():
        return call_next(msg, context)


MODS: list[Mod] = [_library_lines]  # the fleet runner's ClientApp runs the same
app = ClientApp(mods=MODS)


def _state(msg: Message) -> State:
    """The weights sent, as a state dict (each array decoded once); NaN or infinity is refused."""
    import torch

    where = f"{msg.metadata.message_type} message"
    arrays = required(msg.content.array_records, ARRAYS_KEY, where, "the weights")
    state: State = {}
    for name, array in arrays.items():
        values = array.numpy()
        if values.dtype.kind in "fc" and not np.all(np.isfinite(values)):
            raise ProtocolError(f"{where}: {ARRAYS_KEY!r} hold NaN or infinity (in {name!r})")
        state[name] = torch.from_numpy(values)
    return state


def _plan(msg: Message, context: Context, settings: NodeSettings) -> ConfigRecord:
    """A plan query's answer: the fastest pair under the node's cap, the predicted time to the target."""
    from fl_client.round import model_seq_len, plan_round  # the plan profiles: torch

    instr = TrainInstructions.from_config(message_config(msg), "plan query config")
    plan_data = data_plan(settings, context.run_config, model_seq_len(instr.model, instr.model_overrides))
    examples = len(load_local_data(plan_data)[0])
    return plan_round(settings, instr, examples, profile_cache=profile_cache(context.run_config)).to_config()


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Who this node is; with train instructions (energy-under-deadline rounds), also its plan."""
    return node_reply(msg, context, _plan)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """The production round (`fl_client.round.RoundSteps.for_instructions`) and its reply."""
    return train_reply(msg, context)[0]


def train_reply(
    msg: Message, context: Context, steps_for: Callable[[TrainInstructions], RoundSteps] | None = None
) -> tuple[Message, RoundOutcome | None]:
    """A TRAIN message's round with `steps_for`'s steps, its reply and outcome (None: an error reply)."""
    from fl_client.round import RoundWork, model_seq_len, node_device_seed, run_round

    settings = None
    try:
        settings = resolve_node(context.node_config, context.run_config)
        instr = TrainInstructions.from_config(message_config(msg))
        state = _state(msg)
        plan = data_plan(settings, context.run_config, model_seq_len(instr.model, instr.model_overrides))
        data = load_local_data(plan)
        faults = parse_faults(context.run_config)  # soak tests only; refused elsewhere
        after = instr.checkpoint_every_samples + instr.eval_every_samples  # a kill's: its first checkpoint
        on_step = before_training(faults, settings.key, instr.server_round, after)
        seed, cache = node_device_seed(settings, instr.seed), profile_cache(context.run_config)
        work = RoundWork(settings, instr, state, data, seed, cache, on_step)
        outcome = run_round(work, steps_for(instr) if steps_for is not None else None)
    except PowerctlError as exc:
        return error_reply(msg, settings, exc), None
    report, trained = outcome.report, outcome.report.training
    stand_in = ", stand-in" if outcome.trained.stand_in else ""
    say(
        f"powerfed client {settings.key} [{instr.method}{stand_in}]: "
        f"round {instr.server_round} b={report.batch_size} "
        f"f={report.frequency_hz / 1e6:.1f} MHz{'' if report.pinned else ' (not pinned)'} "
        f"{trained.device_s:.1f} device s, "
        f"accuracy {trained.accuracy:.3f}",
        file=sys.stderr,
    )
    metrics = MetricRecord(
        {
            EXAMPLES_KEY: report.train_examples,
            "device-s": trained.device_s,
            "accuracy": trained.accuracy,
            "samples": trained.samples,
        }
    )
    arrays = ArrayRecord.from_torch_state_dict(outcome.trained.state)
    content = RecordDict({ARRAYS_KEY: arrays, METRICS_KEY: metrics, REPORT_KEY: report.to_config()})
    return Message(content, reply_to=msg), outcome


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    from fl_client.round import build_local_model, model_seq_len
    from powerctl.files.mapping import Integer, JsonObject, Text
    from powerfed.training.evaluation import evaluate_with_loss
    from powerfed.training.models import get_model_spec

    settings = None
    try:
        settings = resolve_node(context.node_config, context.run_config)
        r = reader(message_config(msg), "evaluate message config")
        model_name = r.value("model", Text())
        overrides = r.value("model-overrides", JsonObject())
        state = _state(msg)
        model = build_local_model(model_name, r.value("num-classes", Integer(1)), overrides, state)
        plan = data_plan(settings, context.run_config, model_seq_len(model_name, overrides))
        train, test = load_local_data(plan)
        accuracy, loss = evaluate_with_loss(model, get_model_spec(model_name).task, test.x, test.y)
    except PowerctlError as exc:
        return error_reply(msg, settings, exc)
    metrics = MetricRecord({EXAMPLES_KEY: len(test), "accuracy": accuracy, "loss": loss})
    sizes = {"train-examples": len(train), "test-examples": len(test)}  # the query loads no data
    node = ConfigRecord({"node-key": settings.key, "device": settings.device, "data": train.name, **sizes})
    return Message(RecordDict({METRICS_KEY: metrics, NODE_KEY: node}), reply_to=msg)
