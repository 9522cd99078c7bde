"""Fake Jetson sysfs/procfs trees and a fake `pynvml`, for tests that point POWERCTL_SYSFS_ROOT at them.

Files hold what the real ones hold (numbers followed by a newline, model ending in NUL), so a pin
followed by a restore must give back the tree byte for byte.
"""

from __future__ import annotations

import contextlib
import os
import signal
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NANO_FREQS = [
    76800000, 153600000, 230400000, 307200000, 384000000, 460800000,
    537600000, 614400000, 691200000, 768000000, 844800000, 921600000,
]  # fmt: skip
# T186 gp10b: twelve steps 102 MHz apart, then the top step at 1300.5 MHz.
TX2NX_FREQS = [114750000 + 102000000 * i for i in range(12)] + [1300500000]
ORIN_NANO_FREQS = [306000000, 408000000, 510000000, 612000000, 624750000]

NANO_DEVFREQ = "sys/devices/gpu.0/devfreq/57000000.gpu"
TX2NX_DEVFREQ = "sys/devices/17000000.gp10b/devfreq/17000000.gp10b"
ORIN_DEVFREQ = "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"

# Rails as (name, mW) for JetPack 4 iio, (label, mV, mA) for JetPack 5/6 hwmon.
NANO_RAILS = [("POM_5V_IN", 3184), ("POM_5V_GPU", 412), ("POM_5V_CPU", 825)]
TX2NX_RAILS = [("VDD_IN", 4512), ("VDD_CPU_GPU", 1102), ("VDD_SOC", 987)]
ORIN_RAILS = [("VDD_IN", 5048, 1192), ("VDD_CPU_GPU_CV", 5040, 420), ("VDD_SOC", 5040, 360)]


def _put(root: Path, rel: str, content: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    return path


def _link(root: Path, rel: str, target_rel: str) -> None:
    """A relative symlink, as sysfs has them (so the tree can move)."""
    link = root / rel
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(root / target_rel, link.parent))


def _device_tree(root: Path, model: str, compatible: list[str]) -> None:
    _put(root, "proc/device-tree/model", model + "\x00")
    _put(root, "proc/device-tree/compatible", "".join(c + "\x00" for c in compatible))


def _meminfo(root: Path, total_kb: int) -> None:
    _put(
        root,
        "proc/meminfo",
        f"MemTotal:        {total_kb} kB\nMemFree:         {total_kb // 3} kB\n"
        f"MemAvailable:    {total_kb // 2} kB\nBuffers:           81244 kB\n",
    )


def make_devfreq(root: Path, rel: str, freqs: list[int], governor: str = "nvhost_podgov") -> Path:
    """A devfreq node at its full range, idling at the lowest step."""
    _put(root, f"{rel}/available_frequencies", " ".join(map(str, freqs)) + "\n")
    _put(root, f"{rel}/cur_freq", f"{freqs[0]}\n")
    _put(root, f"{rel}/min_freq", f"{freqs[0]}\n")
    _put(root, f"{rel}/max_freq", f"{freqs[-1]}\n")
    _put(root, f"{rel}/governor", f"{governor}\n")
    _put(root, f"{rel}/available_governors", f"{governor} userspace performance simple_ondemand\n")
    return root / rel


def make_iio_rails(root: Path, rel: str, rails: list[tuple[str, int]], volts_mv: int = 5064) -> Path:
    """JetPack 4 ``ina3221x`` iio device: rail_name_N, in_powerN_input (mW), plus V and I."""
    for channel, (name, mw) in enumerate(rails):
        _put(root, f"{rel}/rail_name_{channel}", f"{name}\n")
        _put(root, f"{rel}/in_power{channel}_input", f"{mw}\n")
        _put(root, f"{rel}/in_voltage{channel}_input", f"{volts_mv}\n")
        _put(root, f"{rel}/in_current{channel}_input", f"{round(mw * 1000 / volts_mv)}\n")
    return root / rel


