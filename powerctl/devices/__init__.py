"""Open a device by spec string (docs/design/devices.md).

host                      this machine, no knob, no sensor
sim:jetson-nano, sim:...  a simulated board (see powerctl/data/boards.yaml)
jetson                    the Jetson this runs on (auto-detect via /proc/device-tree/model)
jetson-nano, jetson-tx2nx a named Jetson board (sysfs)
nvml:INDEX                a discrete NVIDIA GPU through NVML
"""

from __future__ import annotations

from powerctl.devices.base import Device, PowerSampler, ThreadSampler
from powerctl.errors import DeviceError

__all__ = ["Device", "PowerSampler", "ThreadSampler", "open_device", "SPEC_HELP"]

SPEC_HELP = "host, sim:jetson-nano, sim:jetson-tx2nx, jetson, jetson-nano, jetson-tx2nx, nvml:INDEX"


def open_device(spec: str, *, seed: int = 0) -> Device:
    """The device named by `spec`; an unknown spec is one DeviceError line listing the valid ones.

    A board that a dead process left pinned (SIGKILL, OOM, power loss) is put back first, with one line
    on stderr (kept in `Device.recovered`): every command and every client start goes through here.
    """
    from powerctl.pinsession import recover

    dev = _open(spec, seed=seed)
    try:
        dev.recovered = recover(dev)
    except BaseException:
        dev.close()
        raise
    return dev


def _open(spec: str, *, seed: int = 0) -> Device:
    spec = spec.strip()
    if spec == "host":
        from powerctl.devices.host import HostDevice

        return HostDevice()
    if spec.startswith("sim:"):
        from powerctl.devices.simulated import SimulatedBoard

        return SimulatedBoard.open(spec[len("sim:") :], seed=seed)
    if spec == "jetson" or spec.startswith("jetson-"):
        from powerctl.devices.jetson import open_jetson

        return open_jetson(spec)
    if spec.startswith("nvml:"):
        from powerctl.devices.nvml import open_nvml

        index = spec[len("nvml:") :].strip()
        if not index.lstrip("+-").isdigit():
            raise DeviceError(f"device spec {spec!r}: the NVML index must be a number, e.g. nvml:0")
        if int(index) < 0:
            raise DeviceError(f"device spec {spec!r}: the NVML index counts from 0 (nvml:0 is the first GPU)")
        return open_nvml(int(index))
    raise DeviceError(f"unknown device spec {spec!r}; use one of: {SPEC_HELP}")
