"""Shared command-line behaviour: a user error is one line on stderr and exit status 2."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from powerctl.errors import PowerctlError

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