def make_hwmon_rails(root: Path, rel: str, rails: list[tuple[str, int, int]]) -> Path:
    """JetPack 5/6 ``ina3221`` hwmon: inN_label, inN_input (mV), currN_input (mA), 1-based."""
    _put(root, f"{rel}/name", "ina3221\n")
    for channel, (label, mv, ma) in enumerate(rails, start=1):
        _put(root, f"{rel}/in{channel}_label", f"{label}\n")
        _put(root, f"{rel}/in{channel}_input", f"{mv}\n")
        _put(root, f"{rel}/curr{channel}_input", f"{ma}\n")
    # JetPack 6 adds a summing channel with a voltage and no current: not a rail.
    _put(root, f"{rel}/in7_label", "sum of shunt voltages\n")
    _put(root, f"{rel}/in7_input", "1\n")
    return root / rel


def make_nano_tree(root: Path) -> Path:
    """Jetson Nano 4 GB on JetPack 4 (T210): devfreq 57000000.gpu, ina3221x at 6-0040."""
    _device_tree(
        root,
        "NVIDIA Jetson Nano Developer Kit",
        ["nvidia,p3449-0000-b00+p3448-0000-b00", "nvidia,jetson-nano", "nvidia,tegra210"],
    )
    make_devfreq(root, NANO_DEVFREQ, NANO_FREQS)
    _link(root, "sys/class/devfreq/57000000.gpu", NANO_DEVFREQ)
    _put(root, "sys/devices/gpu.0/load", "0\n")
    make_iio_rails(root, "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0", NANO_RAILS)
    _meminfo(root, 4059712)
    return root


def make_tx2nx_tree(root: Path) -> Path:
    """Jetson TX2 NX on JetPack 4 (T186): devfreq 17000000.gp10b, ina3221x at 2-0040."""
    _device_tree(
        root,
        "NVIDIA Jetson TX2 NX Developer Kit",
        ["nvidia,p3509-0000+p3636-0001", "nvidia,tegra186"],
    )
    make_devfreq(root, TX2NX_DEVFREQ, TX2NX_FREQS)
    _link(root, "sys/class/devfreq/17000000.gp10b", TX2NX_DEVFREQ)
    make_iio_rails(root, "sys/bus/i2c/drivers/ina3221x/2-0040/iio:device0", TX2NX_RAILS)
    _meminfo(root, 3956468)
    return root


def make_orin_tree(root: Path) -> Path:
    """Jetson Orin Nano on JetPack 6: GPU found by scanning /sys/class/devfreq, ina3221 hwmon at 1-0040."""
    _device_tree(
        root,
        "NVIDIA Jetson Orin Nano Developer Kit",
        ["nvidia,p3768-0000+p3767-0005", "nvidia,p3767-0005", "nvidia,tegra234"],
    )
    make_devfreq(root, ORIN_DEVFREQ, ORIN_NANO_FREQS)
    _link(root, "sys/class/devfreq/17000000.gpu", ORIN_DEVFREQ)
    # Another devfreq node that is not the GPU, sorted before it: the scan must skip it.
    make_devfreq(root, "sys/devices/platform/bus@0/15340000.vic/devfreq/15340000.vic", [115200000, 729600000])
    _link(
        root, "sys/class/devfreq/15340000.vic", "sys/devices/platform/bus@0/15340000.vic/devfreq/15340000.vic"
    )
    make_hwmon_rails(root, "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1", ORIN_RAILS)
    _meminfo(root, 7620844)
    return root


def tree_snapshot(root: Path) -> dict[str, bytes]:
    """Every file's bytes (and every symlink's target) by path relative to `root`."""
    snap: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                snap[rel] = b"-> " + os.readlink(path).encode()
            elif path.is_file():
                snap[rel] = path.read_bytes()
    return snap


# --- a fake pynvml ----------------------------------------------------------------------------


