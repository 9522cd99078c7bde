"""A discrete NVIDIA GPU through NVML (imported when one is opened): locked clocks as the knob, power."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from types import ModuleType
from typing import Any, NoReturn

from powerctl.devices.base import Device
from powerctl.errors import DeviceError, DevicePermissionError

MHZ = 1_000_000
log = logging.getLogger(__name__)


def load_nvml() -> tuple[ModuleType, int]:
    """`pynvml`, initialised, and how many GPUs it sees; one DeviceError line when the library or the
    driver is missing, or the GPUs cannot be counted."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # ImportError, NVMLError, or OSError from ctypes when libnvidia-ml is absent
        raise DeviceError(f"NVML is not available (no NVIDIA driver?): {exc}") from None
    try:
        return pynvml, int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        shutdown_nvml(pynvml)
        raise DeviceError(f"NVML could not count the GPUs: {exc}") from None


def shutdown_nvml(nvml: ModuleType) -> None:
    """Drop one nvmlInit reference; best effort."""
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlGpu(Device):
    """One NVML GPU. NVML cannot read locked clocks back, so restoring means resetting the lock."""

    def __init__(self, nvml: ModuleType, index: int) -> None:
        self._nvml, self.index, self.spec = nvml, index, f"nvml:{index}"
        self.name = "?"
        self._handle = self._call("opening the GPU", nvml.nvmlDeviceGetHandleByIndex, index)
        self.name = _text(self._call("reading the GPU name", nvml.nvmlDeviceGetName, self._handle))
        # the profile's device field: ``NVIDIA A100-SXM4-80GB`` → ``nvml-nvidia-a100-sxm4-80gb``
        self.board = "nvml-" + re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        self._table = self._read_table()
        self.has_power_sensor = self._probe_power()
        self._closed = False

    def torch_device(self) -> str:
        """The CUDA device that IS this GPU, matched by UUID (CUDA may number GPUs differently)."""
        import torch

        if not torch.cuda.is_available():
            raise DeviceError(
                f"{self.spec} ({self.name}) needs a CUDA build of torch to train on; this torch has no CUDA"
            )
        uuid = _text(self._call("reading the GPU UUID", self._nvml.nvmlDeviceGetUUID, self._handle))
        want = uuid.lower().removeprefix("gpu-")
        for i in range(torch.cuda.device_count()):
            got = str(getattr(torch.cuda.get_device_properties(i), "uuid", "")).lower().removeprefix("gpu-")
            if got and got == want:
                return f"cuda:{i}"
        if self.index < torch.cuda.device_count():
            return f"cuda:{self.index}"  # no UUIDs to match: assume the orders agree
        raise DeviceError(f"{self.spec} ({uuid}) is not visible to CUDA here; check CUDA_VISIBLE_DEVICES")

    def _fail(self, what: str, exc: Any) -> NoReturn:
        """Map an NVMLError to the one-line error a user can act on."""
        nvml = self._nvml
        if exc.value == nvml.NVML_ERROR_NO_PERMISSION:
            raise DevicePermissionError(
                f"{what} needs root: run with sudo, or profile at the clock in force (--no-pin, node config "
                f"pin = false) ({self.spec}, {self.name}: NVML says {exc})"
            ) from None
        if exc.value == nvml.NVML_ERROR_NOT_SUPPORTED:
            raise DeviceError(
                f"{self.spec} ({self.name}) does not support {what} (NVML says {exc})"
            ) from None
        raise DeviceError(f"{what} on {self.spec} ({self.name}) failed: NVML says {exc}") from None

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError as exc:
            self._fail(what, exc)

    def _read_table(self) -> list[int]:
        """Graphics clocks supported at the highest memory clock, in Hz ascending; [] when NVML has none."""
        nvml = self._nvml
        try:
            mem = nvml.nvmlDeviceGetSupportedMemoryClocks(self._handle)
            graphics = nvml.nvmlDeviceGetSupportedGraphicsClocks(self._handle, max(mem)) if mem else []
        except nvml.NVMLError as exc:
            if exc.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                return []
            self._fail("listing supported clocks", exc)
        return sorted({int(mhz) * MHZ for mhz in graphics})

    def _probe_power(self) -> bool:
        """Whether NVML reads board power here, and how (`power_reading`): instantaneous, else averaged."""
        nvml = self._nvml
        with contextlib.suppress(nvml.NVMLError, AttributeError):  # AttributeError: a nvidia-ml-py without it
            self._instant_mw()
            self.power_reading = "instant"
            return True
        try:
            nvml.nvmlDeviceGetPowerUsage(self._handle)
        except nvml.NVMLError:
            return False
        self.power_reading = "average"
        log.info(
            "%s (%s): NVML has no instantaneous power here; reading nvmlDeviceGetPowerUsage instead, a "
            "one-second average on Ampere and newer GPUs: peaks shorter than that read low",
            self.spec,
            self.name,
        )
        return True

    def _instant_mw(self) -> int:
        """The instantaneous board power field, in mW; NVMLError when the field is not there."""
        nvml = self._nvml
        field = nvml.nvmlDeviceGetFieldValues(self._handle, [nvml.NVML_FI_DEV_POWER_INSTANT])[0]
        if field.nvmlReturn != nvml.NVML_SUCCESS:
            raise nvml.NVMLError(field.nvmlReturn)
        return int(field.value.uiVal)

    def physical_key(self) -> str | None:
        """The GPU's UUID (NVML indices change with CUDA_VISIBLE_DEVICES and PCI order)."""
        try:
            uuid = _text(self._call("reading the GPU UUID", self._nvml.nvmlDeviceGetUUID, self._handle))
        except DeviceError:  # no UUID (old driver): the index, which is stable on one machine
            return f"{self.board}-index{self.index}"
        return f"nvml-{uuid.lower()}"

    def current_frequency(self) -> int | None:
        nvml = self._nvml
        what = "reading the graphics clock"
        return (
            int(self._call(what, nvml.nvmlDeviceGetClockInfo, self._handle, nvml.NVML_CLOCK_GRAPHICS)) * MHZ
        )

    def clock_in_force(self) -> int | None:
        """The highest supported graphics clock: an unlocked GPU boosts to it under load."""
        return max(self._table) if self._table else None

    def pin_refusal(self) -> str | None:
        """Locking clocks needs root (NVML's rule); as root, only the attempt can tell."""
        root = not hasattr(os, "geteuid") or os.geteuid() == 0
        return None if root else "locking GPU clocks needs root (NVML)"

    def _write_pin(self, hz: int) -> None:
        mhz = hz // MHZ
        self._call("locking GPU clocks", self._nvml.nvmlDeviceSetGpuLockedClocks, self._handle, mhz, mhz)

    def snapshot(self) -> dict[str, Any]:
        return {"locked": None}

    def apply_snapshot(self, state: dict[str, Any]) -> None:
        self._call("resetting locked GPU clocks", self._nvml.nvmlDeviceResetGpuLockedClocks, self._handle)

    def read_power_w(self) -> float:
        if not self.has_power_sensor:
            raise DeviceError(f"{self.spec} ({self.name}) has no power sensor NVML can read")
        if self.power_reading == "instant":
            return self._call("reading power", self._instant_mw) / 1000.0
        return self._call("reading power", self._nvml.nvmlDeviceGetPowerUsage, self._handle) / 1000.0

    def rails(self) -> dict[str, float]:
        return {"board": self.read_power_w()} if self.has_power_sensor else {}

    def memory_bytes(self) -> int:
        info = self._call("reading memory size", self._nvml.nvmlDeviceGetMemoryInfo, self._handle)
        return int(info.total)

    def describe(self) -> dict[str, Any]:
        return super().describe() | {"name": self.name, "index": self.index}

    def close(self) -> None:
        """Release the clock lock, then NVML (each open holds one nvmlInit reference)."""
        if self._closed:
            return
        try:
            super().close()
        finally:
            self._closed = True
            shutdown_nvml(self._nvml)


def open_nvml(index: int) -> NvmlGpu:
    """``nvml:INDEX``; an index past the last GPU names how many there are."""
    nvml, count = load_nvml()
    try:
        if not 0 <= index < count:
            if count == 0:
                raise DeviceError(f"nvml:{index}: NVML found no NVIDIA GPU")
            raise DeviceError(
                f"nvml:{index}: there {'is' if count == 1 else 'are'} {count} NVIDIA GPU"
                f"{'' if count == 1 else 's'} here (nvml:0 … nvml:{count - 1})"
            )
        return NvmlGpu(nvml, index)
    except BaseException:
        shutdown_nvml(nvml)
        raise
