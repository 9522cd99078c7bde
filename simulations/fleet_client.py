"""The fleet runner's ClientApp: the built-in one (`fl_client.app`: the same query, evaluate and mods)
whose train round is given the fleet's own steps (`simulations.bench_steps.round_steps`: scale mode's
predicted profiles and stand-in, the oracle's own-data search), and whose reply carries what they
measured beside the report (`simulations.bench_report.BenchReport`).

The simulations launcher runs it in place of the built-in one (`simulations.launcher.run_flwr`, for
`make run` and `make fleet`); a deployed board runs the built-in one, whose round has none of these steps
and refuses instructions that ask for them in one line.
"""

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
