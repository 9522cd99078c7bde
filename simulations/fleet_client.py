"""The fleet runner's ClientApp (`make run`, `make fleet`): the built-in one with the fleet's own round
steps, sending what they measured beside the report. A deployed board runs the built-in one."""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fl_client.app import MODS, evaluate, query, train_reply
from simulations.bench_report import BenchReport, measured

app = ClientApp(mods=MODS)
app.query()(query)
app.evaluate()(evaluate)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """The round with the fleet's steps; what they measured (if any) beside the report."""
    from simulations.bench_steps import round_steps  # torch: imported by the train message only

    reply, outcome = train_reply(msg, context, round_steps)
    if outcome is not None and (bench := measured(outcome)) is not None:
        reply.content[BenchReport.KEY] = bench.to_config()
    return reply
