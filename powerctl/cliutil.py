"""Shared command-line behaviour: a user error is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from powerctl.capsource import cap_watts
from powerctl.errors import PowerctlError
from powerctl.mapping import Invalid, Kind

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def one_line_errors(prog: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate a `main(argv) -> int`: PowerctlError → `prog: error: …` and exit 2, Ctrl-C → 130.

    Any device pinned inside `main` is restored by its own context manager before we get here.
    """

    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(*args: object, **kwargs: object) -> int:
            try:
                return main(*args, **kwargs)
            except PowerctlError as exc:
                print(f"{prog}: error: {exc}", file=sys.stderr)
                return EXIT_USAGE
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr)
                return EXIT_INTERRUPTED

        return run

    return wrap


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is ONE line (what is wrong, where to look) and exit status 2.

    A value that starts with a minus and a digit (``--set -5MHz``, ``--warmup -3``) is taken as the
    flag's value, so the user sees what is wrong with it rather than "expected one argument".
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def tcp_port(text: str) -> int:
    """A TCP port number, 1 to 65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port from 1 to 65535, got {text!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port from 1 to 65535, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer ≥ 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _refused(exc: Invalid) -> argparse.ArgumentTypeError:
    """A kind's refusal ("must be …, got …") in argparse's words ("expected …, got …")."""
    return argparse.ArgumentTypeError(str(exc).replace("must be", "expected", 1))


def kind_type(kind: Kind, name: str) -> Callable[[str], Any]:
    """A `powerctl.mapping` kind as a flag type: the text is read as the kind's number type first (a
    flag is text, a config value already typed), then checked by the kind; `name` is how argparse
    names the type."""

    def parse(text: str) -> Any:
        value: Any = text
        if kind.python_type in (int, float):
            with contextlib.suppress(ValueError):  # the kind says what it must be
                value = kind.python_type(text)
        try:
            return kind(value)
        except Invalid as exc:
            raise _refused(exc) from None

    parse.__name__ = name
    return parse


def power_cap(text: str) -> float | None:
    """`--power-cap W` (none: no cap): the one cap parser (`powerctl.capsource.cap_watts`) as a flag type."""
    try:
        return cap_watts(text)
    except Invalid as exc:
        raise _refused(exc) from None


def power_cap_w(text: str) -> float:
    """`--power-cap W` where a cap must be given (a number of watts: none makes no sense there)."""
    cap = power_cap(text)
    if cap is None:
        raise argparse.ArgumentTypeError(f"expected a number of watts > 0, got {text!r}")
    return cap


def accuracy(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"expected an accuracy in (0, 1], got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.replace(" ", "").split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


MAX_BATCH_SIZE = 65_536
"""The largest batch size a command takes: far above what an edge GPU holds (the paper's largest is
128), low enough that a typo (100000000) is one line and not an out-of-memory skip of every size."""


def batch_sizes(text: str) -> list[int]:
    values = int_list(text)
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"batch sizes must be positive, got {text!r}")
    if any(v > MAX_BATCH_SIZE for v in values):
        raise argparse.ArgumentTypeError(f"batch sizes must be at most {MAX_BATCH_SIZE}, got {text!r}")
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"batch sizes must be distinct, got {text!r}")
    return values


def installed_tool(name: str) -> str:
    """An executable installed beside this interpreter (the venv's `bin`, where pip puts Flower's
    commands), else the one on PATH; a PowerctlError saying how to get it when there is none."""
    import shutil
    from pathlib import Path

    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise PowerctlError(f"{name} is not installed here: install this project (pip install -e .)")
    return found
