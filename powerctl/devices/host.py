"""The machine this runs on, as a device with no knob and no sensor: training without a board."""

from __future__ import annotations

import os
import sys

from powerctl.devices.base import Device
from powerctl.devices.torchdev import resolve_torch_device


class HostDevice(Device):
    """Wall-clock time, no knob, no sensor; training goes to `torch_device`, checked when opened."""

    board = "host"

    def __init__(self, spec: str = "host", *, torch_device: str = "auto") -> None:
        self.spec = spec
        # auto: resolved when training asks, so that listing the host does not load torch
        self._torch_device = None if torch_device == "auto" else resolve_torch_device(torch_device)

    def torch_device(self) -> str:
        return super().torch_device() if self._torch_device is None else self._torch_device

    def memory_bytes(self) -> int:
        where = self.torch_device()
        if where.startswith("cuda"):  # resolving it loaded torch
            return int(sys.modules["torch"].cuda.get_device_properties(where).total_memory)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
