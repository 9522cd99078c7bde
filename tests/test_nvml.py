"""The NVML backend against a fake `pynvml` (NVML mocked at its boundary), and device detection."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

from powerctl.devices import detect_devices, open_device
from powerctl.devices.nvml import NvmlGpu, open_nvml
from powerctl.devices.unpinned import UnpinnedDevice
from powerctl.errors import DeviceError, DevicePermissionError
from powerctl.profiling.profiler import Profiler
from powerctl.records.profile import Profile
from powerctl.records.workload import Workload
from tests.fake_boards import FakeGpu, fake_pynvml, make_nano_tree

NO_PERMISSION, NOT_SUPPORTED = 4, 3


def install(monkeypatch: pytest.MonkeyPatch, *gpus: FakeGpu, init_error: int | None = None) -> ModuleType:
    mod = fake_pynvml(list(gpus), init_error=init_error)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    return mod


def named(mod: ModuleType, fn: str) -> list[tuple]:
    return [c for c in mod.calls if c[0] == fn]


@pytest.fixture
def nvml(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    return install(monkeypatch, FakeGpu())


def test_open_reads_name_table_and_sensors(nvml: ModuleType) -> None:
    gpu = open_device("nvml:0")
    assert isinstance(gpu, NvmlGpu)
    assert (gpu.spec, gpu.board, gpu.name) == (
        "nvml:0",
        "nvml-nvidia-a100-sxm4-80gb",
        "NVIDIA A100-SXM4-80GB",
    )
    assert gpu.frequencies() == [mhz * 1_000_000 for mhz in (210, 225, 240, 1350, 1365, 1380, 1395, 1410)]
    assert gpu.current_frequency() == 1_410_000_000
    assert named(nvml, "nvmlDeviceGetClockInfo") == [("nvmlDeviceGetClockInfo", 0, nvml.NVML_CLOCK_GRAPHICS)]
    assert gpu.has_power_sensor
    assert gpu.read_power_w() == pytest.approx(61.234)
    assert gpu.rails() == pytest.approx({"board": 61.234})
    assert gpu.memory_bytes() == 85899345920
    info = gpu.describe()
    assert info["rails"] == ["board"] and info["name"] == "NVIDIA A100-SXM4-80GB" and info["index"] == 0


def test_table_is_the_graphics_clocks_at_the_highest_memory_clock(monkeypatch) -> None:
    mod = install(
        monkeypatch,
        FakeGpu(
            name=b"Tesla T4",  # older nvidia-ml-py returns bytes
            memory_clocks_mhz=[405, 5001],
            graphics_clocks_mhz={405: [300, 405], 5001: [1590, 300, 585, 1590]},
        ),
    )
    gpu = open_nvml(0)
    assert gpu.board == "nvml-tesla-t4"
    assert gpu.frequencies() == [300_000_000, 585_000_000, 1_590_000_000]
    assert named(mod, "nvmlDeviceGetSupportedGraphicsClocks") == [
        ("nvmlDeviceGetSupportedGraphicsClocks", 0, 5001)
    ]


def test_pin_locks_both_ends_and_restore_resets(nvml: ModuleType) -> None:
    gpu = open_nvml(0)
    gpu.pin_frequency(1_365_000_000)
    gpu.pin_frequency(225_000_000)
    assert named(nvml, "nvmlDeviceSetGpuLockedClocks") == [
        ("nvmlDeviceSetGpuLockedClocks", 0, 1365, 1365),
        ("nvmlDeviceSetGpuLockedClocks", 0, 225, 225),
    ]
    assert gpu.snapshot() == {"locked": None}
    assert named(nvml, "nvmlDeviceResetGpuLockedClocks") == []
    gpu.restore()
    gpu.restore()  # nothing pinned any more: no second reset
    assert named(nvml, "nvmlDeviceResetGpuLockedClocks") == [("nvmlDeviceResetGpuLockedClocks", 0)]


def test_pin_outside_the_table_locks_nothing(nvml: ModuleType) -> None:
    with pytest.raises(DeviceError, match="not a frequency of nvml:0"):
        open_nvml(0).pin_frequency(1_000_000_000)
    assert named(nvml, "nvmlDeviceSetGpuLockedClocks") == []


def test_exception_inside_pinned_resets(nvml: ModuleType) -> None:
    gpu = open_nvml(0)
    with pytest.raises(ValueError), gpu.pinned(1_410_000_000):
        raise ValueError("x")
    assert [c[0] for c in nvml.calls if "Locked" in c[0]] == [
        "nvmlDeviceSetGpuLockedClocks",
        "nvmlDeviceResetGpuLockedClocks",
    ]


def test_sigterm_inside_pinned_resets(nvml: ModuleType) -> None:
    gpu = open_nvml(0)
    with pytest.raises(SystemExit), gpu.pinned(240_000_000):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert len(named(nvml, "nvmlDeviceResetGpuLockedClocks")) == 1


def test_lock_without_permission_is_one_line_about_root(monkeypatch) -> None:
    install(monkeypatch, FakeGpu(errors={"nvmlDeviceSetGpuLockedClocks": NO_PERMISSION}))
    with pytest.raises(DevicePermissionError) as err:
        open_nvml(0).pin_frequency(1_410_000_000)
    msg = str(err.value)
    assert msg.startswith("locking GPU clocks needs root") and "sudo" in msg and "\n" not in msg


def test_reset_without_permission_is_a_permission_error(monkeypatch) -> None:
    install(monkeypatch, FakeGpu(errors={"nvmlDeviceResetGpuLockedClocks": NO_PERMISSION}))
    gpu = open_nvml(0)
    gpu.pin_frequency(1_410_000_000)
    with pytest.raises(DevicePermissionError, match="resetting locked GPU clocks needs root"):
        gpu.restore()


def test_lock_not_supported_is_a_device_error(monkeypatch) -> None:
    install(monkeypatch, FakeGpu(errors={"nvmlDeviceSetGpuLockedClocks": NOT_SUPPORTED}))
    with pytest.raises(DeviceError) as err:
        open_nvml(0).pin_frequency(1_410_000_000)
    assert not isinstance(err.value, DevicePermissionError)
    assert "does not support locking GPU clocks" in str(err.value)


def test_gpu_without_clock_table_or_power_sensor(monkeypatch) -> None:
    install(
        monkeypatch,
        FakeGpu(errors={"nvmlDeviceGetSupportedMemoryClocks": NOT_SUPPORTED, "nvmlDeviceGetPowerUsage": 3}),
    )
    gpu = open_nvml(0)
    assert gpu.frequencies() == [] and not gpu.has_power_sensor and gpu.rails() == {}
    with pytest.raises(DeviceError, match="no GPU frequency knob"):
        gpu.pin_frequency(1_410_000_000)
    with pytest.raises(DeviceError, match="no power sensor"):
        gpu.read_power_w()


def test_index_out_of_range_names_the_count_and_releases_nvml(monkeypatch) -> None:
    mod = install(monkeypatch, FakeGpu(), FakeGpu())
    with pytest.raises(DeviceError, match=r"there are 2 NVIDIA GPUs here \(nvml:0 … nvml:1\)"):
        open_device("nvml:2")
    assert mod.state["init"] == 0
    assert open_device("nvml:1").spec == "nvml:1"


def test_no_gpu_at_all(monkeypatch) -> None:
    install(monkeypatch)
    with pytest.raises(DeviceError, match="NVML found no NVIDIA GPU"):
        open_nvml(0)


def test_missing_library_is_one_line(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml → ImportError
    with pytest.raises(DeviceError, match=r"^NVML is not available \(no NVIDIA driver\?\): "):
        open_nvml(0)


def test_missing_driver_is_one_line(monkeypatch) -> None:
    install(monkeypatch, init_error=12)
    with pytest.raises(DeviceError) as err:
        open_nvml(0)
    assert str(err.value) == "NVML is not available (no NVIDIA driver?): NVML Shared Library Not Found"


def test_close_resets_and_releases_nvml_once(nvml: ModuleType) -> None:
    with open_nvml(0) as gpu:
        assert nvml.state["init"] == 1
        gpu.pin_frequency(1_380_000_000)
    gpu.close()
    assert nvml.state["init"] == 0
    assert len(named(nvml, "nvmlDeviceResetGpuLockedClocks")) == 1


# --- detection --------------------------------------------------------------------------------


def _sim_specs() -> list[str]:
    try:
        from powerctl.devices.simulated import SIM_BOARDS
    except ImportError:
        return []
    return [f"sim:{b}" for b in SIM_BOARDS]


def test_detect_on_a_plain_machine_lists_host_and_simulated_boards(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(tmp_path))
    monkeypatch.setitem(sys.modules, "pynvml", None)
    found = detect_devices()
    assert [d["spec"] for d in found] == ["host", *_sim_specs()]
    assert found[0]["kind"] == "host" and all(d["kind"] == "sim" for d in found[1:])


def test_detect_lists_the_jetson_and_every_nvml_gpu(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(make_nano_tree(tmp_path)))
    mod = install(monkeypatch, FakeGpu(), FakeGpu(name="NVIDIA H100 80GB HBM3"))
    found = detect_devices()
    assert [d["spec"] for d in found] == ["jetson", "nvml:0", "nvml:1", "host", *_sim_specs()]
    board = found[0]
    assert board["board"] == "jetson-nano" and board["rails"] == ["POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU"]
    assert len(board["frequencies_hz"]) == 12
    assert found[2]["board"] == "nvml-nvidia-h100-80gb-hbm3"
    assert mod.state["init"] == 0  # every NVML reference taken was given back


def test_detect_lists_a_gpu_that_fails_to_open_with_its_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(tmp_path))
    install(monkeypatch, FakeGpu(errors={"nvmlDeviceGetName": 999}))
    gpu = detect_devices()[0]
    assert gpu["spec"] == "nvml:0" and "reading the GPU name on nvml:0" in gpu["error"]


class _Props:
    def __init__(self, uuid: str) -> None:
        self.uuid = uuid


def test_training_runs_on_the_cuda_device_with_the_same_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    gpus = [FakeGpu(uuid="GPU-aaaa-1111"), FakeGpu(uuid="GPU-bbbb-2222")]
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpus))
    # CUDA lists them the other way round (fastest first)
    props = [_Props("bbbb-2222"), _Props("aaaa-1111")]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    with open_device("nvml:0") as first, open_device("nvml:1") as second:
        assert first.torch_device() == "cuda:1"
        assert second.torch_device() == "cuda:0"


def test_no_cuda_torch_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml([FakeGpu()]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with open_device("nvml:0") as gpu, pytest.raises(DeviceError, match="CUDA build of torch"):
        gpu.torch_device()


# --- which power reading: the instantaneous field where the driver has it, else the average ------------


def test_power_reads_the_instant_field_where_the_driver_has_it(monkeypatch) -> None:
    """An H100-like GPU: the field reads the spike the one-second average smooths away."""
    mod = install(monkeypatch, FakeGpu(instant_power_mw=512_250, power_mw=301_000))
    gpu = open_nvml(0)
    assert gpu.has_power_sensor and gpu.power_reading == "instant"
    assert gpu.read_power_w() == pytest.approx(512.25)
    assert gpu.rails() == pytest.approx({"board": 512.25})
    assert gpu.describe()["power_reading"] == "instant"
    assert named(mod, "nvmlDeviceGetPowerUsage") == []
    assert named(mod, "nvmlDeviceGetFieldValues")[0] == ("nvmlDeviceGetFieldValues", 0, [186])


@pytest.mark.parametrize("no_field", ["field", "call"])
def test_without_the_instant_field_the_average_is_read_and_said_once(monkeypatch, caplog, no_field) -> None:
    """The field's own return code says NOT_SUPPORTED (an older driver), or the whole call fails."""
    errors = {"nvmlDeviceGetFieldValues": NOT_SUPPORTED} if no_field == "call" else {}
    install(monkeypatch, FakeGpu(errors=errors))
    with caplog.at_level("INFO", logger="powerctl.devices.nvml"):
        gpu = open_nvml(0)
        assert gpu.power_reading == "average" and gpu.describe()["power_reading"] == "average"
        assert gpu.read_power_w() == pytest.approx(61.234)
        gpu.read_power_w()
    said = [r.getMessage() for r in caplog.records if "one-second average" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("nvml:0 (NVIDIA A100-SXM4-80GB): NVML has no instantaneous")


def test_an_instant_field_failing_later_is_one_device_error_line(monkeypatch) -> None:
    gpus = [FakeGpu(instant_power_mw=200_000)]
    mod = fake_pynvml(gpus)
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    gpu = open_nvml(0)
    gpus[0].instant_power_mw = None  # the field's own return code is NOT_SUPPORTED now
    with pytest.raises(DeviceError) as err:
        gpu.read_power_w()
    assert str(err.value).startswith("nvml:0 (NVIDIA A100-SXM4-80GB) does not support reading power")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("instant", "recorded"), [(250_000, "instant"), (None, "average")])
def test_a_profile_records_which_power_reading_it_measured_with(monkeypatch, instant, recorded) -> None:
    install(monkeypatch, FakeGpu(instant_power_mw=instant))
    gpu = open_nvml(0)
    workload = Workload(
        "m", (3, 8, 8), flops_per_sample=1e6, activation_bytes_per_sample=1e3, parameter_bytes=1e3
    )
    profile = Profiler(
        gpu, workload, lambda b: lambda: None, samples=100, warmup_steps=0, measure_steps=1
    ).run([4], frequencies=[1_410_000_000], progress=False)
    assert profile.extra["power_reading"] == recorded
    unpinned = UnpinnedDevice(gpu, "no root")  # profiling at the clock in force says the same
    assert unpinned.power_reading == recorded and unpinned.describe()["power_reading"] == recorded
    assert Profile.from_dict(json.loads(json.dumps(profile.to_dict()))).extra["power_reading"] == recorded
