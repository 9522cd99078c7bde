"""A real Jetson via sysfs under `POWERCTL_SYSFS_ROOT` (default /): devfreq the knob, INA3221 the sensor."""

from __future__ import annotations

import hashlib
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from powerctl.devices.base import Device
from powerctl.errors import DeviceError, DevicePermissionError
from powerctl.files.readfile import SYSFS_LIMIT, read_bytes
from powerctl.pinning.freqstate import BadRecordError

ROOT_ENV = "POWERCTL_SYSFS_ROOT"
MODEL_FILE = "proc/device-tree/model"
COMPATIBLE_FILE = "proc/device-tree/compatible"

# Known devfreq nodes first; any other board falls back to scanning /sys/class/devfreq.
KNOWN_DEVFREQ: dict[str, tuple[str, ...]] = {
    "jetson-nano": (
        "sys/devices/gpu.0/devfreq/57000000.gpu",
        "sys/devices/57000000.gpu/devfreq/57000000.gpu",
        "sys/class/devfreq/57000000.gpu",
    ),
    "jetson-tx2nx": ("sys/devices/17000000.gp10b/devfreq/17000000.gp10b", "sys/class/devfreq/17000000.gp10b"),
}
DEVFREQ_CLASS = "sys/class/devfreq"
_GPU_NODE = re.compile(r"gpu|gp10b|gv11b|ga10b|gb10b|gm20b|gk20a")

INA3221X_IIO_GLOB = "sys/bus/i2c/drivers/ina3221x/*/iio:device*"  # JetPack 4
INA3221_HWMON_GLOB = "sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"  # JetPack 5/6
TOTAL_RAILS = ("POM_5V_IN", "VDD_IN", "VIN_SYS_5V0")

NO_JETSON_HINT = "use sim:jetson-nano to simulate one"


def sysfs_root() -> Path:
    """`/` on a board, a fake tree in tests."""
    return Path(os.environ.get(ROOT_ENV) or "/")


def _read(path: Path) -> str:
    """The stripped text of a sysfs file, read bounded (a fake tree may hold a FIFO or /dev/zero)."""
    try:
        raw = read_bytes(path, limit=SYSFS_LIMIT, what="a sysfs file", error=DeviceError)
    except OSError as exc:
        raise DeviceError(f"reading {path} failed: {exc.strerror or exc}") from None
    return raw.decode(errors="replace").strip()


def _write_sysfs(path: Path, value: str) -> None:
    """Write `value` + newline in ONE write call, truncating (for a fake tree; sysfs ignores it)."""
    data = f"{value}\n".encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except PermissionError:
        raise DevicePermissionError(
            f"writing {path} needs root: run with sudo, or add a udev rule granting write access to "
            "the devfreq files"
        ) from None
    except OSError as exc:
        raise DeviceError(f"writing {value} to {path} failed: {exc.strerror or exc}") from None


def read_model(root: Path) -> str | None:
    """The device-tree model string (NUL stripped), or None when the file does not exist."""
    path = root / MODEL_FILE
    return _read(path).rstrip("\x00").strip() if path.is_file() else None


def read_compatible(root: Path) -> list[str]:
    path = root / COMPATIBLE_FILE
    return [c for c in _read(path).split("\x00") if c] if path.is_file() else []


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def board_name(model: str, compatible: list[str] | None = None) -> str | None:
    """``jetson-nano``/``jetson-tx2nx`` for the reference boards, a slug for newer ones, None if no Jetson."""
    compat = " ".join(compatible or []).lower()
    words = _slug(model).split("-")
    if "orin" not in words and ("nano" in words or "p3448" in compat):
        return "jetson-nano"
    if ("tx2" in words and "nx" in words) or "tx2nx" in words or "lanai" in words or "p3636" in compat:
        return "jetson-tx2nx"
    if "jetson" not in words and "nvidia,tegra" not in compat:
        return None
    for noise in ("NVIDIA", "Engineering Reference", "Developer Kit"):
        model = re.sub(re.escape(noise), " ", model, flags=re.IGNORECASE)
    slug = _slug(model)
    return slug if slug.startswith("jetson") else f"jetson-{slug}"


def find_devfreq(root: Path, board: str) -> Path | None:
    """The GPU's devfreq directory: a known path for the board, else the first GPU node in the class."""
    for rel in KNOWN_DEVFREQ.get(board, ()):
        node = root / rel
        if os.path.lexists(node / "available_frequencies"):
            return node
    class_dir = root / DEVFREQ_CLASS
    if class_dir.is_dir():
        for node in sorted(class_dir.iterdir()):
            if _GPU_NODE.search(node.name.lower()) and os.path.lexists(node / "available_frequencies"):
                return node
    return None


