"""`python -m fl_client.supernode [flower-supernode flags]`: a SuperNode that starts again after a crash.

Flower 1.41 keeps a SuperNode's registration online for up to 2 × its 30 s heartbeat after the
SuperNode dies without saying goodbye (SIGKILL, OOM kill, power loss); a SuperNode with the same key
started in that window is refused ("Exit Code: 305 … [code: 2004] Failed to activate SuperNode") and
exits (docs/deployment.md, "Restarts"). This wrapper runs `flower-supernode` with the flags given,
unchanged, after two things:

1. with a node key, it asks the SuperLink (Control API, as `flwr supernode ls`) whether this key's node
   is still counted online; if so it releases it, signed with the key (`fl_client.check`);
2. if the SuperNode is refused all the same (no Control API here, say), it waits and starts it again,
   one line each time, until `--wait` seconds have passed; a key the SuperLink does not know at all is
   one line and exit status 1 at once (waiting would not help).

SIGINT/SIGTERM/SIGHUP are passed on to the SuperNode (which then restores its board and says goodbye to
the SuperLink); the exit status is the SuperNode's.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from fl_client.check import HEARTBEAT_WINDOW_S, CheckFailed, Target, parse_address, release_stale_node
from powerctl.cliutil import installed_tool, one_line_errors
from powerctl.errors import PowerctlError

PROG = "python -m fl_client.supernode"
REFUSED = "Failed to activate SuperNode"
RETRY_S = 10.0


def _target(flags: list[str]) -> Target | None:
    """The connection part of the SuperNode's own flags (None without --superlink: Flower's default)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--superlink")
    p.add_argument("--insecure", action="store_true")
    p.add_argument("--root-certificates", type=Path)
    p.add_argument("--auth-supernode-private-key", type=Path)
    known, _ = p.parse_known_args(flags)
    if known.superlink is None:
        return None
    host, port = parse_address(known.superlink)
    return Target(host, port, known.insecure, known.root_certificates, known.auth_supernode_private_key)


def run_once(argv: list[str]) -> tuple[int, bool]:
    """Run the SuperNode, its output passed through; (exit status, whether it was refused activation)."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True
    )

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    refused = False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            refused = refused or REFUSED in line
            sys.stdout.write(line)
            sys.stdout.flush()
        rc = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return rc, refused


@one_line_errors(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    flags = list(sys.argv[1:] if argv is None else argv)
    wait_s = 2 * HEARTBEAT_WINDOW_S
    if flags[:1] == ["--wait"] and len(flags) > 1:
        try:
            wait_s = float(flags[1])
        except ValueError:
            print(f"{PROG}: error: --wait takes seconds, got {flags[1]!r}", file=sys.stderr)
            return 2
        flags = flags[2:]
    if flags[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    try:
        target = _target(flags)
        command = [installed_tool("flower-supernode"), *flags]
        if target is not None and target.node_key is not None:
            release_stale_node(target, lambda text: print(f"supernode: {text}", flush=True))
    except PowerctlError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    deadline = time.monotonic() + wait_s
    while True:
        rc, refused = run_once(command)
        if not refused or rc == 0:
            return rc
        if target is not None and target.node_key is not None:
            try:
                from fl_client.check import check_node_key

                check_node_key(target)
            except CheckFailed as failed:
                if failed.cause == "unregistered node key":
                    print(f"supernode: {failed}", flush=True)
                    return 1
            except PowerctlError:
                pass
        if time.monotonic() + RETRY_S > deadline:
            print(
                f"supernode: still refused after {wait_s:.0f} s: check the key's registration "
                f"(python -m fl_client.check {' '.join(_connection_flags(flags))})",
                flush=True,
            )
            return rc
        print(
            f"supernode: refused by the SuperLink (this key's node is still counted online after a crash, up "
            f"to {HEARTBEAT_WINDOW_S:.0f} s); starting again in {RETRY_S:.0f} s",
            flush=True,
        )
        time.sleep(RETRY_S)


def _connection_flags(flags: list[str]) -> list[str]:
    """The flags `fl_client.check` takes, from the SuperNode's."""
    out, keep = [], {"--superlink", "--root-certificates", "--auth-supernode-private-key"}
    for i, flag in enumerate(flags):
        if flag == "--insecure":
            out.append(flag)
        elif flag in keep and i + 1 < len(flags):
            out += [flag, flags[i + 1]]
    return out


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
