"""A clock this process may not change (issue 29): the device profiles at the clock in force, the batch
size alone is chosen under the cap, the report and the tables say "not pinned", and nothing is written
to the device — on a fake Jetson tree and behind a mocked NVML that refuses to lock clocks."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from types import ModuleType

import pytest

from fl_client.node import resolve_node
from fl_server.results import client_table
from powerctl.devices import open_device
from powerctl.devices.jetson import JetsonBoard
from powerctl.devices.nvml import NvmlGpu
from powerctl.devices.unpinned import NOT_PINNED, UnpinnedDevice
from powerctl.errors import DeviceError, DevicePermissionError
from powerctl.profiling.profiler import Profiler
from powerctl.records.relation import RelationVector
from powerctl.records.workload import Workload
from powerctl.selection.joint import select
from powerfed.training.powerctl_cli import main as powerctl
from strategies.fleet import NodeConfigError
from strategies.report import ClientReport, Profiling, Training
from tests.fake_boards import NANO_DEVFREQ, NANO_FREQS, FakeGpu, fake_pynvml, make_nano_tree, tree_snapshot
from tests.test_jetson import public_state, public_tmp, unprivileged  # noqa: F401 - fixtures and helper

BATCHES = [4, 8, 16]
WORKLOAD = Workload("noop", (3, 32, 32), 1e6, 1e4, 1e5)
RELATION = RelationVector.from_samples("noop", "proxy", 0.5, {4: 900.0, 8: 1000.0, 16: 1400.0})
NO_CAP_BELOW = 1000.0
"""A cap every reading is under (the fake sensors' readings are constant)."""


def _steps(b: int):  # a training step that does nothing: the knob, not the work, is under test
    return lambda: None


def _profile(dev, order: str = "grid"):
    return Profiler(dev, WORKLOAD, _steps, samples=1000, warmup_steps=0, measure_steps=2, rate_hz=200.0).run(
        BATCHES, order=order, power_cap_w=NO_CAP_BELOW if order != "grid" else None, progress=False
    )


@pytest.fixture
def nano(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(tmp_path / "sysfs"))
    return make_nano_tree(tmp_path / "sysfs")


def _state_files() -> list[str]:
    state = Path(os.environ["POWERCTL_STATE_DIR"])
    return sorted(p.name for p in state.rglob("*")) if state.exists() else []


# --- a fake Jetson --------------------------------------------------------------------------------
@pytest.mark.parametrize("order", ["grid", "efficient", "fitted"])
def test_jetson_with_pin_false_profiles_at_the_clock_in_force_and_writes_nothing(
    nano: Path, order: str
) -> None:
    (nano / NANO_DEVFREQ / "max_freq").write_text(f"{NANO_FREQS[5]}\n")  # an operator's ceiling
    before = tree_snapshot(nano)
    with open_device("jetson", pin=False) as dev:
        assert isinstance(dev, UnpinnedDevice) and not dev.pins and isinstance(dev.inner, JetsonBoard)
        assert dev.frequencies() == [NANO_FREQS[5]] and dev.reason == "the operator's pin = false"
        profile = _profile(dev, order)
        choice = select(profile, RELATION, NO_CAP_BELOW)
    assert {p.frequency_hz for p in profile.points} == {NANO_FREQS[5]}
    assert sorted({p.batch_size for p in profile.points}) == BATCHES and profile.extra["pinned"] is False
    # the batch size alone: the least predicted time to the target at the one clock
    best = min(profile.points, key=lambda p: p.seconds_for_samples * RELATION.as_map()[p.batch_size])
    assert (choice.batch_size, choice.frequency_hz) == (best.batch_size, NANO_FREQS[5])
    assert tree_snapshot(nano) == before and _state_files() == []


def test_a_pin_at_the_clock_in_force_writes_nothing_and_any_other_is_one_line(nano: Path) -> None:
    before = tree_snapshot(nano)
    dev = open_device("jetson", pin=False)
    hz = dev.frequencies()[0]
    with dev.pinned(hz):
        assert not dev.is_pinned
    with pytest.raises(DeviceError) as caught:
        dev.pin_frequency(NANO_FREQS[0])
    assert "\n" not in str(caught.value) and f"{NOT_PINNED} (the operator's pin = false)" in str(caught.value)
    dev.close()
    assert tree_snapshot(nano) == before and _state_files() == []
    assert dev.profile_kind() == f"JetsonBoard-not-pinned-{hz}Hz/jetson-nano"
    assert open_device("jetson").profile_kind() == "JetsonBoard/jetson-nano"


def test_an_unwritable_jetson_runs_at_the_clock_in_force_when_pin_may_fall_back(
    public_tmp: Path,  # noqa: F811
    public_state: Path,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(public_tmp))
    root = make_nano_tree(public_tmp)
    for dirpath, _, _ in os.walk(root):
        Path(dirpath).chmod(0o755)
    for name in ("min_freq", "max_freq", "governor"):
        (root / NANO_DEVFREQ / name).chmod(0o444)
    before = tree_snapshot(root)
    with unprivileged():
        with pytest.raises(DevicePermissionError):  # pin=True: as before, a pin it may not make
            open_device("jetson").pin_frequency(NANO_FREQS[0])
        with open_device("jetson", pin=None) as dev:
            assert not dev.pins and "min_freq needs root" in dev.reason
            profile = _profile(dev)
    assert profile.extra["pinned"] is False and len(profile.points) == len(BATCHES)
    assert next(r.message for r in caplog.records if "clock in force" in r.message).count("\n") == 0
    assert tree_snapshot(root) == before


def test_powerctl_profile_no_pin_then_select_say_not_pinned(
    nano: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree_snapshot(nano)
    out, rel = tmp_path / "profile.json", tmp_path / "relation.json"
    argv = [
        "profile",
        "--device",
        "jetson",
        "--model",
        "cnn-tiny",
        "--batch-sizes",
        "4,8",
        "--samples",
        "500",
    ]
    assert powerctl([*argv, "--warmup", "0", "--steps", "1", "--quiet", "--no-pin", "--out", str(out)]) == 0
    assert f"at the clock in force ({NOT_PINNED})" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["pinned"] is False and {p["frequency_hz"] for p in data["points"]} == {NANO_FREQS[-1]}
    RelationVector.from_samples("cnn-tiny", "proxy", 0.5, {4: 900.0, 8: 1000.0}).save(rel)
    assert powerctl(["select", "--profile", str(out), "--relation", str(rel), "--compare"]) == 0
    printed = capsys.readouterr().out
    assert f"at the clock in force ({NOT_PINNED})" in printed and "MHz" not in printed.splitlines()[0]
    assert tree_snapshot(nano) == before and _state_files() == []


# --- a mocked NVML GPU that refuses to lock clocks -------------------------------------------------
@pytest.fixture
def refusing_nvml(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    mod = fake_pynvml(
        [FakeGpu(errors={"nvmlDeviceSetGpuLockedClocks": 4, "nvmlDeviceResetGpuLockedClocks": 4})]
    )
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def _writes(mod: ModuleType) -> list[tuple]:
    return [
        c for c in mod.calls if c[0] in ("nvmlDeviceSetGpuLockedClocks", "nvmlDeviceResetGpuLockedClocks")
    ]


def test_nvml_with_pin_false_selects_the_batch_size_and_never_touches_the_clocks(
    refusing_nvml: ModuleType,
) -> None:
    with open_device("nvml:0", pin=False) as dev:
        assert isinstance(dev.inner, NvmlGpu) and dev.frequencies() == [1_410_000_000]  # its highest clock
        assert dev.has_power_sensor and dev.read_power_w() == pytest.approx(61.234)
        profile = _profile(dev, "efficient")
        choice = select(profile, RELATION, 100.0)
        assert dev.describe()["pinned"] is False
    assert choice.frequency_hz == 1_410_000_000 and choice.batch_size in BATCHES
    assert {p.frequency_hz for p in profile.points} == {1_410_000_000} and profile.extra["pinned"] is False
    assert _writes(refusing_nvml) == []


def test_nvml_as_an_ordinary_user_falls_back_without_trying_and_says_why(
    refusing_nvml: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with open_device("nvml:0", pin=None) as dev:
        assert dev.reason == "locking GPU clocks needs root (NVML)"
        assert len(_profile(dev).points) == len(BATCHES)
    assert _writes(refusing_nvml) == []
    # asked to pin (pin=True) it tries, is refused in one line that says how to run unpinned
    with pytest.raises(DevicePermissionError, match=r"--no-pin, node config pin = false"):
        open_device("nvml:0").pin_frequency(1_410_000_000)


# --- the node's setting and the report -------------------------------------------------------------
def test_node_config_pin_is_read_and_checked() -> None:
    node = {"device": "sim:jetson-nano", "data": "synthetic-image"}
    assert resolve_node(node, {}).pin is None
    assert resolve_node({**node, "pin": False}, {}).pin is False
    with pytest.raises(NodeConfigError, match=r"'pin'.*true or false"):
        resolve_node({**node, "pin": "no"}, {})


def test_the_report_and_the_servers_table_say_not_pinned() -> None:
    report = ClientReport(
        device="nvml:0", power_cap_w=300.0, batch_size=64, frequency_hz=1_410_000_000,
        training=Training(12.0, None, 250.0, 6000, 0.6, True), profiling=Profiling(1.0), node_key="gpu-0",
        pinned=False,
    )  # fmt: skip
    back = ClientReport.from_config(report.to_config())
    assert (
        back.pinned is False
        and ClientReport.from_config(ClientReport(**{**report.__dict__, "pinned": True}).to_config()).pinned
    )
    table = client_table(types.SimpleNamespace(clients=[back.columns()], failed=[]))
    assert NOT_PINNED in table.splitlines()[2] and "1410.0" not in table


# --- the batch-size-only mode with every method's default plan --------------------------------------
UNPINNED_METHODS = ["ours", "state-of-practice", "proxy-batch"]


def _clock_in_force(spec: str) -> int:
    with open_device(spec, pin=False) as dev:
        hz = dev.clock_in_force()
    assert hz is not None
    return hz


@pytest.mark.parametrize("method", UNPINNED_METHODS)
def test_a_session_with_pin_false_and_the_default_plan_trains_at_the_clock_in_force(method: str) -> None:
    import torch

    import powerfed
    from strategies.protocol import TrainInstructions

    rel = RelationVector.from_samples("unpinned-net", "proxy", 0.5, {8: 300.0, 16: 400.0})
    plan = TrainInstructions.for_relation(rel, num_classes=2, method=method)  # profiling budget as default
    node = powerfed.NodeSettings("sim:jetson-nano", 3.0, None, 0, 1, "n0", None, pin=False)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    session = powerfed.PowerSession(
        model=net,
        make_step=lambda model: lambda x, y: None,
        example=(torch.zeros(4, 4), torch.zeros(4, dtype=torch.long)),
        train_examples=64,
        round_context=powerfed.RoundContext(node, plan),
    )
    with session:
        while session.samples < 64:
            session.step(lambda x, y: None, torch.zeros(session.batch_size, 4), None)
    report = session.report
    assert report is not None and report.pinned is False and report.method == method
    assert report.frequency_hz == _clock_in_force("sim:jetson-nano") and report.batch_size in (8, 16)


@pytest.mark.parametrize("method", UNPINNED_METHODS)
def test_the_built_in_round_with_node_config_pin_false_trains_at_the_clock_in_force(method: str) -> None:
    from fl_client.local_data import data_plan, load_local_data
    from fl_client.round import RoundWork, run_round
    from tests.fl_helpers import RUN_CONFIG, initial_state, instructions

    settings = resolve_node({"partition-id": 2, "num-partitions": 3, "pin": False}, RUN_CONFIG)
    data = load_local_data(data_plan(settings, RUN_CONFIG, 64))
    # a cap the clock in force stays under, below the state of practice's top frequency's
    instr = instructions(method=method, profiling_budget=0.1, power_cap_w=4.5)
    report = run_round(RoundWork(settings, instr, initial_state(), data, device_seed=1)).report
    assert report.pinned is False and report.frequency_hz == _clock_in_force(settings.device)
    assert report.training.samples == 64 and report.batch_size in (8, 16)
