"""Library code logs (module loggers under each package's name); the command lines and the ClientApp
show those lines on stderr in the same words. A user of the library silences or redirects them."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fl_client.app import _library_lines
from powerctl.cli.util import LIBRARY_LOGGERS
from powerctl.devices import open_device
from powerctl.devices.jetson import open_jetson
from powerctl.pinning.freqstate import KIND_PIN, BoardRecord, read_record, write_record
from powerfed.training.powerctl_cli import main
from tests.fake_boards import make_nano_tree

ROOT = Path(__file__).resolve().parents[1]

USER = """
import logging, sys
mode, said = sys.argv[1], sys.argv[2]
if mode == "silenced":
    for name in ("powerctl", "training"):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
elif mode == "redirected":
    logging.basicConfig(filename=said, format="%(name)s %(levelname)s %(message)s")

import torch
from torch import nn
from powerctl.devices import open_device
from powerctl.devices.jetson import open_jetson
from powerctl.pinning.freqstate import KIND_PIN, BoardRecord, write_record
from powerctl.profiling.profiler import Profiler
from powerctl.records.relation import RelationVector
from powerctl.selection.joint import select
from powerctl.records.workload import measure_workload

# a Jetson a dead process left pinned: opening it puts it back, which the library says
with open_jetson("jetson") as board:
    key, state = board.physical_key(), board.snapshot()
write_record(BoardRecord(key, "jetson", KIND_PIN, state, pid=999999))
open_device("jetson").close()

torch.manual_seed(0)
model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
x, y = torch.randn(2, 3, 8, 8), torch.randint(0, 10, (2,))
workload = measure_workload(model, x, y, nn.functional.cross_entropy, "linear")
opt = torch.optim.SGD(model.parameters(), lr=0.1)

def make_step(b):
    xb, yb = torch.randn(b, 3, 8, 8), torch.randint(0, 10, (b,))
    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return step

board = open_device("sim:jetson-nano")
profiler = Profiler(board, workload, make_step, samples=200, warmup_steps=0, measure_steps=1)
profile = profiler.run([4, 8], progress=False)
relation = RelationVector.from_samples("linear", "proxy", 0.8, {4: 150.0, 8: 180.0})
choice = select(profile, relation, 5.0)
assert choice.batch_size in (4, 8) and not board.is_pinned
"""


def _use_the_library(mode: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Run USER in a fresh interpreter (what a user's program sees: no pytest handlers on the root
    logger) against a fake Jetson Nano; its output and the file a redirected log goes to."""
    said = tmp_path / f"{mode}.log"
    env = {**os.environ, "POWERCTL_SYSFS_ROOT": str(make_nano_tree(tmp_path / mode))}
    env["POWERCTL_STATE_DIR"] = str(tmp_path / f"{mode}-state")
    done = subprocess.run(
        [sys.executable, "-c", USER, mode, str(said)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return done, said


def test_the_library_says_nothing_when_silenced_and_its_loggers_get_its_lines_when_redirected(
    tmp_path: Path,
) -> None:
    silenced, _ = _use_the_library("silenced", tmp_path)
    assert (silenced.stdout, silenced.stderr) == ("", "")

    redirected, said = _use_the_library("redirected", tmp_path)
    assert (redirected.stdout, redirected.stderr) == ("", "")
    lines = said.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "powerctl.pinning.pinsession WARNING powerctl: restored jetson "
    )

    # nothing configured: Python shows a library's warnings on stderr, as the line always was
    plain, _ = _use_the_library("plain", tmp_path)
    shown = plain.stderr.splitlines()
    assert plain.stdout == "" and len(shown) == 1 and shown[0].startswith("powerctl: restored jetson (")
    assert shown[0].split(")", 1)[1] == lines[0].split(")", 1)[1]  # the same words, the board's key aside


@pytest.fixture
def left_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fake Jetson Nano with the record of a dead process's pin; the record's key."""
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(make_nano_tree(tmp_path / "nano")))
    with open_jetson("jetson") as board:
        key, state = board.physical_key(), board.snapshot()
    assert key is not None
    write_record(BoardRecord(key, "jetson", KIND_PIN, state, pid=999999))
    return key


def _loggers() -> list[tuple[int, bool, int]]:
    return [(log.level, log.propagate, len(log.handlers)) for log in map(logging.getLogger, LIBRARY_LOGGERS)]


def test_the_command_line_prints_the_librarys_line_once_and_leaves_the_loggers_as_they_were(
    left_pinned: str, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    before = _loggers()
    assert main(["devices"]) == 0
    out, err = capsys.readouterr()
    assert "jetson" in out
    assert err.splitlines() == [
        f"powerctl: restored jetson ({left_pinned}) to governor=nvhost_podgov, min_freq=76800000, "
        "max_freq=921600000: process 999999 pinned it and died without restoring it"
    ]
    assert read_record(left_pinned) is None
    assert _loggers() == before
    # after the command, a library call is the library's again: logged, not printed
    write_record(BoardRecord(left_pinned, "jetson", KIND_PIN, {}, pid=999999))
    open_device("jetson").close()
    assert capsys.readouterr().err == ""
    assert [(name, level) for name, level, _ in caplog.record_tuples] == [
        ("powerctl.pinning.pinsession", logging.WARNING)
    ]


def test_the_clientapp_shows_the_librarys_lines_on_stderr(
    left_pinned: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ClientApp's Mod: what the library says while a message is handled reaches the node's
    stderr (a Ray worker's, a SuperNode's), INFO lines too, as `print` put them there."""

    def handler(msg: object, context: object) -> str:
        open_device("jetson").close()
        logging.getLogger("powerfed.training.finetune").info("checkpoint: resuming from X at 32 samples")
        return "reply"

    assert _library_lines(None, None, handler) == "reply"  # type: ignore[arg-type]
    err = capsys.readouterr().err.splitlines()
    assert (
        len(err) == 2
        and err[0].startswith("powerctl: restored jetson (")
        and err[1].startswith("checkpoint:")
    )
