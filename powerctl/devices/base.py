"""One interface over real and simulated GPUs: knob, sensor, clock, steps (docs/design/devices.md)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from powerctl.devices.torchdev import resolve_torch_device
from powerctl.errors import DeviceError
from powerctl.pinning.pinsession import PinSession
from powerctl.pinning.safety import restore_on_exit
from powerctl.records.workload import Workload

T = TypeVar("T")

PowerSamples = list[tuple[float, float]]  # (device-clock seconds, watts), in time order


class PowerSampler(ABC):
    """Collects power samples over a block of work, timestamped on the device's own clock."""

    _samples: PowerSamples

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> PowerSamples: ...

    def samples_so_far(self) -> PowerSamples:
        """The samples taken since `start`, live (read, never modify)."""
        return self._samples


class ThreadSampler(PowerSampler):
    """Polls a sensor from a background thread."""

    def __init__(self, read_w: Callable[[], float], clock: Callable[[], float], rate_hz: float) -> None:
        self._read_w, self._clock, self._period = read_w, clock, 1.0 / rate_hz
        self._samples: PowerSamples = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            while True:
                self._samples.append((self._clock(), self._read_w()))
                if self._stop.wait(self._period):
                    return
        except BaseException as exc:  # surfaced by stop()
            self._error = exc

    def start(self) -> None:
        self._samples, self._error = [], None
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="power-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> PowerSamples:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise DeviceError(f"power sensor failed while sampling: {self._error}")
        self._samples.append((self._clock(), self._read_w()))  # one reading at the end of the block
        return self._samples