@dataclass
class FakeGpu:
    name: str | bytes = "NVIDIA A100-SXM4-80GB"
    memory_clocks_mhz: list[int] = field(default_factory=lambda: [1593])
    graphics_clocks_mhz: dict[int, list[int]] = field(
        default_factory=lambda: {1593: [1410, 1395, 1380, 1365, 1350, 210, 225, 240, 1410]}
    )
    power_mw: int = 61234
    memory_total: int = 85899345920
    clock_mhz: int = 1410
    uuid: str = "GPU-5b5a7ac0-0d38-3f0b-a1b2-000000000000"
    errors: dict[str, int] = field(default_factory=dict)
    """Function name → NVML error code that calling it raises."""


def fake_pynvml(gpus: list[FakeGpu], init_error: int | None = None) -> types.ModuleType:
    """A stand-in for `pynvml` with the functions powerctl uses; `module.calls` records every call."""
    mod = types.ModuleType("pynvml")
    consts = {
        "NVML_SUCCESS": 0,
        "NVML_ERROR_UNINITIALIZED": 1,
        "NVML_ERROR_INVALID_ARGUMENT": 2,
        "NVML_ERROR_NOT_SUPPORTED": 3,
        "NVML_ERROR_NO_PERMISSION": 4,
        "NVML_ERROR_DRIVER_NOT_LOADED": 9,
        "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
        "NVML_CLOCK_GRAPHICS": 0,
        "NVML_CLOCK_SM": 1,
        "NVML_CLOCK_MEM": 2,
    }
    for key, value in consts.items():
        setattr(mod, key, value)

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            return {
                3: "Not Supported",
                4: "Insufficient Permissions",
                12: "NVML Shared Library Not Found",
            }.get(self.value, f"NVML Error with code {self.value}")

    calls: list[tuple[Any, ...]] = []
    state = {"init": 0}

    def recorded(fn_name: str, fn: Any) -> Any:
        def call(*args: Any) -> Any:
            calls.append((fn_name, *args))
            if fn_name not in (
                "nvmlInit",
                "nvmlShutdown",
                "nvmlDeviceGetCount",
                "nvmlDeviceGetHandleByIndex",
            ):
                code = gpus[args[0]].errors.get(fn_name)
                if code is not None:
                    raise NVMLError(code)
            return fn(*args)

        return call

    def init() -> None:
        if init_error is not None:
            raise NVMLError(init_error)
        state["init"] += 1

    def shutdown() -> None:
        state["init"] -= 1

    def handle(index: int) -> int:
        if not 0 <= index < len(gpus):
            raise NVMLError(2)
        return index

    functions = {
        "nvmlInit": init,
        "nvmlShutdown": shutdown,
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": handle,
        "nvmlDeviceGetName": lambda h: gpus[h].name,
        "nvmlDeviceGetUUID": lambda h: gpus[h].uuid,
        "nvmlDeviceGetSupportedMemoryClocks": lambda h: list(gpus[h].memory_clocks_mhz),
        "nvmlDeviceGetSupportedGraphicsClocks": lambda h, mem: list(gpus[h].graphics_clocks_mhz[mem]),
        "nvmlDeviceSetGpuLockedClocks": lambda h, lo, hi: None,
        "nvmlDeviceResetGpuLockedClocks": lambda h: None,
        "nvmlDeviceGetPowerUsage": lambda h: gpus[h].power_mw,
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(
            total=gpus[h].memory_total, used=0, free=gpus[h].memory_total
        ),
        "nvmlDeviceGetClockInfo": lambda h, kind: gpus[h].clock_mhz,
    }
    for fn_name, fn in functions.items():
        setattr(mod, fn_name, recorded(fn_name, fn))
    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    mod.calls = calls  # type: ignore[attr-defined]
    mod.state = state  # type: ignore[attr-defined]
    return mod


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def default_signals() -> None:
    """`preexec_fn` for a child that must see SIGINT/SIGTERM as a user's shell sends them: a child
    inherits an ignored or blocked signal (a test runner's worker may have either), and Python then
    installs no KeyboardInterrupt handler."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    for sig in _SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


@contextlib.contextmanager
def sigint_raises_keyboard_interrupt() -> Iterator[None]:
    """Within the block SIGINT is Python's default (KeyboardInterrupt), whatever the worker inherited."""
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
