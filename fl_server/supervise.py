"""`python -m fl_server.supervise`: a deployed run that outlives SuperLink restarts: its log followed
again, or the run submitted again (it resumes after the last round saved) where the restart ended it
(docs/deployment.md, "Restarts"). The run's own last line, ``results: PATH``, is printed last."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_server.fab import staged_app
from powerctl.cli.util import (
    OneLineParser,
    installed_tool,
    non_negative_int,
    one_line_errors,
    positive_float,
    say,
)
from powerctl.errors import ANSI, PowerctlError
from powerctl.procs import connect_error
from strategies.flower_source import read_flwr_connection

PROG = "python -m fl_server.supervise"
LOST = "Connection to the SuperLink is unavailable"  # what `flwr` prints when its SuperLink does not answer
_RESULTS = re.compile(r"^results: (\S.*)$", re.MULTILINE)
# how Flower marks a run its SuperLink's restart ended (docs/deployment.md, "Restarts")
RESTART_DETAILS = (
    "No heartbeat received from the task",  # the SuperLink was away longer than the task's heartbeat
    "Task failed with unknown error",  # the ServerApp was stopped by a signal (its SuperExec went)
    "Task failed because the run expired",
)
_MAX_LINE = 400  # most characters of Flower's words a refusal line quotes
# the ServerApp's own failures: submitting the same run again would fail the same way
APP_FAILED = ("powerfed server: error:", "ServerApp failed with exception")


def _json_object(out: str) -> dict[str, Any] | None:
    """The JSON object `flwr … --format json` printed among other lines, or None."""
    try:
        payload = json.loads(out[out.index("{") : out.rindex("}") + 1])
    except ValueError:
        return None
    return payload if isinstance(payload, dict) else None


def refusal(payload: dict[str, Any] | None, out: str, rc: int) -> str:
    """Why `flwr run --format json` started no run, in one line: Flower's "error-message"'s last paragraph."""
    message = payload.get("error-message") if payload is not None else None
    if isinstance(message, str) and message.strip():
        last = [part for part in re.split(r"\n\s*\n", message) if part.strip()][-1]
        return ANSI.sub("", " ".join(last.split()))[:_MAX_LINE]
    tail = " ".join(ANSI.sub("", out).split())[-_MAX_LINE:]
    return f"exit status {rc}, {tail or 'no output'}"


@dataclass
class Supervisor:
    """One run, followed to its end through SuperLink restarts."""

    app: Path
    connection: str
    run_config: str
    max_restarts: int = 5
    wait_s: float = 600.0
    poll_s: float = 5.0
    address: str | None = None  # the SuperLink's Control API host:port, watched while following (`_watch`)
    listen_poll_s: float = 1.0

    def _call(self, args: list[str], timeout_s: float = 120.0) -> tuple[int, str]:
        try:
            argv, stdin = [installed_tool("flwr"), *args], subprocess.DEVNULL
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=stdin)
        except subprocess.TimeoutExpired:
            return 124, f"{LOST} (flwr {args[0]} gave no answer in {timeout_s:g} s)"
        return proc.returncode, proc.stdout + proc.stderr

    def submit(self) -> int:
        """`flwr run APP CONNECTION --run-config ...`: the new run's id; a refusal is one line."""
        with tempfile.TemporaryDirectory(prefix="powerfed-app-") as stage:
            app = staged_app(self.app, Path(stage) / "app")
            args = ["run", str(app), self.connection, "--run-config", self.run_config, "--format", "json"]
            rc, out = self._call(args, timeout_s=600.0)
        payload = _json_object(out)
        try:
            return int(payload["run-id"])  # type: ignore[index]
        except (KeyError, TypeError, ValueError):
            raise PowerctlError(f"flwr run did not start the run: {refusal(payload, out, rc)}") from None

    def follow(self, run_id: int, shown: list[str]) -> bool:
        """Stream the run's log to stdout, appending its lines to `shown` (a re-attached stream starts over:
        those are skipped). True when it ended as the SuperLink went away."""
        proc = subprocess.Popen(
            [installed_tool("flwr"), "log", str(run_id), self.connection, "--stream"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "COLUMNS": "200"},  # Flower's boxes unwrapped: one line says LOST
        )
        assert proc.stdout is not None
        lost, box, replayed = False, [], 0
        done, draining = threading.Event(), threading.Event()
        if self.address is not None:
            threading.Thread(target=self._watch, args=(proc, done, draining), daemon=True).start()
        try:
            for line in proc.stdout:
                if line.lstrip().startswith(("╭", "│", "╰")):
                    box.append(line)
                    if not line.lstrip().startswith("╰"):
                        continue
                    lost = lost or any(LOST in b for b in box)
                    lines, box = ([] if lost else box), []
                else:
                    lines = [line]
                for out in lines:
                    if replayed < len(shown) and shown[replayed] == out:
                        replayed += 1  # the part of the log already shown
                        continue
                    replayed = len(shown) + 1  # past the replay: everything from here on is new
                    shown.append(out)
                    sys.stdout.write(out)
                    sys.stdout.flush()
        finally:
            done.set()
            proc.wait()
        return lost or draining.is_set()

    def _watch(self, proc: subprocess.Popen[str], done: threading.Event, draining: threading.Event) -> None:
        """A SuperLink stopped with SIGTERM closes its port but waits for open requests (a followed log never
        ends): two refused connections in a row let the log go."""
        assert self.address is not None
        refused = 0
        while not done.wait(self.listen_poll_s):
            refused = refused + 1 if refuses(self.address) else 0
            if refused >= 2:
                draining.set()
                proc.terminate()
                return

    def wait_for_superlink(self, run_id: int) -> tuple[str, str]:
        """(status, details) of the run, e.g. ('running', ''), once the SuperLink answers about it;
        PowerctlError after `wait_s`."""
        deadline = time.monotonic() + self.wait_s
        while time.monotonic() < deadline:
            rc, out = self._call(["ls", self.connection, "--run-id", str(run_id), "--format", "json"])
            try:
                run = next(r for r in (_json_object(out) or {})["runs"] if str(r["run-id"]) == str(run_id))
            except (KeyError, TypeError, StopIteration):
                run = None
            if rc == 0 and LOST not in out and run is not None:
                return str(run["status"]), str(run.get("status-details") or "")
            time.sleep(self.poll_s)
        raise PowerctlError(
            f"the SuperLink of connection {self.connection!r} has not answered for {self.wait_s:g} s: "
            f"start it again (with the same --database), then: flwr log {run_id} {self.connection} --stream"
        )

    def run(self) -> Path:
        restarts = 0
        run_id = self.submit()
        say(f"supervise: run {run_id} started")
        shown: list[str] = []
        while True:
            lost = self.follow(run_id, shown)
            if lost:
                say(
                    f"supervise: lost the SuperLink; waiting for it to answer again (up to {self.wait_s:g} s)"
                )
            status, details = self.wait_for_superlink(run_id)
            if status in ("running", "pending", "starting"):
                if lost:
                    say(f"supervise: the SuperLink is back and run {run_id} goes on; following its log")
                continue
            log = "".join(shown)
            if status == "finished:completed":
                if found := _RESULTS.findall(log):
                    return Path(found[-1].strip())
                raise PowerctlError(f"run {run_id} completed without its results line: see its log above")
            by_restart = (lost or any(d in details for d in RESTART_DETAILS)) and not any(
                a in log or a in details for a in APP_FAILED
            )
            if not by_restart:
                raise PowerctlError(f"run {run_id} ended {status}: {details or 'see its log above'}")
            if restarts >= self.max_restarts:
                raise PowerctlError(
                    f"run {run_id} ended {status} after a SuperLink restart, and {restarts} restarts were "
                    "allowed (--max-restarts)"
                )
            restarts += 1
            run_id = self.submit()
            say(
                f"supervise: the run ended {status} ({details or 'no details'}) as the SuperLink restarted; "
                f"submitted it again as run {run_id}: it resumes after the last round saved "
                f"[restart {restarts} of at most {self.max_restarts}]"
            )
            shown = []


