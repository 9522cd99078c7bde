"""The machine this runs on, as a device with no knob and no sensor: training without a board."""

from __future__ import annotations

import os
import sys
from typing import Any

from powerctl.devices.base import Device
from powerctl.errors import DeviceError


class HostDevice(Device):
    """Wall-clock time, no frequency knob, no power sensor (energy is then not reported)."""

    board = "host"

    def __init__(self, spec: str = "host") -> None:
        super().__init__()
        self.spec = spec

    def frequencies(self) -> list[int]:
        return []

    def current_frequency(self) -> int | None:
        return None

    def _write_pin(self, hz: int) -> None:  # pragma: no cover - pin_frequency refuses first
        raise DeviceError("host has no GPU frequency knob")

    def snapshot(self) -> dict[str, Any]:
        return {}

    def apply_snapshot(self, state: dict[str, Any]) -> None:
        return None

    def memory_bytes(self) -> int:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return int(torch.cuda.get_device_properties(0).total_memory)
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
