"""Errors a user can act on. Each message is one line: what is wrong and what to do."""

import re

ANSI = re.compile(r"\x1b\[[0-9;]*m")
"""The colour codes in a child process's output (Flower's log lines), stripped where its words are quoted."""


class PowerctlError(Exception):
    """Base of every error the command line turns into one line and exit status 2."""


class DeviceError(PowerctlError):
    """The device is missing, unknown, or refused an operation."""


class DevicePermissionError(DeviceError):
    """Writing a knob needs privileges the process does not have."""


class DeviceOutOfMemory(DeviceError):
    """A batch does not fit in the device's memory; the profiler skips such batch sizes."""


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` says a batch did not fit: ours, torch's `OutOfMemoryError`, or "out of memory" text."""
    named = isinstance(exc, DeviceOutOfMemory) or type(exc).__name__ == "OutOfMemoryError"
    return named or "out of memory" in str(exc).lower()


class FileFormatError(PowerctlError):
    """A profile/relation/config file is malformed or inconsistent."""


class InfeasibleCapError(PowerctlError):
    """No profiled (batch size, frequency) pair stays under the power cap."""


class ArgumentError(PowerctlError, ValueError):
    """A Python caller's unusable argument (`except ValueError` catches it): one line naming it, its value
    and what is allowed."""


def printable(text: str, limit: int = 160) -> str:
    """`text` on one line (control characters escaped) and at most `limit` characters (the middle cut)."""
    one = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return one if len(one) <= limit else f"{one[: limit // 2]}…{one[-(limit // 2) + 1 :]}"


def first_line(exc: BaseException) -> str:
    """An exception's first line, printable and bounded: what a one-line error quotes of another library's."""
    return printable((str(exc).strip().splitlines() or [type(exc).__name__])[0])
