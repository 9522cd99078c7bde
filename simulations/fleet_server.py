"""The fleet runner's ServerApp: the built-in one (`fl_server.app`), reading what the fleet's ClientApp
sends beside each report (`simulations.bench_report.BenchReport`: scale mode's stand-in, the oracle's
own-data search) into the results rows. The simulations launcher runs it in place of the built-in one
(`simulations.launcher.run_flwr`)."""

from __future__ import annotations

from fl_server.app import app
from simulations.bench_report import BenchReport
from strategies.report import register_beside_report

__all__ = ["app"]

register_beside_report(BenchReport)
