"""The fleet runner's ServerApp: the built-in one (`fl_server.app`), also reading what the fleet's
ClientApp sends beside each report (`simulations.bench_report.BenchReport`) into the results rows."""

from __future__ import annotations

from fl_server.app import app
from simulations.bench_report import BenchReport
from strategies.report import register_beside_report

__all__ = ["app"]

register_beside_report(BenchReport)
