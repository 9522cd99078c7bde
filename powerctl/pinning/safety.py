"""Restore the device on every exit path: normal end, exception, SIGINT, SIGTERM, SIGHUP, exit."""

from __future__ import annotations

import atexit
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Restorable(Protocol):
    """What the guard needs of a device: a `restore` that puts its state back, a no-op when nothing is
    pinned (`powerctl.devices.Device`). A Protocol, so that this module knows nothing of devices."""

    def restore(self) -> None: ...


_TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def _raise_exit(signum: int, _frame: object) -> None:
    # Turn a termination signal into an exception so that every `finally` runs.
    raise SystemExit(128 + signum)


@contextmanager
def restore_on_exit(device: Restorable) -> Iterator[None]:
    """Within the block, any way out of the process restores `device` first.

    SIGINT already raises KeyboardInterrupt; SIGTERM and SIGHUP are turned into SystemExit
    (only possible in the main thread; elsewhere the atexit hook still covers a clean exit).
    The handlers in force before are put back on every way out, even one while they are installed; a
    handler Python could not put back (installed from C: `signal.getsignal` gives None) is not replaced.
    """
    previous: dict[signal.Signals, object] = {}

    def hook() -> None:  # its own object: unregistering it leaves another guard's of the same device
        device.restore()

    atexit.register(hook)
    try:
        if threading.current_thread() is threading.main_thread():
            for sig in _TERMINATING:
                if signal.getsignal(sig) is not None:
                    previous[sig] = signal.signal(sig, _raise_exit)
        yield
    finally:
        try:
            device.restore()
        finally:
            atexit.unregister(hook)
            for sig, handler in previous.items():
                signal.signal(sig, handler)  # type: ignore[arg-type]
