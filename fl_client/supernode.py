"""`python -m fl_client.supernode [flower-supernode flags]`: a SuperNode that starts again after a crash
and, when it cannot start, says why in one line.

It runs `flower-supernode` with the flags given, unchanged, after checking the files they name (a bad
one: one line, exit status 2) and, with a node key, releasing this key's node if the SuperLink still
counts it online (docs/deployment.md, "Restarts"). If the SuperNode exits all the same, the first cause
`fl_client.check` finds is one line on stderr, exit status 1; where the cause may pass (the key's node
still online) it starts it again, one line each time, until `--wait` seconds have passed. What the
SuperNode left behind is stopped; stop signals are passed on; the exit status is the SuperNode's.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fl_client.check import HEARTBEAT_WINDOW_S, check_files, release_stale_node, run_checks, target_from_args
from fl_client.check import PROG as CHECK_PROG
from fl_client.check_network import CheckFailed, Target
from fl_client.clientapp_entry import light_clientapp
from powerctl.cli.util import bounded_float, installed_tool, one_line_errors, say
from powerctl.errors import PowerctlError
from powerctl.procs import PROC, become_subreaper, handling, option_value, proc_table, search_path

PROG = "python -m fl_client.supernode"
REFUSED = "Failed to activate SuperNode"
CONNECTION_ERROR = 305  # Flower's `Exit Code: 305`: the SuperNode cannot connect or is refused
RETRY_S = 10.0
STOP_GRACE_S = 10.0  # for what the SuperNode left to end after SIGTERM (a ClientApp restores its board)
DRAIN_S = 2.0  # the rest of the output is read this long once every process started has ended
MAX_WAIT_S = 86400.0
WAIT_S = bounded_float(0.0, MAX_WAIT_S, above=False)
_EXIT_CODE = re.compile(r"Exit Code: (\d+)")
_BIND = re.compile(r"error while attempting to bind on address \('?([^',]*)'?, (\d+)\): (.*)$")
_API_FAILED = "SuperNode Runtime HTTP API failed to start"
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


class NotStarted(Exception):
    """The SuperNode could not start, for a named cause: one line on stderr, exit status 1."""


def _target(flags: list[str]) -> Target:
    """The connection part of the SuperNode's own flags (Flower's default address without --superlink)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--superlink")
    p.add_argument("--insecure", action="store_true")
    p.add_argument("--root-certificates", type=Path)
    p.add_argument("--auth-supernode-private-key", type=Path)
    known, _ = p.parse_known_args(flags, argparse.Namespace(connection=None))
    if known.superlink is None:
        from flwr.supercore.constant import SUPERLINK_DEFAULT_CLIENT_ADDRESS

        known.superlink = SUPERLINK_DEFAULT_CLIENT_ADDRESS
    return target_from_args(known)  # as `fl_client.check` reads the same flags


def child_env(tool: str, first: Path | None = None) -> dict[str, str]:
    """This environment with the folder of `tool` first on PATH (and `first` before it): the SuperNode
    starts `flower-superexec` (and that `flwr-clientapp`) by name, from the same install."""
    return {**os.environ, "PATH": search_path(first, Path(tool).parent)}


def _children() -> dict[int, bool]:
    """This process's children: {pid: still running (False: a zombie to reap)}."""
    if not PROC.is_dir():  # no /proc: nothing to find (and no subreaper either)
        return {}
    me = os.getpid()
    return {pid: st.running for pid, st in proc_table().items() if st.ppid == me}


def _reap(pid: int) -> bool:
    """Reap a zombie child: False while it cannot be yet (a thread group's exited leader whose other
    threads still run shows as a zombie too), so that it is signalled, not waited on forever."""
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except ChildProcessError:  # reaped already, or not ours
        return True


