"""Test helpers for boards: the fake Jetson trees (from `powerctl.devices.fakeboard`, the one generator), a
byte-for-byte snapshot of a tree, a fake `pynvml`, and signal set-up for child processes.
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

from powerctl.devices.fakeboard import (  # noqa: F401  (the one generator; tests import the trees from here)
    NANO_DEVFREQ,
    NANO_FREQS,
    ORIN_DEVFREQ,
    ORIN_NANO_FREQS,
    TX2NX_DEVFREQ,
    TX2NX_FREQS,
    make_devfreq,
    make_fake_board,
    make_hwmon_rails,
    make_iio_rails,
    make_nano_tree,
    make_orin_tree,
    make_tx2nx_tree,
)


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
    """What nvmlDeviceGetPowerUsage reads (a one-second average on Ampere and newer)."""
    instant_power_mw: int | None = None
    """What the NVML_FI_DEV_POWER_INSTANT field reads; None: the driver has no such field."""
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
        "NVML_FI_DEV_POWER_AVERAGE": 185,
        "NVML_FI_DEV_POWER_INSTANT": 186,
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

    def field_value(gpu: FakeGpu, field_id: int) -> types.SimpleNamespace:
        """As NVML fills one field: its own return code (NOT_SUPPORTED for a field this GPU lacks)."""
        mw = gpu.instant_power_mw if field_id == 186 else None
        return types.SimpleNamespace(
            fieldId=field_id,
            nvmlReturn=0 if mw is not None else 3,
            value=types.SimpleNamespace(uiVal=mw or 0),
        )

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
        "nvmlDeviceGetFieldValues": lambda h, ids: [field_value(gpus[h], i) for i in ids],
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
