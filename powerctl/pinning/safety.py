"""Restore the device on every exit path: normal end, exception, SIGINT, SIGTERM, SIGHUP, exit."""

from __future__ import annotations

import atexit
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from powerctl.procs import handling


class Restorable(Protocol):
    """What the guard needs of a device."""

    def restore(self) -> None: ...


_TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def _raise_exit(signum: int, _frame: object) -> None:
    # Turn a termination signal into an exception so that every `finally` runs.
    raise SystemExit(128 + signum)


@contextmanager
def restore_on_exit(device: Restorable) -> Iterator[None]:
    """Within the block, any way out of the process restores `device` first: SIGTERM and SIGHUP become
    SystemExit (in the main thread; elsewhere the atexit hook covers a clean exit); the handlers before are
    put back (one installed from C, which Python cannot put back, is not replaced)."""

    def hook() -> None:  # its own object: unregistering it leaves another guard's of the same device
        device.restore()

    atexit.register(hook)
    try:
        with handling(_raise_exit, *(sig for sig in _TERMINATING if signal.getsignal(sig) is not None)):
            try:
                yield
            finally:
                device.restore()
    finally:
        atexit.unregister(hook)