def stop_leftovers(grace_s: float = STOP_GRACE_S) -> list[int]:
    """SIGTERM every child of this process (left by an exited SuperNode), SIGKILL what is left after
    `grace_s`, and reap them; done only at a scan with no child (a reaped zombie's own show up next)."""
    deadline = time.monotonic() + grace_s
    signalled: dict[int, signal.Signals] = {}
    seen: set[int] = set()
    while True:
        kids = _children()
        if not kids:
            return sorted(seen)
        live = [pid for pid, running in kids.items() if running or not _reap(pid)]
        if not live:  # only zombies, now reaped: look again for what they left
            time.sleep(0.01)
            continue
        sig = signal.SIGKILL if time.monotonic() > deadline else signal.SIGTERM
        for pid in live:
            seen.add(pid)
            if signalled.get(pid) != sig:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                signalled[pid] = sig
        time.sleep(0.1)


@dataclass
class Outcome:
    """How one SuperNode run ended, read from its exit status and its output."""

    rc: int = 0
    flower_exit: int | None = None  # the code Flower printed (`Exit Code: N`); its exit status is 1
    refused: bool = False  # `[code: 2004] Failed to activate SuperNode`
    bind: tuple[str, int, str] | None = None  # (host, port, why) of the local API uvicorn could not bind
    api_failed: bool = False
    held: list[str] = field(default_factory=list)  # the last traceback, shown only when not named in a line
    in_traceback: bool = False
    stopped: bool = False  # a stop signal was passed on

    def read(self, line: str) -> list[str]:
        """Note what `line` says; the lines to show now. A traceback is held back until a line that is
        not part of it shows it was only logged (then it is shown), or the output ends with it."""
        self.refused = self.refused or REFUSED in line
        self.api_failed = self.api_failed or _API_FAILED in line
        if (m := _EXIT_CODE.search(line)) is not None:
            self.flower_exit = int(m.group(1))
        if (m := _BIND.search(line)) is not None:
            self.bind = (m.group(1), int(m.group(2)), m.group(3).strip())
        if line.startswith(_TRACEBACK) or self.in_traceback:
            self.in_traceback = not (line[:1].strip() and not line.startswith(_TRACEBACK))
            self.held.append(line)
            return []
        if self.held and (not line.strip() or line.startswith(_CHAINED)):
            self.held.append(line)  # "During handling of the above exception…": the next one follows
            return []
        shown, self.held = [*self.held, line], []
        return shown


def _flush(lines: list[str]) -> None:
    sys.stdout.writelines(lines)
    sys.stdout.flush()


def _pass_through(stream: object, outcome: Outcome) -> None:
    for line in stream:  # type: ignore[attr-defined]
        if shown := outcome.read(line):
            _flush(shown)


def run_once(argv: list[str], env: dict[str, str]) -> Outcome:
    """Run the SuperNode, its output passed through, until the SuperNode process exits; then stop what
    it left behind. Never waits on the output pipe, which the SuperNode's children hold too."""
    outcome = Outcome()
    proc: subprocess.Popen[str] | None = None

    def forward(signum: int, _frame: object) -> None:
        outcome.stopped = True
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signum)

    reader: threading.Thread | None = None
    # the handlers first: a stop signal while the SuperNode starts (a service manager stopping the unit
    # at once) must reach it, not kill this wrapper and orphan it
    with handling(forward, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            out, stdin = subprocess.PIPE, subprocess.DEVNULL
            proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, stdin=stdin, text=True, env=env
            )
            if outcome.stopped:  # the signal came while it was being started
                proc.terminate()
            reader = threading.Thread(target=_pass_through, args=(proc.stdout, outcome), daemon=True)
            reader.start()
            outcome.rc = proc.wait()
        finally:
            if proc is not None and proc.poll() is None:  # the wrapper itself fails: the SuperNode stops
                proc.terminate()
                try:
                    proc.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            stop_leftovers()
            if reader is not None:
                reader.join(DRAIN_S)
    return outcome