class Device(ABC):
    """A GPU with (maybe) a frequency knob and (maybe) a power sensor.

    The defaults are a device without a knob; a backend with one sets `_table` and implements
    `current_frequency`, `_write_pin`, `snapshot` and `apply_snapshot`. Pinning lives here."""

    spec: str  # the spec string it was opened with, e.g. ``sim:jetson-nano``
    board: str  # board/GPU name, e.g. ``jetson-nano``: the profile's ``device`` field
    has_power_sensor: bool = False
    power_reading: str | None = None  # "instant", "average" (a vendor's smoothed reading), None: not said
    recovered: str | None = None  # set by `open_device`: the line said when found left pinned and put back
    pins: bool = True  # False: a device at the clock in force (`powerctl.devices.unpinned`)
    _session: PinSession | None = None  # from the first pin to the restore
    _table: Sequence[int] = ()  # the GPU frequencies in Hz, ascending; empty: no knob

    def physical_key(self) -> str | None:
        """The physical board's key for its pin lock and crash record (None: no hardware state to lose)."""
        return None

    def frequencies(self) -> list[int]:
        """Supported GPU frequencies in Hz, ascending; empty when the device has no knob."""
        return list(self._table)

    def current_frequency(self) -> int | None:
        """The GPU frequency in force now, in Hz (None when unknown)."""
        return None

    def _write_pin(self, hz: int) -> None:  # pragma: no cover - pin_frequency refuses first
        """Hold the GPU at exactly `hz` (already validated); a device with a knob writes it."""
        raise DeviceError(f"{self.spec} has no GPU frequency knob")

    def snapshot(self) -> dict[str, Any]:
        """The knob state to restore later, JSON-serialisable (nothing for a device without a knob)."""
        return {}

    def apply_snapshot(self, state: dict[str, Any]) -> None:
        """Put back a state taken by `snapshot` (possibly in another process)."""
        return None

    def profile_kind(self) -> str:
        """BACKEND/BOARD: the kind of device a cached profile is of."""
        return f"{type(self).__name__}/{self.board}"

    def clock_in_force(self) -> int | None:
        """The frequency the GPU runs work at when this process does not set it (None: unknown)."""
        return self.current_frequency()

    def pin_refusal(self) -> str | None:
        """Why this process may not pin, found without writing (None: it may, or only a pin can tell)."""
        return None

    def pin_frequency(self, hz: int) -> None:
        """Pin the GPU frequency; the state before the first pin is kept for `restore`."""
        table = self.frequencies()
        if not table:
            raise DeviceError(f"{self.spec} has no GPU frequency knob: nothing to pin")
        if hz not in table:
            raise DeviceError(
                f"{hz} Hz is not a frequency of {self.spec}; choose one of: {', '.join(map(str, table))}"
            )
        first = self._session is None
        if first:
            # lock + on-disk record BEFORE the first write (powerctl.pinning.pinsession)
            self._session = PinSession.start(self)
        try:
            self._write_pin(hz)
        except BaseException:
            if first:  # a refused first pin leaves nothing pinned, locked or recorded
                with contextlib.suppress(Exception):
                    self.restore()
            raise

    def restore(self) -> None:
        """Undo every pin since the first one; a no-op when nothing is pinned."""
        if self._session is not None:
            session = self._session
            self.apply_snapshot(session.state)
            self._session = None
            session.finish()

    def release_snapshot(self) -> None:
        """`powerctl freq --set`: stop restoring the pre-pin state here; its record stays for `--restore`."""
        session, self._session = self._session, None
        if session is not None:
            session.finish(hand_over=True)

    @property
    def is_pinned(self) -> bool:
        return self._session is not None

    @contextmanager
    def pinned(self, hz: int) -> Iterator[Device]:
        """Pin for the block; restore on every exit path (exception, SIGINT, SIGTERM)."""
        with restore_on_exit(self):
            self.pin_frequency(hz)
            yield self

    def read_power_w(self) -> float:
        """Total board power now, in W."""
        raise DeviceError(f"{self.spec} has no power sensor")

    def rails(self) -> dict[str, float]:
        """Power per rail now, in W (empty when there is no sensor)."""
        return {}

    def power_sampler(self, rate_hz: float) -> PowerSampler:
        """A sampler over this device's sensor, on this device's clock."""
        if not self.has_power_sensor:
            raise DeviceError(f"{self.spec} has no power sensor")
        return ThreadSampler(self.read_power_w, self.clock, rate_hz)

    @abstractmethod
    def memory_bytes(self) -> int:
        """Memory the GPU can use for training, in bytes."""

    def clock(self) -> float:
        """Device time in seconds (wall time on real hardware, virtual time on simulated boards)."""
        return time.perf_counter()

    def idle(self, seconds: float) -> None:
        """Let `seconds` of device time pass without work."""
        if seconds > 0:
            time.sleep(seconds)

    def resume_state(self) -> dict[str, Any]:
        """What a fine-tune resumed in another process needs to continue this device's clock and sensor."""
        return {}

    def load_resume_state(self, state: dict[str, Any]) -> None:
        """Continue from a `resume_state()` taken earlier, possibly in another process."""
        return None

    def synchronize(self) -> None:
        """Wait for queued CUDA work, so that clock readings bracket the step."""
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def torch_device(self) -> str:
        """Where training tensors live: the GPU when torch sees one (a simulated board: the CPU)."""
        return resolve_torch_device("auto") if "torch" in sys.modules else "cpu"

    def run_step(self, fn: Callable[[], T], *, batch_size: int, workload: Workload) -> T:
        """Run one training step and charge it to the device."""
        result = fn()
        self.synchronize()
        return result

    def describe(self) -> dict[str, Any]:
        """What `powerctl devices --json` prints for this device."""
        return {
            "spec": self.spec,
            "board": self.board,
            "frequencies_hz": self.frequencies(),
            "current_frequency_hz": self.current_frequency(),
            "memory_bytes": self.memory_bytes(),
            "power_sensor": self.has_power_sensor,
            **({"power_reading": self.power_reading} if self.power_reading else {}),
            "rails": sorted(self.rails()) if self.has_power_sensor else [],
        }

    def close(self) -> None:
        self.restore()

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
