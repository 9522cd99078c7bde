"""A pin that its process cannot undo (SIGKILL, OOM, power loss) is undone by the next command; two
processes never pin one board at once."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from powerctl.devices import open_device
from powerctl.devices.jetson import open_jetson
from powerctl.pinning.freqstate import (
    KIND_PIN,
    KIND_SET,
    BoardBusyError,
    BoardRecord,
    read_record,
    write_record,
)
from powerfed.training.powerctl_cli import main
from tests.fake_boards import NANO_DEVFREQ, FakeGpu, fake_pynvml, make_nano_tree, tree_snapshot


@pytest.fixture
def nano(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_nano_tree(tmp_path / "nano")
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(root))
    return root


def _state_files() -> list[Path]:
    return sorted(Path(os.environ["POWERCTL_STATE_DIR"]).glob("*.json"))


def _powerctl(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "powerfed.training.powerctl_cli", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _wait_until_pinned(proc: subprocess.Popen[str], root: Path, before: bytes) -> None:
    min_freq = root / NANO_DEVFREQ / "min_freq"
    deadline = time.monotonic() + 600  # a loaded CI machine imports torch slowly; no timing is asserted
    while min_freq.read_bytes() == before:
        if proc.poll() is not None:
            raise AssertionError(proc.communicate())
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the process never pinned a frequency")
        time.sleep(0.05)


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


@dataclass(frozen=True)
class Crash:
    """A Nano tree and state folder as a profile killed with SIGKILL mid-way left them."""

    root: Path
    before: dict[str, bytes]
    after: dict[str, bytes]
    records: dict[str, bytes]
    pid: int


@pytest.fixture(scope="module")
def crash(tmp_path_factory: pytest.TempPathFactory) -> Crash:
    root = make_nano_tree(tmp_path_factory.mktemp("crash") / "nano")
    state = tmp_path_factory.mktemp("crash-state")
    before = tree_snapshot(root)
    out = root.parent / "killed.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "powerfed.training.powerctl_cli", "profile", "--device", "jetson",
         "--model", "cnn-tiny", "--batch-sizes", "4,8", "--steps", "500", "--quiet", "--out", str(out)],
        env=dict(os.environ, POWERCTL_SYSFS_ROOT=str(root), POWERCTL_STATE_DIR=str(state)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    _wait_until_pinned(proc, root, before[f"{NANO_DEVFREQ}/min_freq"])
    _kill(proc)
    assert not out.exists()
    records = {p.name: p.read_bytes() for p in state.glob("*.json")}
    return Crash(root, before, tree_snapshot(root), records, proc.pid)


def _as_left_by(crash: Crash, monkeypatch: pytest.MonkeyPatch) -> None:
    """Put the crashed tree and record back in place (each test restores them)."""
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(crash.root))
    for rel, data in crash.after.items():
        path = crash.root / rel
        if path.is_file() and not path.is_symlink():
            path.write_bytes(data)
    state = Path(os.environ["POWERCTL_STATE_DIR"])
    state.mkdir(parents=True, exist_ok=True)
    for name, data in crash.records.items():
        (state / name).write_bytes(data)


def test_the_killed_profile_left_the_board_pinned_and_its_record_on_disk(crash: Crash) -> None:
    assert crash.after != crash.before
    [data] = crash.records.values()
    record = json.loads(data)
    assert record["kind"] == KIND_PIN and record["pid"] == crash.pid and record["spec"] == "jetson"
    assert record["state"] == {"governor": "nvhost_podgov", "min_freq": "76800000", "max_freq": "921600000"}


@pytest.mark.parametrize(
    "next_command",
    [
        ["devices"],
        ["power", "--device", "jetson-nano"],
        ["freq", "--device", "jetson", "--restore"],
        [
            "profile",
            "--device",
            "jetson-nano",
            "--model",
            "cnn-tiny",
            "--batch-sizes",
            "4",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--quiet",
            "--out",
            "PROFILE",
        ],
    ],
    ids=["devices", "power", "freq-restore", "profile"],
)
def test_sigkill_mid_profile_is_undone_by_the_next_command(
    crash: Crash,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    next_command: list[str],
) -> None:
    _as_left_by(crash, monkeypatch)
    assert tree_snapshot(crash.root) == crash.after and len(_state_files()) == 1
    argv = [str(tmp_path / "next.json") if a == "PROFILE" else a for a in next_command]
    assert main(argv) == 0
    err = capsys.readouterr().err
    restored = [line for line in err.splitlines() if "restored jetson" in line]
    assert len(restored) == 1 and f"process {crash.pid} pinned it and died" in restored[0], err
    assert tree_snapshot(crash.root) == crash.before
    assert _state_files() == []


def test_sigkill_then_a_fresh_interpreter_restores_too(crash: Crash, monkeypatch: pytest.MonkeyPatch) -> None:
    _as_left_by(crash, monkeypatch)
    done = _powerctl("devices")
    assert done.returncode == 0 and "Traceback" not in done.stderr
    assert done.stderr.count("restored jetson") == 1
    assert tree_snapshot(crash.root) == crash.before and _state_files() == []


PINNER = """
import sys, time
from powerctl.devices import open_device
dev = open_device("jetson")
dev.pin_frequency(307200000)
print("pinned", flush=True)
time.sleep(600)
"""


def test_second_process_is_refused_while_the_first_pins_and_admitted_once_it_is_killed(
    nano: Path, tmp_path: Path
) -> None:
    before = tree_snapshot(nano)
    proc = subprocess.Popen(
        [sys.executable, "-c", PINNER], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        _wait_until_pinned(proc, nano, before[f"{NANO_DEVFREQ}/min_freq"])
        pinned_by_first = tree_snapshot(nano)
        done = _powerctl("freq", "--device", "jetson-nano", "--set", "460.8MHz")
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("powerctl: error: jetson-nano is pinned by another process")
        assert f"pid {proc.pid}" in done.stderr
        assert tree_snapshot(nano) == pinned_by_first  # untouched by the refused one: no mixed state
        refused = _powerctl("freq", "--device", "jetson", "--restore")
        assert refused.returncode == 2 and "pinned by another process" in refused.stderr
        assert tree_snapshot(nano) == pinned_by_first
    finally:
        _kill(proc)
    # the kernel dropped the dead holder's lock: the next pin first restores what it left, then pins
    done = _powerctl("freq", "--device", "jetson-nano", "--set", "460.8MHz")
    assert done.returncode == 0, done.stderr
    assert "restored jetson" in done.stderr and "pinned jetson-nano at 460.8 MHz" in done.stdout
    [record] = [read_record(json.loads(f.read_text())["key"]) for f in _state_files()]
    assert record is not None and record.kind == KIND_SET
    assert _powerctl("freq", "--device", "jetson", "--restore").returncode == 0
    assert tree_snapshot(nano) == before and _state_files() == []


def test_two_handles_in_one_process_cannot_both_pin(nano: Path) -> None:
    before = tree_snapshot(nano)
    first, second = open_jetson("jetson"), open_jetson("jetson-nano")
    assert first.physical_key() == second.physical_key()
    first.pin_frequency(307200000)
    with pytest.raises(BoardBusyError) as err:
        second.pin_frequency(460800000)
    own = f"jetson-nano is already pinned by this process (pid {os.getpid()}): one pin at a time per board"
    assert str(err.value).startswith(own) and "\n" not in str(err.value)  # not "another process"
    assert (nano / NANO_DEVFREQ / "max_freq").read_text() == "307200000\n"
    first.restore()
    with second.pinned(460800000):
        assert (nano / NANO_DEVFREQ / "max_freq").read_text() == "460800000\n"
    assert tree_snapshot(nano) == before and _state_files() == []


def test_a_pin_records_before_it_writes_and_removes_the_record_after_restore(nano: Path) -> None:
    dev = open_jetson("jetson")
    key = dev.physical_key()
    assert key is not None and read_record(key) is None
    with dev.pinned(614400000):
        record = read_record(key)
        assert record is not None and record.kind == KIND_PIN and record.pid == os.getpid()
        assert record.state == {"governor": "nvhost_podgov", "min_freq": "76800000", "max_freq": "921600000"}
    assert read_record(key) is None


def test_a_crash_on_top_of_freq_set_goes_back_to_the_set_pin_and_keeps_its_record(
    nano: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree_snapshot(nano)
    assert main(["freq", "--device", "jetson", "--set", "460.8MHz"]) == 0
    after_set = tree_snapshot(nano)
    dev = open_jetson("jetson-nano")
    dev.pin_frequency(153600000)
    dev._session._lock.close()  # what the kernel does when the process dies without restoring  # type: ignore[union-attr]
    dev._session = None
    capsys.readouterr()
    assert main(["devices"]) == 0
    assert "restored jetson (jetson-nano@" in capsys.readouterr().err
    assert tree_snapshot(nano) == after_set  # back to the --set pin, not further
    assert main(["freq", "--device", "jetson", "--restore"]) == 0
    assert tree_snapshot(nano) == before and _state_files() == []


def test_simulated_boards_pin_through_the_same_session_without_a_record() -> None:
    first, second = open_device("sim:jetson-nano"), open_device("sim:jetson-nano")
    assert first.physical_key() is None  # each handle is its own virtual board: nothing to lose
    with first.pinned(460800000), second.pinned(307200000):
        assert first.is_pinned and second.is_pinned
        assert _state_files() == []
    assert not first.is_pinned and first.snapshot()["max_freq"] == first.frequencies()[-1]


def test_an_nvml_record_left_by_a_dead_process_resets_the_locked_clocks(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    mod = fake_pynvml([FakeGpu()])
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    gpu = open_device("nvml:0")
    key = gpu.physical_key()
    gpu.close()
    assert key == "nvml-gpu-5b5a7ac0-0d38-3f0b-a1b2-000000000000"
    write_record(BoardRecord(key, "nvml:0", KIND_PIN, {"locked": None}, pid=999999))
    mod.calls.clear()
    gpu = open_device("nvml:0")
    assert [c for c in mod.calls if c[0] == "nvmlDeviceResetGpuLockedClocks"] == [
        ("nvmlDeviceResetGpuLockedClocks", 0)
    ]
    said = [(name, level) for name, level, line in caplog.record_tuples if "restored nvml:0" in line]
    assert said == [("powerctl.pinning.pinsession", logging.WARNING)] and "restored nvml:0" in str(
        gpu.recovered
    )
    assert read_record(key) is None
    gpu.close()


def test_an_nvml_pin_is_recorded_and_its_restore_resets_the_clocks(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = fake_pynvml([FakeGpu()])
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    with open_device("nvml:0") as gpu, gpu.pinned(1_395_000_000):
        key = gpu.physical_key()
        assert key is not None and read_record(key) is not None
    assert read_record(key) is None
    assert [c[0] for c in mod.calls if "LockedClocks" in c[0]] == [
        "nvmlDeviceSetGpuLockedClocks",
        "nvmlDeviceResetGpuLockedClocks",
    ]


def test_a_corrupt_record_is_one_line_and_nothing_is_written(
    nano: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree_snapshot(nano)
    key = open_jetson("jetson").physical_key()
    assert key is not None
    path = Path(os.environ["POWERCTL_STATE_DIR"]) / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"schema": "powerctl.freqstate/2", "kind": "pin"')
    assert main(["freq", "--device", "jetson", "--set", "460.8MHz"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and "not valid JSON" in err
    assert tree_snapshot(nano) == before


def test_a_client_round_reports_the_board_it_found_pinned_and_restored(
    crash: Crash, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ClientApp killed mid-round left the board pinned: the next round on that board puts it back and
    says so in its report and in the round's table, so the coordinator sees it, not only the node's log."""
    from fl_client.local_data import data_plan, load_local_data
    from fl_client.node import resolve_node
    from fl_client.round import RoundWork, run_round
    from fl_server.results import client_table, summary_lines
    from strategies.rounds import NodeInfo, RoundRecord, report_row, summarise
    from tests.fl_helpers import RUN_CONFIG, initial_state, instructions

    _as_left_by(crash, monkeypatch)
    settings = resolve_node(
        {"device": "jetson", "power-cap-w": 10.0, "partition-id": 0, "num-partitions": 3}, RUN_CONFIG
    )
    data = load_local_data(data_plan(settings, RUN_CONFIG, 64))
    instr = instructions(relation_batch_sizes=[8], relation_samples=[300.0], budget_samples=16)
    report = run_round(RoundWork(settings, instr, initial_state(), data)).report
    assert f"process {crash.pid} pinned it and died" in report.restored
    assert tree_snapshot(crash.root) == crash.before  # restored, and left as found after the round
    record = RoundRecord(
        1, [report_row(report, NodeInfo(1, settings.key, "jetson"))], [], summarise([report], [], 1)
    )
    assert report.restored in client_table(record)
    assert f"left pinned and restored: {settings.key}" in summary_lines(record)
    again = run_round(RoundWork(settings, instr, initial_state(), data)).report
    assert again.restored == ""  # nothing left to restore the second time
