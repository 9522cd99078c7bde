"""What `powerctl devices` lists: every device this machine has, plus the simulated boards by name."""

from __future__ import annotations

from typing import Any

from powerctl.devices import open_device
from powerctl.errors import DeviceError


def _jetson() -> list[dict[str, Any]]:
    """The Jetson this runs on, if the device tree says so; a broken one is listed with its error."""
    from powerctl.devices import jetson

    root = jetson.sysfs_root()
    model = jetson.read_model(root)
    name = None if model is None else jetson.board_name(model, jetson.read_compatible(root))
    if name is None:
        return []
    try:
        with open_device("jetson") as board:
            return [{"kind": "jetson", **board.describe()}]
    except DeviceError as exc:  # e.g. a frequency table that is there but garbage: not "no knob"
        return [{"kind": "jetson", "spec": "jetson", "board": name, "model": model, "error": str(exc)}]


def _nvml_gpus() -> list[dict[str, Any]]:
    """Every GPU NVML sees; nothing (silently) when NVML or the driver is missing."""
    from powerctl.devices import nvml

    try:
        lib = nvml.load_nvml()
    except DeviceError:
        return []
    try:
        count = nvml.gpu_count(lib)
    except DeviceError:
        count = 0
    finally:
        nvml.shutdown_nvml(lib)
    found = []
    for index in range(count):
        try:
            with open_device(f"nvml:{index}") as gpu:
                found.append({"kind": "nvml", **gpu.describe()})
        except DeviceError as exc:
            found.append({"kind": "nvml", "spec": f"nvml:{index}", "error": str(exc)})
    return found


def detect_devices() -> list[dict[str, Any]]:
    """Jetson and NVML GPUs (if any), the host, the simulated boards; one unusable carries an `error`."""
    from powerctl.devices.host import HostDevice
    from powerctl.devices.simulated import SIM_BOARDS, SimulatedBoard

    simulated = [{"kind": "sim", **SimulatedBoard.open(name).describe()} for name in SIM_BOARDS]
    return [*_jetson(), *_nvml_gpus(), {"kind": "host", **HostDevice().describe()}, *simulated]
