"""The safety net under every command's checks (issue 28): `powerctl.cli.util.one_line_errors` turns the
faults a hostile input can still reach (a path the file system refuses, a file that is not text, a number
beyond a library's range, no memory, an input nested too deeply) into one line naming the file and exit
status 2; a bug keeps its traceback; and every entry point the project installs or documents is wrapped."""

from __future__ import annotations

import datetime
import errno
import importlib
import json
import os
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from powerctl.cli.util import EXIT_INTERRUPTED, EXIT_USAGE, fault_line, one_line_errors
from powerfed.training.powerctl_cli import main as powerctl_main

ROOT = Path(__file__).resolve().parents[1]

ENTRY_POINTS = {
    "powerctl": "powerfed.training.powerctl_cli:main",
    "fl-server": "fl_server.cli:main",
    "python -m powerctl": "powerctl.cli.commands:main",
    "python -m fl_server": "fl_server.cli:main",
    "python -m fl_server.certs": "fl_server.certs:main",
    "python -m fl_server.supervise": "fl_server.supervise:main",
    "python -m fl_server.shipped": "fl_server.shipped:main",
    "python -m fl_client.check": "fl_client.check:main",
    "python -m fl_client.supernode": "fl_client.supernode:main",
    "python -m simulations": "simulations.__main__:main",
    "python -m powerfed.training.powerctl_cli": "powerfed.training.powerctl_cli:main",
}
"""Every command a user runs, and the function it runs (the console scripts of pyproject.toml, and every
`python -m X` the README and docs/ name)."""


def _run(fault: Callable[[], object]) -> Callable[[], int]:
    @one_line_errors("prog")
    def main() -> int:
        fault()
        return 0

    return main


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("prog: error: "), err
    return err.removeprefix("prog: error: ").rstrip("\n")


def _raise(exc: BaseException) -> Callable[[], object]:
    def fault() -> object:
        raise exc

    return fault


@pytest.mark.parametrize(
    ("fault", "line"),
    [
        (
            lambda: Path("n" * 300).read_text(),
            re.escape("n" * 80) + "…" + "n+: File name too long; use a shorter name",
        ),
        (lambda: Path("/").read_text(), "/: Is a directory; give a file, not a folder"),
        (
            lambda: Path("/no/such/file").read_text(),
            "/no/such/file: No such file or directory; check the path",
        ),
        (
            _raise(PermissionError(errno.EACCES, "Permission denied", "/etc/shadow")),
            "/etc/shadow: Permission denied; check its permissions or use another path",
        ),
        (
            _raise(OSError(errno.ENOSPC, "No space left on device")),
            "No space left on device; free some space",
        ),
        (lambda: os.rename("/no/such", "/tmp/x"), "/no/such → /tmp/x: No such file or directory"),
        (lambda: Path("a\nb").read_text(), r"a\\nb: No such file or directory"),  # still one line
        (
            lambda: datetime.datetime.fromtimestamp(1e20),
            r"a number is out of range \(.*\); use a smaller value",
        ),
        (lambda: datetime.date.today() + datetime.timedelta(days=10**9), "a number is out of range"),
        (lambda: datetime.date(10**5, 1, 1), r"a number is out of range \(year 100000 is out of range\)"),
        (lambda: int("9" * 5000), r"a number is out of range \(Exceeds the limit"),
        (lambda: float(10**400), "a number is out of range"),
        (
            _raise(RuntimeError("value cannot be converted to type float without overflow")),
            r"a number is out of range \(value cannot be converted",
        ),
        (_raise(MemoryError()), r"out of memory: ask for less \(smaller model options, batch size"),
        (
            _raise(
                RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 7e11 bytes")
            ),
            "out of memory \\(DefaultCPUAllocator: can't allocate memory",
        ),
        (
            lambda: json.loads("[" * 100_000),
            "an input file is nested too deeply to read; give a flatter file",
        ),
        (lambda: tomllib.loads("a = " + "[" * 100_000), "an input file is nested too deeply"),
    ],
)
def test_a_fault_of_the_machine_or_a_range_is_one_line(
    capsys: pytest.CaptureFixture[str], fault: Callable[[], object], line: str
) -> None:
    assert _run(fault)() == EXIT_USAGE
    assert re.match(line, _one_line(capsys)), line


def test_a_file_that_is_not_text_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "config.toml"
    binary.write_bytes(b"\xff\xfe\x00\x01 not text")
    assert _run(binary.read_text)() == EXIT_USAGE
    assert (
        _one_line(capsys) == f"{binary}: is not UTF-8 text (invalid start byte at byte 0); give a text file"
    )

    def decoded_elsewhere() -> object:
        return binary.read_bytes().decode()

    assert _run(decoded_elsewhere)() == EXIT_USAGE  # no file open where it failed: still one line
    assert _one_line(capsys).startswith("an input file is not UTF-8 text")


@pytest.mark.parametrize(
    "bug",
    [
        _raise(KeyError("x")),
        _raise(TypeError("unsupported operand")),
        _raise(ValueError("not enough values to unpack")),
        _raise(RuntimeError("a bug")),
        _raise(AssertionError("an invariant")),
        _raise(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer")),  # no file: not the net's
        _raise(RecursionError("maximum recursion depth exceeded")),  # not in a parser: ours
    ],
)
def test_a_bug_keeps_its_traceback(capsys: pytest.CaptureFixture[str], bug: Callable[[], object]) -> None:
    with pytest.raises(BaseException) as raised:
        _run(bug)()
    assert fault_line(raised.value) is None
    assert capsys.readouterr().err == ""


def test_ctrl_c_is_interrupted_not_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(_raise(KeyboardInterrupt()))() == EXIT_INTERRUPTED
    assert capsys.readouterr().err == "prog: interrupted\n"
    with pytest.raises(SystemExit):  # sys.exit inside a command is its own business
        _run(_raise(SystemExit(3)))()


def test_a_real_command_reaches_the_net_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`powerctl fake-board` with a folder name the file system refuses: the net, not a traceback."""
    name = "b" * 300
    monkeypatch.chdir(tmp_path)
    assert powerctl_main(["fake-board", name]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("powerctl: error: ") and "Traceback" not in err, err
    assert "bbbbbbbb" in err and ("File name too long" in err or "255" in err), err
    assert list(tmp_path.iterdir()) == []


def _documented_modules() -> set[str]:
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = set()
    for path in texts:
        found |= set(re.findall(r"python3? -m ([a-z_][a-z0-9_.]*)", path.read_text(encoding="utf-8")))
    return found - {"pip", "pytest", "venv"}


def test_the_list_of_entry_points_is_every_one_installed_or_documented() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    for name, target in scripts.items():
        assert ENTRY_POINTS.get(name) == target, f"console script {name} = {target} is not in ENTRY_POINTS"
    for module in _documented_modules():
        assert f"python -m {module}" in ENTRY_POINTS, f"docs name python -m {module}: add it to ENTRY_POINTS"


@pytest.mark.parametrize("command", sorted(ENTRY_POINTS))
def test_every_entry_point_is_wrapped_by_one_line_errors(command: str) -> None:
    module, _, attr = ENTRY_POINTS[command].partition(":")
    main = getattr(importlib.import_module(module), attr)
    net = one_line_errors("x")(lambda: 0)
    assert getattr(main, "__code__", None) is net.__code__, f"{command}: {module}.{attr} is not wrapped"