def _parse_table(path: Path) -> list[int]:
    """The frequency table, ascending; empty or garbage is one DeviceError line (never "no knob")."""
    text = _read(path)
    try:
        table = sorted({int(tok) for tok in text.split()})
    except ValueError:
        table = []
    if not table or table[0] <= 0:
        raise DeviceError(
            f"{path} is not a list of frequencies in Hz (> 0): {text[:80]!r}; the GPU's devfreq node is "
            "broken (or POWERCTL_SYSFS_ROOT names a bad tree)"
        )
    return table


_FREQ_TEXT = re.compile(r"[0-9]{1,15}")
_GOVERNOR_TEXT = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def _saved_state(state: dict[str, Any]) -> tuple[str, str, str | None] | str:
    """(min_freq, max_freq, governor) as the record holds them, or what is wrong (checked before writing)."""
    freqs = []
    for name in ("min_freq", "max_freq"):
        value = state.get(name)
        text = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
        if not isinstance(text, str) or not _FREQ_TEXT.fullmatch(text) or int(text) == 0:
            return f"'state': {name!r} must be a frequency in Hz, got {value!r}"
        freqs.append(text)
    lo, hi = freqs
    if int(lo) > int(hi):
        return f"'state': min_freq {lo} is above max_freq {hi}"
    governor = state.get("governor")
    if governor is not None and not (isinstance(governor, str) and _GOVERNOR_TEXT.fullmatch(governor)):
        return f"'state': 'governor' must be a devfreq governor's name, got {governor!r}"
    return lo, hi, governor


@dataclass(frozen=True)
class Rail:
    """One INA3221 channel: a power file (mW), or a voltage (mV) and a current (mA) file."""

    name: str
    files: tuple[Path, ...]  # (power,) or (voltage, current)

    def read_w(self) -> float:
        reading = math.prod(_read_number(path) for path in self.files)  # mW, or mV × mA = µW
        return reading / (1000.0 if len(self.files) == 1 else 1e6)


def _read_number(path: Path, kind: type[float] | type[int] = float, what: str = "a number") -> Any:
    text = _read(path)
    try:
        return kind(text)
    except ValueError:
        raise DeviceError(f"{path} does not hold {what}: {text[:40]!r}") from None


def find_rails(root: Path) -> list[Rail]:
    """Every INA3221 rail: JetPack 4 iio (``rail_name_N``, ``in_powerN_input`` mW), then JetPack 5/6 hwmon
    (``inN_label``, ``inN_input`` mV, ``currN_input`` mA); names made unique (two chips may repeat one)."""
    found = []
    for dev in sorted(root.glob(INA3221X_IIO_GLOB)):
        for name_file in sorted(dev.glob("rail_name_*")):
            power = dev / f"in_power{name_file.name.rsplit('_', 1)[-1]}_input"
            name = _read(name_file)
            if name and power.is_file():
                found.append(Rail(name, (power,)))
    for dev in sorted(root.glob(INA3221_HWMON_GLOB)):
        for label_file in sorted(dev.glob("in*_label")):
            channel = label_file.name[len("in") : -len("_label")]
            volt, curr = dev / f"in{channel}_input", dev / f"curr{channel}_input"
            name = _read(label_file)
            if name and name.upper() != "NC" and volt.is_file() and curr.is_file():
                found.append(Rail(name, (volt, curr)))
    rails, seen = [], set()
    for rail in found:
        name, n = rail.name, 2
        while name in seen:
            name, n = f"{rail.name}#{n}", n + 1
        seen.add(name)
        rails.append(Rail(name, rail.files))
    return rails


def _is_total_name(name: str) -> bool:
    tokens = [t for t in re.split(r"[^A-Z0-9]+", name.upper()) if t]
    return "IN" in tokens or any(t.startswith("VIN") for t in tokens)


def total_rail(rails: list[Rail]) -> Rail | None:
    """The board's input rail (what a wall-power cap limits); None when no rail looks like one."""
    by_name = {r.name.upper(): r for r in rails}
    named = next((by_name[name] for name in TOTAL_RAILS if name in by_name), None)
    return named or next((r for r in rails if _is_total_name(r.name)), None)


