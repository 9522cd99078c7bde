"""Open a device by spec string (`SPEC_HELP`, or a torch device: docs/design/devices.md); list them all."""

from __future__ import annotations

from typing import Any

from powerctl.devices.base import Device, PowerSampler, ThreadSampler
from powerctl.devices.torchdev import check_torch_spec, is_torch_spec
from powerctl.devices.unpinned import UnpinnedDevice
from powerctl.errors import ArgumentError, DeviceError
from powerctl.files.mapping import MAX_SEED, Flag, Integer, Maybe, check_arguments
from powerctl.pinning.pinsession import recover

__all__ = ["Device", "PowerSampler", "ThreadSampler", "check_spec", "open_device", "SPEC_HELP"]

SPEC_HELP = "host, sim:jetson-nano, sim:jetson-tx2nx, jetson, jetson-nano, jetson-tx2nx, nvml:INDEX"


def open_device(spec: str, *, seed: int = 0, pin: bool | None = True) -> Device:
    """The device named by `spec`; an unknown spec is one DeviceError line listing the valid ones.

    A board a dead process left pinned is put back first (`Device.recovered`). `pin`: True, as it is;
    False, at the clock in force with nothing written; None, pin where this process may, else unpinned."""
    checked = check_arguments("open_device", seed=(seed, Integer(0, MAX_SEED)), pin=(pin, Maybe(Flag())))
    seed, pin = checked["seed"], checked["pin"]  # pin is exactly a bool: "false" or 0 must not pin
    if not isinstance(spec, str):
        raise ArgumentError(
            f"open_device: 'spec' must be a device spec string (e.g. sim:jetson-nano), got {spec!r}"
        )
    dev = _open(spec, seed=seed)
    try:
        if pin is False:
            return UnpinnedDevice(dev, "the operator's pin = false")
        dev.recovered = recover(dev)
        refusal = dev.pin_refusal() if pin is None else None
        return dev if refusal is None else UnpinnedDevice(dev, refusal)
    except BaseException:
        dev.close()
        raise


def check_spec(spec: str) -> tuple[str, str]:
    """(kind, argument) of a device spec, checked without opening anything: ("host", ""), ("sim",
    "jetson-nano"), ("jetson", "jetson-NAME"), ("nvml", "0"), ("torch", "cuda:0"); else a DeviceError."""
    spec = spec.strip()
    if spec == "host":
        return "host", ""
    if is_torch_spec(spec):
        return "torch", check_torch_spec(spec)
    if spec.startswith("sim:"):
        from powerctl.devices.simulated import check_board_name

        return "sim", check_board_name(spec[len("sim:") :])
    if spec == "jetson" or spec.startswith("jetson-"):
        return "jetson", spec
    if spec.startswith("nvml:"):
        index = spec[len("nvml:") :].strip()
        if not index.lstrip("+-").isdigit():
            raise DeviceError(f"device spec {spec!r}: the NVML index must be a number, e.g. nvml:0")
        if int(index) < 0:
            raise DeviceError(f"device spec {spec!r}: the NVML index counts from 0 (nvml:0 is the first GPU)")
        return "nvml", str(int(index))
    raise DeviceError(f"unknown device spec {spec!r}; use one of: {SPEC_HELP}")


def _open(spec: str, *, seed: int = 0) -> Device:
    kind, arg = check_spec(spec)
    if kind in ("host", "torch"):
        from powerctl.devices.host import HostDevice

        return HostDevice() if kind == "host" else HostDevice(arg, torch_device=arg)
    if kind == "sim":
        from powerctl.devices.simulated import SimulatedBoard

        return SimulatedBoard.open(arg, seed=seed)
    if kind == "jetson":
        from powerctl.devices.jetson import open_jetson

        return open_jetson(arg)
    from powerctl.devices.nvml import open_nvml

    return open_nvml(int(arg))


def _jetson() -> list[dict[str, Any]]:
    """The Jetson this runs on, if the device tree says so; a broken one is listed with its error."""
    from powerctl.devices import jetson

    root = jetson.sysfs_root()
    model = jetson.read_model(root)
    name = None if model is None else jetson.board_name(model, jetson.read_compatible(root))
    return [] if name is None else [_listed("jetson", "jetson", board=name, model=model)]


def _nvml_gpus() -> list[dict[str, Any]]:
    """Every GPU NVML sees; nothing (silently) when NVML or the driver is missing."""
    from powerctl.devices import nvml

    try:
        lib, count = nvml.load_nvml()
    except DeviceError:
        return []
    nvml.shutdown_nvml(lib)
    return [_listed("nvml", f"nvml:{index}") for index in range(count)]


def _listed(kind: str, spec: str, **known: Any) -> dict[str, Any]:
    """`spec` opened and described; one there but unusable (a garbage frequency table: not "no knob"),
    what is `known` of it and its error."""
    try:
        with open_device(spec) as dev:
            return {"kind": kind, **dev.describe()}
    except DeviceError as exc:
        return {"kind": kind, "spec": spec, **known, "error": str(exc)}


def detect_devices() -> list[dict[str, Any]]:
    """Jetson and NVML GPUs (if any), the host, the simulated boards; one unusable carries an `error`."""
    from powerctl.devices.host import HostDevice
    from powerctl.devices.simulated import SIM_BOARDS, SimulatedBoard

    simulated = [{"kind": "sim", **SimulatedBoard.open(name).describe()} for name in SIM_BOARDS]
    return [*_jetson(), *_nvml_gpus(), {"kind": "host", **HostDevice().describe()}, *simulated]
