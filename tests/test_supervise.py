"""`python -m fl_server.supervise` lets a followed log go when its SuperLink's port closes: a SuperLink
stopped with SIGTERM waits for open requests before it exits, and a followed log never ends on its own
(the end to end: tests/test_restarts.py)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from fl_server.supervise import Supervisor, refuses

REPO = Path(__file__).resolve().parents[1]


def test_refuses_tells_a_closed_port_from_a_listening_one() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        assert not refuses(address)
    assert refuses(address)  # closed: what a SuperLink's port is once SIGTERM reached it
    assert not refuses("[::1]:notaport")  # not an address: not taken for a stopped SuperLink


def test_a_followed_log_is_let_go_when_the_superlinks_port_closes() -> None:
    """`Supervisor._watch`: two refused connections in a row end the log process (standing in for
    `flwr log --stream`) and mark the SuperLink as gone; a port that listens keeps it."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        sup = Supervisor(REPO, "c", "", address=f"127.0.0.1:{port}", listen_poll_s=0.05)
        log = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        done, draining = threading.Event(), threading.Event()
        watcher = threading.Thread(target=sup._watch, args=(log, done, draining))
        watcher.start()
        time.sleep(0.5)
        assert log.poll() is None and not draining.is_set()
    log.wait(timeout=10)  # the port closed: let go
    watcher.join(timeout=10)
    assert draining.is_set() and log.returncode is not None