class JetsonBoard(Device):
    """A Jetson: pins the GPU by writing devfreq min_freq == max_freq, reads power from INA3221."""

    def __init__(self, spec: str, board: str, model: str, root: Path) -> None:
        self.spec, self.board, self.model, self.root = spec, board, model, root
        self.devfreq = find_devfreq(root, board)
        self._table, self._table_error = [], ""
        try:
            self._table = [] if self.devfreq is None else _parse_table(self.devfreq / "available_frequencies")
        except DeviceError as exc:  # said by every command that needs the knob
            self._table_error = str(exc)
        self._rails = find_rails(root)
        self._total = total_rail(self._rails)
        self.has_power_sensor = bool(self._rails)

    def _devfreq_file(self, name: str) -> Path:
        if self.devfreq is None:
            raise DeviceError(f"{self.spec}: no GPU devfreq node found under {self.root}")
        return self.devfreq / name

    def _read_freq(self, name: str) -> int:
        return int(_read_number(self._devfreq_file(name), int, "a frequency in Hz"))

    def _pin_order(self, lo: int) -> tuple[str, str]:
        """The devfreq files to write, ordered so that min ≤ max holds after every single write."""
        return ("max_freq", "min_freq") if lo > self._read_freq("max_freq") else ("min_freq", "max_freq")

    def physical_key(self) -> str | None:
        """The board name and the GPU devfreq node's real path: one key however the board was named."""
        if self.devfreq is None:
            return None
        node = os.path.realpath(self.devfreq)
        return f"{self.board}@{hashlib.sha256(node.encode()).hexdigest()[:12]}"

    def frequencies(self) -> list[int]:
        if self._table_error:
            raise DeviceError(self._table_error)
        return list(self._table)

    def current_frequency(self) -> int | None:
        return None if self.devfreq is None else self._read_freq("cur_freq")

    def clock_in_force(self) -> int | None:
        """The governor's ceiling (`max_freq`): under load the GPU runs at it."""
        return None if self.devfreq is None else self._read_freq("max_freq")

    def pin_refusal(self) -> str | None:
        """Refused when min_freq or max_freq is not writable by this process (checked with access(2))."""
        if self.devfreq is None:
            return None
        for name in ("min_freq", "max_freq"):
            path = self._devfreq_file(name)
            effective = os.access in os.supports_effective_ids  # the euid a write would run as
            if path.exists() and not os.access(path, os.W_OK, effective_ids=effective):
                return f"writing {path} needs root"
        return None

    def _write_pin(self, hz: int) -> None:
        for name in self._pin_order(hz):
            _write_sysfs(self._devfreq_file(name), str(hz))

    def snapshot(self) -> dict[str, Any]:
        if self.devfreq is None:
            return {}
        governor = self.devfreq / "governor"
        state = {"governor": _read(governor) if governor.is_file() else None}
        return state | {name: _read(self.devfreq / name) for name in ("min_freq", "max_freq")}

    def apply_snapshot(self, state: dict[str, Any]) -> None:
        """Put back the saved strings (an empty state: the full range); a bad one is a BadRecordError."""
        if self.devfreq is None:
            return
        if state:
            saved = _saved_state(state)
            if isinstance(saved, str):
                raise BadRecordError(self.physical_key() or self.board, saved, self.spec)
            lo, hi, governor = saved
        else:
            table = self.frequencies()
            lo, hi, governor = str(table[0]), str(table[-1]), None
        for name in self._pin_order(int(lo)):
            self._write_if_different(name, lo if name == "min_freq" else hi)
        if governor is not None:
            self._write_if_different("governor", governor)

    def _write_if_different(self, name: str, value: str) -> None:
        path = self._devfreq_file(name)
        if _read(path) != value:
            _write_sysfs(path, value)

    def rails(self) -> dict[str, float]:
        return {rail.name: rail.read_w() for rail in self._rails}

    def read_power_w(self) -> float:
        """The board's input rail; without a recognised one, the sum of all rails."""
        if not self._rails:
            raise DeviceError(f"{self.spec} ({self.model}): no INA3221 power rails found under {self.root}")
        return self._total.read_w() if self._total is not None else sum(rail.read_w() for rail in self._rails)

    def memory_bytes(self) -> int:
        """MemTotal: the GPU shares the board's memory with the CPU."""
        path = self.root / "proc/meminfo"
        for line in _read(path).splitlines():
            key, _, rest = line.partition(":")
            if key == "MemTotal":
                value, *unit = rest.split()
                return int(value) * (1024 if unit and unit[0].lower() == "kb" else 1)
        raise DeviceError(f"{path} has no MemTotal line")

    def describe(self) -> dict[str, Any]:
        return super().describe() | {
            "rails": [rail.name for rail in self._rails],
            "total_rail": self._total.name if self._total is not None else None,
            "model": self.model,
            "devfreq": str(self.devfreq) if self.devfreq is not None else None,
        }


def open_jetson(spec: str) -> JetsonBoard:
    """``jetson`` detects the board; ``jetson-nano`` etc. must match what the device tree says."""
    root = sysfs_root()
    model = read_model(root)
    if model is None:
        raise DeviceError(f"no Jetson found under {root} (/{MODEL_FILE} missing); {NO_JETSON_HINT}")
    board = board_name(model, read_compatible(root))
    if board is None:
        raise DeviceError(f"no Jetson found under {root}: the device tree says {model!r}; {NO_JETSON_HINT}")
    if spec not in ("jetson", board):
        raise DeviceError(
            f"device spec {spec!r} does not match this board: it is a {board} ({model}); "
            f"use the spec jetson or {board}"
        )
    return JetsonBoard(spec, board, model, root)