def refuses(address: str) -> bool:
    """Whether nothing listens at `address` (host:port, [v6]:port): a refused connection, not a timeout."""
    host, _, port = address.rpartition(":")
    try:
        return isinstance(connect_error(host.strip("[]"), int(port), 2.0), ConnectionRefusedError)
    except ValueError:
        return False


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Run the Flower app on a deployed SuperLink and follow it through SuperLink restarts: "
        "re-attach to its log, or submit it again (it resumes from --results-dir) when the restart ended it.",
        epilog="example: %(prog)s deploy --results-dir /srv/powerfed/run1 --run-config 'num-server-rounds=10 "
        "min-nodes=2'",
    )
    p.add_argument("connection", help="the flwr connection ([superlink.NAME] in $FLWR_HOME/config.toml)")
    p.add_argument("--app", type=Path, default=Path("."), help="the Flower app folder (default: .)")
    p.add_argument(
        "--results-dir",
        type=Path,
        required=True,
        help="where the run keeps results.json and the global model: what a resubmitted run resumes from",
    )
    p.add_argument("--run-config", default="", help="run config overrides, as for flwr run (not results-dir)")
    p.add_argument(
        "--max-restarts", type=non_negative_int, default=5, help="submissions after the first (default 5)"
    )
    p.add_argument(
        "--wait", type=positive_float, default=600.0, metavar="S", help="wait for the SuperLink (600)"
    )
    return p


def checked_supervisor(args: argparse.Namespace) -> Supervisor:
    """The run to submit, checked first as `make run` checks its own: one line for the first problem."""
    from fl_server.run_config import check_before_start, parse_run_config, run_config_text
    from strategies.settings import key_of

    overrides = parse_run_config(args.run_config)
    if (results_dir := key_of("results_dir")) in overrides:
        raise PowerctlError("give the results folder as --results-dir, not in --run-config")
    overrides[results_dir] = str(args.results_dir.expanduser().resolve())
    check_before_start(overrides, args.app.expanduser().resolve())
    return Supervisor(args.app, args.connection, run_config_text(overrides), args.max_restarts, args.wait)


@one_line_errors(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # a bad flag: one line and exit 2 (OneLineParser)
    connection = read_flwr_connection(args.connection)  # a bad config.toml or no connection: one line
    supervisor = checked_supervisor(args)
    supervisor.address = getattr(connection, "address", None)
    try:
        path = supervisor.run()
    except KeyboardInterrupt:
        say(f"{PROG}: interrupted; the run goes on on the SuperLink (flwr stop RUN_ID {args.connection})")
        return 130
    say(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
