"""Shared command-line behaviour: a user error is one line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import inspect
import io
import json
import logging
import re
import shutil
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

from powerctl.errors import PowerctlError, first_line, printable
from powerctl.files.mapping import (
    MAX_BATCH_SIZE,
    MAX_CAP_W,
    MAX_COUNT,
    MAX_SEED,
    Integer,
    Invalid,
    Kind,
    Number,
    bounds_text,
    distinct_ints,
    shown,
)
from powerctl.selection.capsource import POWER_CAP

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

LIBRARY_LOGGERS = ("powerctl", "strategies", "fl_server", "fl_client", "simulations", "powerfed")
"""The loggers of this project's packages: what a user silences, and what a command line shows on stderr."""


def say(*values: object, file: TextIO | None = None) -> None:
    """A command's or an app's own output, one line flushed at once (to `file`, else the stdout of the
    moment): the one place the project writes to a terminal. The library logs."""
    stream = sys.stdout if file is None else file
    stream.write(" ".join(map(str, values)) + "\n")
    stream.flush()


def say_json(data: Any) -> None:
    """`data` as indented JSON, a command's `--json` output (through `say`)."""
    say(json.dumps(data, indent=2))


def mhz(hz: int | None) -> str:
    """A frequency in Hz as a command shows it: "614.4 MHz" ("-" for none)."""
    return "-" if hz is None else f"{hz / 1e6:.1f} MHz"


class _StderrLines(logging.Handler):
    """Each record's message as is, one line on the `sys.stderr` of the moment (pytest and Flower see it)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


_shown = threading.Lock()
_showing: list[tuple[logging.Logger, int, bool]] = []
_depth = [0]
_HANDLER = _StderrLines(logging.INFO)


@contextlib.contextmanager
def library_lines_on_stderr() -> Iterator[None]:
    """Within the block, the library's log records (INFO and up) are lines on stderr in their own words,
    once; a logger a user set a level on keeps it, and when the last open block ends all are as they were."""
    with _shown:
        _depth[0] += 1
        if _depth[0] == 1:
            _showing[:] = [(log, log.level, log.propagate) for log in map(logging.getLogger, LIBRARY_LOGGERS)]
            for log, level, _ in _showing:
                log.addHandler(_HANDLER)
                log.propagate = False  # shown here, not a second time by a handler of the root logger
                if level == logging.NOTSET:
                    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        with _shown:
            _depth[0] -= 1
            if _depth[0] == 0:
                for log, level, propagate in _showing:
                    log.removeHandler(_HANDLER)
                    log.setLevel(level)
                    log.propagate = propagate
                _showing.clear()


def one_line_errors(prog: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate a `main(argv) -> int`: PowerctlError, or an error `fault_line` knows, → `prog: error: …` and
    exit 2, Ctrl-C → 130, any other keeps its traceback (a bug); the library's log shown on stderr."""

    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(*args: object, **kwargs: object) -> int:
            try:
                with library_lines_on_stderr():
                    return main(*args, **kwargs)
            except KeyboardInterrupt:
                say(f"{prog}: interrupted", file=sys.stderr)
                return EXIT_INTERRUPTED
            except Exception as exc:  # a PowerctlError or a class fault_line knows; any other is re-raised
                line = str(exc) if isinstance(exc, PowerctlError) else fault_line(exc)
                if line is None:
                    raise
                say(f"{prog}: error: {line}", file=sys.stderr)
                return EXIT_USAGE

        return run

    return wrap


_OS_HINTS = {
    errno.ENAMETOOLONG: "use a shorter name",
    **dict.fromkeys((errno.EACCES, errno.EPERM), "check its permissions or use another path"),
    errno.EISDIR: "give a file, not a folder",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.ENOENT: "check the path",
    errno.EEXIST: "it exists already; remove it or use another path",
    **dict.fromkeys((errno.ENOSPC, errno.EDQUOT), "free some space or write elsewhere"),
    errno.EROFS: "write elsewhere",
    errno.EFBIG: "write less or elsewhere",
    errno.ELOOP: "a symbolic link in the path points back at itself",
    **dict.fromkeys((errno.ENXIO, errno.ENODEV), "give a regular file"),
    errno.ETXTBSY: "it is a running program; use another path",
}
"""What to do about an OSError of the file system; an errno not listed is named with no advice."""

# a write's errors with no file name that are still the machine's, not the program's
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EIO})
# a ValueError that is a number beyond a library's range; torch's for a number its tensors cannot hold
_OUT_OF_RANGE = re.compile(r"out of range|too large|overflow|exceeds the limit|too many digits", re.I)
_TORCH_OVERFLOW = re.compile(r"without overflow|overflow when unpacking", re.I)

_NO_MEMORY = re.compile(r"can't allocate memory|out of memory|not enough memory|failed to allocate", re.I)
_PARSERS = re.compile(r"[/\\](json|tomllib|yaml)[/\\]")  # a RecursionError there: an input nested too deeply