def _port_line(outcome: Outcome, flags: list[str]) -> str:
    if outcome.bind is not None:
        host, port, why = outcome.bind
        if "in use" in why:
            return (
                f"port {port} is in use: another process listens on {host}:{port} (another SuperNode?); give "
                "this SuperNode its own --port (each SuperNode on a host needs one; default 9094)"
            )
        return f"the SuperNode cannot listen on {host}:{port} ({why}); give it another --port"
    given = option_value(flags, "--port") or "9094 (the default)"
    return f"the SuperNode's local API did not start on port {given}; give it another --port"


def _connection_flags(flags: list[str]) -> list[str]:
    """The flags `fl_client.check` takes, from the SuperNode's."""
    out = ["--insecure"] if "--insecure" in flags else []
    for name in ("--superlink", "--root-certificates", "--auth-supernode-private-key"):
        if (value := option_value(flags, name)) is not None:
            out += [name, value]
    return out


def _wait_flag(flags: list[str]) -> tuple[float, list[str]]:
    """`--wait S` as the first flags (seconds to keep starting a refused SuperNode), and the rest."""
    if flags[:1] != ["--wait"] or len(flags) < 2:
        return 2 * HEARTBEAT_WINDOW_S, flags
    try:
        return WAIT_S(flags[1]), flags[2:]
    except argparse.ArgumentTypeError:
        raise PowerctlError(f"--wait takes seconds from 0 to {MAX_WAIT_S:.0f}, got {flags[1]!r}") from None


def _say(text: str) -> None:
    say(f"supernode: {text}")


def run_until_started(
    command: list[str], target: Target, flags: list[str], wait_s: float, path_first: Path | None = None
) -> int:
    """Run the SuperNode, again while the cause of a refusal may pass (up to `wait_s`), else NotStarted."""
    env = child_env(command[0], path_first)
    deadline = time.monotonic() + wait_s
    while True:
        outcome = run_once(command, env)
        if outcome.rc == 0 or outcome.stopped:
            _flush(outcome.held)
            return outcome.rc
        if outcome.bind is not None or outcome.api_failed:
            raise NotStarted(_port_line(outcome, flags))
        if outcome.flower_exit != CONNECTION_ERROR and not outcome.refused:
            _flush(outcome.held)  # a failure this wrapper cannot name: Flower's own words stand
            return outcome.rc
        failed: CheckFailed | None = None
        try:
            run_checks(target, say=lambda _line: None)
        except CheckFailed as exc:  # the first thing `fl_client.check` finds wrong
            failed = exc
        # waiting helps only while the key's node may still count online
        if failed is not None and failed.cause not in ("node key in use", "node key not activated"):
            raise NotStarted(str(failed))
        why = str(failed) if failed is not None else "Flower error 2004, Failed to activate SuperNode"
        if time.monotonic() + RETRY_S > deadline:
            check = " ".join([CHECK_PROG, *_connection_flags(flags)])
            raise NotStarted(
                f"the SuperLink still refuses the SuperNode after {wait_s:.0f} s ({why}); see: {check}"
            )
        _say(
            f"refused by the SuperLink ({why}); the node of this key may still be counted online after a "
            f"crash (up to {HEARTBEAT_WINDOW_S:.0f} s): starting again in {RETRY_S:.0f} s"
        )
        time.sleep(RETRY_S)
        release_stale_node(target, _say)


@one_line_errors(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    wait_s, flags = _wait_flag(list(sys.argv[1:] if argv is None else argv))
    if flags[:1] in (["-h"], ["--help"]):
        say(__doc__)
        return 0
    target = _target(flags)  # the files it names, checked before Flower starts: one line, exit 2
    command = [installed_tool("flower-supernode"), *flags]
    check_files(target)
    release_stale_node(target, _say)
    become_subreaper()  # orphans of the SuperNode's tree come to this process, to be stopped
    try:
        with light_clientapp() as clientapp_folder:
            return run_until_started(command, target, flags, wait_s, clientapp_folder)
    except NotStarted as exc:
        say(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
