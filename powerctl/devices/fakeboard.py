"""Fake Jetson sysfs/procfs trees to rehearse on without hardware (`powerctl fake-board`): with
`POWERCTL_SYSFS_ROOT` at one, the `jetson` device pins and restores as on a board; the rails are constants."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from powerctl.errors import PowerctlError

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


def _put(root: Path, rel: str, content: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode())


def _tree(root: Path, model: str, compatible: list[str], mem_kb: int, devfreq: str, freqs: list[int]) -> None:
    """The device tree's model and compatible strings, /proc/meminfo and the GPU's devfreq node."""
    _put(root, "proc/device-tree/model", model + "\x00")
    _put(root, "proc/device-tree/compatible", "".join(c + "\x00" for c in compatible))
    _put(
        root,
        "proc/meminfo",
        f"MemTotal:        {mem_kb} kB\nMemFree:         {mem_kb // 3} kB\n"
        f"MemAvailable:    {mem_kb // 2} kB\nBuffers:           81244 kB\n",
    )
    make_devfreq(root, devfreq, freqs)


def make_devfreq(root: Path, rel: str, freqs: list[int], governor: str = "nvhost_podgov") -> Path:
    """A devfreq node at its full range, at its lowest step, linked (relatively) in /sys/class/devfreq."""
    _put(root, f"{rel}/available_frequencies", " ".join(map(str, freqs)) + "\n")
    _put(root, f"{rel}/cur_freq", f"{freqs[0]}\n")
    _put(root, f"{rel}/min_freq", f"{freqs[0]}\n")
    _put(root, f"{rel}/max_freq", f"{freqs[-1]}\n")
    _put(root, f"{rel}/governor", f"{governor}\n")
    _put(root, f"{rel}/available_governors", f"{governor} userspace performance simple_ondemand\n")
    link = root / "sys/class/devfreq" / Path(rel).name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(root / rel, link.parent))
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
    _put(root, "sys/devices/gpu.0/load", "0\n")
    compatible = ["nvidia,p3449-0000-b00+p3448-0000-b00", "nvidia,jetson-nano", "nvidia,tegra210"]
    _tree(root, "NVIDIA Jetson Nano Developer Kit", compatible, 4059712, NANO_DEVFREQ, NANO_FREQS)
    make_iio_rails(root, "sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0", NANO_RAILS)
    return root


def make_tx2nx_tree(root: Path) -> Path:
    """Jetson TX2 NX on JetPack 4 (T186): devfreq 17000000.gp10b, ina3221x at 2-0040."""
    compatible = ["nvidia,p3509-0000+p3636-0001", "nvidia,tegra186"]
    _tree(root, "NVIDIA Jetson TX2 NX Developer Kit", compatible, 3956468, TX2NX_DEVFREQ, TX2NX_FREQS)
    make_iio_rails(root, "sys/bus/i2c/drivers/ina3221x/2-0040/iio:device0", TX2NX_RAILS)
    return root


def make_orin_tree(root: Path) -> Path:
    """Jetson Orin Nano on JetPack 6: GPU found by scanning /sys/class/devfreq, ina3221 hwmon at 1-0040."""
    compatible = ["nvidia,p3768-0000+p3767-0005", "nvidia,p3767-0005", "nvidia,tegra234"]
    _tree(root, "NVIDIA Jetson Orin Nano Developer Kit", compatible, 7620844, ORIN_DEVFREQ, ORIN_NANO_FREQS)
    # Another devfreq node that is not the GPU, sorted before it: the scan must skip it.
    make_devfreq(root, "sys/devices/platform/bus@0/15340000.vic/devfreq/15340000.vic", [115200000, 729600000])
    make_hwmon_rails(root, "sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon1", ORIN_RAILS)
    return root


KINDS: dict[str, Callable[[Path], Path]] = {
    "jetson-nano": make_nano_tree,
    "jetson-tx2nx": make_tx2nx_tree,
    "jetson-orin-nano": make_orin_tree,
}


def make_fake_board(root: Path, kind: str) -> Path:
    """Write a `kind` board's tree into `root`, which must be new or empty (never over real files)."""
    if kind not in KINDS:
        raise PowerctlError(f"unknown board kind {kind!r}: choose one of {', '.join(KINDS)}")
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise PowerctlError(f"{root} exists and is not an empty folder: give a new folder for the fake board")
    try:
        root.mkdir(parents=True, exist_ok=True)
        return KINDS[kind](root)
    except OSError as exc:
        raise PowerctlError(f"cannot write the fake board in {root}: {exc.strerror or exc}") from None