def fault_line(exc: BaseException) -> str | None:
    """The one line for an exception a check did not catch but a hostile input can reach; None for a bug."""
    frames = [frame for frame, _ in traceback.walk_tb(exc.__traceback__)]  # the innermost last
    if isinstance(exc, MemoryError) or (isinstance(exc, RuntimeError) and _NO_MEMORY.search(str(exc))):
        detail = "" if isinstance(exc, MemoryError) else f" ({first_line(exc)})"
        return f"out of memory{detail}: ask for less (smaller model options, batch size, samples or limit)"
    if isinstance(exc, UnicodeDecodeError):  # named after the innermost file object open where it failed
        files = (v for frame in reversed(frames) for v in frame.f_locals.values() if isinstance(v, io.IOBase))
        name = next((n for v in files if isinstance(n := getattr(v, "name", None), str)), None)
        what = f"{printable(name)}: is not" if name else "an input file is not"
        return f"{what} UTF-8 text ({exc.reason} at byte {exc.start}); give a text file"
    if isinstance(exc, OSError):  # ``PATH: File name too long; use a shorter name``
        reason = exc.strerror or first_line(exc)
        hint = _OS_HINTS.get(exc.errno or 0)
        tail = f"{reason}; {hint}" if hint else reason
        if exc.filename is not None:
            where = printable(str(exc.filename))
            if exc.filename2 is not None:
                where += f" → {printable(str(exc.filename2))}"
            return f"{where}: {tail}"
        return tail if exc.errno in _STORAGE_ERRNOS else None
    if isinstance(exc, RecursionError) and frames and _PARSERS.search(frames[-1].f_code.co_filename):
        return "an input file is nested too deeply to read; give a flatter file"
    if (
        isinstance(exc, OverflowError)
        or (isinstance(exc, ValueError) and _OUT_OF_RANGE.search(str(exc)))
        or (isinstance(exc, RuntimeError) and _TORCH_OVERFLOW.search(str(exc)))
    ):
        return f"a number is out of range ({first_line(exc)}); use a smaller value"
    return None


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is ONE line (what is wrong, where to look) and exit status 2; a value
    that starts with a minus and a digit (``--warmup -3``) is the flag's value, so its check says why."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # `--samples=--`: argparse drops the "--" and hands the flag an empty list, not a value
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            raise argparse.ArgumentError(action, "expected a value, got '--'")
        return super()._get_values(action, arg_strings)


def kind_type(kind: Kind, name: str) -> Callable[[str], Any]:
    """A mapping `Kind` as a flag type, refusing in argparse's words; text is read as the kind's number
    type first (and a refused number is named as given)."""
    number = kind.python_type in (int, float)

    def parse(text: str) -> Any:
        value: Any = text
        if number:
            with contextlib.suppress(ValueError, OverflowError):  # the kind says what it must be
                value = kind.python_type(text)
        try:
            return kind(value)
        except Invalid as exc:
            said = f"must be {kind.expected}, got {shown(text)}" if number else str(exc)
            raise argparse.ArgumentTypeError(said.replace("must be", "expected", 1)) from None

    parse.__name__ = name
    return parse


class Bounded:
    """A numeric flag type with a range (a mapping `Integer` or `Number`): a value outside it is argparse's
    one line in the kind's words, and `range` (the bounds in words) goes into the flag's help."""

    def __init__(self, kind: Integer | Number) -> None:
        self.kind, self.range, self.parse = kind, bounds_text(kind), kind_type(kind, "number")

    def __call__(self, text: str) -> Any:
        return self.parse(text)

    def add(self, parser: Any, flag: str, text: str, **kwargs: Any) -> None:
        """Flag `flag` of this type on `parser`, its help `text` with the range ("rate (default 50)" →
        "rate (default 50; in (0, 1000])")."""
        text = f"{text[:-1]}; {self.range})" if text.endswith(")") else f"{text} ({self.range})"
        parser.add_argument(flag, type=self, help=text, **kwargs)


def add_command(
    sub: Any, name: str, func: Callable[[argparse.Namespace], int], **kwargs: Any
) -> argparse.ArgumentParser:
    """Subcommand `name`, run as `func(args)`: its docstring's first paragraph its help, the rest its text."""
    short, _, long = inspect.cleandoc(func.__doc__ or "").partition("\n\n")
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=" ".join(short.split()), description=long or None, **kwargs
    )
    parser.set_defaults(func=func)
    return parser


def run_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None, **extra: Any) -> int:
    """Parse `argv`, set `extra` on the args, run `args.func(args)`; --help, a bad flag: argparse's status."""
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:
        return int(done.code or 0)
    vars(args).update(extra)
    return int(args.func(args))


def bounded_int(minimum: int, maximum: int) -> Bounded:
    """A flag type: an integer in [minimum, maximum]."""
    return Bounded(Integer(minimum, maximum))


def bounded_float(minimum: float, maximum: float, *, above: bool = True) -> Bounded:
    """A flag type: a finite number in (minimum, maximum] (`above=False`: [minimum, maximum])."""
    return Bounded(Number(minimum, maximum, above=above))


positive_int = bounded_int(1, MAX_COUNT)
seed = bounded_int(0, MAX_SEED)
non_negative_int = bounded_int(0, MAX_COUNT)
positive_float = bounded_float(0.0, float(MAX_COUNT))


def key_value(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` (a repeatable `--set`): VALUE read as JSON, else kept as text."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(raw)
    except json.JSONDecodeError:
        return key, raw


_POWER_CAP = kind_type(POWER_CAP, "power_cap")


def power_cap(text: str) -> float | None:
    """`--power-cap W` (none: no cap): the one cap parser (`POWER_CAP`) as a flag type; an empty value is
    refused (an unset variable, not a wish for no cap)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty; give watts or leave the flag out")
    return _POWER_CAP(text)


power_cap_w = kind_type(Number(0.0, MAX_CAP_W, above=True, unit="watts"), "power_cap_w")
"""`--power-cap W` where a cap must be given (none makes no sense there)."""
accuracy = kind_type(Number(0.0, 1.0, above=True), "accuracy")
batch_sizes = kind_type(distinct_ints(1, "4,8,16", maximum=MAX_BATCH_SIZE), "batch_sizes")
tcp_port = kind_type(Integer(1, 65535), "tcp_port")


def installed_tool(name: str) -> str:
    """An executable installed beside this interpreter, else the one on PATH (a PowerctlError if none)."""
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if found is None:
        raise PowerctlError(f"{name} is not installed here: install this project (pip install -e .)")
    return found
