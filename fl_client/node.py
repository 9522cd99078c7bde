"""Which device, power cap and data a node has: node config first, then the run's fleet table.

The node config keys are the same in simulation and deployment (DESIGN §6): `device` (a powerctl spec),
`power-cap-w` (absent = no cap), `data` (a dataset spec), and optionally `name`. A deployed SuperNode
gets them from `--node-config`. A virtual node in Flower 1.41's simulation gets only `partition-id` and
`num-partitions`, so the run config's `fleet` maps partition ids to boards and caps: a table
(``"sim:jetson-nano@3.5, sim:jetson-tx2nx@6, sim:jetson-nano@none"``, entry i % len for partition i)
or a YAML file (``boards: [{device: sim:jetson-nano, power-cap-w: 3.5, count: 2}, ...]``).
This module is the one place that mapping lives; the fleet runner reuses it.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from powerctl.errors import PowerctlError

NODE_KEYS = ("device", "power-cap-w", "data", "name", "partition-id", "num-partitions")
FLEET_KEYS = ("device", "power-cap-w", "count")
APP_DIR = Path(__file__).resolve().parents[1]
"""The app's root (the project folder, or Flower's copy of it): relative fleet paths start here."""


class NodeConfigError(PowerctlError):
    """A node config or fleet entry that cannot be used; the text names the key and the value."""


@dataclass(frozen=True)
class FleetEntry:
    device: str
    power_cap_w: float | None

    def label(self) -> str:
        return f"{self.device}@{'none' if self.power_cap_w is None else f'{self.power_cap_w:g}'}"


@dataclass(frozen=True)
class NodeSettings:
    """What this node trains on: its device, its cap and where its data comes from."""

    device: str
    power_cap_w: float | None
    data: str | None
    """A dataset spec of its own, or None: a share of the run's default data."""
    partition_id: int | None
    num_partitions: int | None
    key: str
    """How the server names this node in reports: `name`, else partition-N, else device@host."""


def parse_power_cap(value: Any, where: str) -> float | None:
    """None/"none" = no cap; otherwise a positive finite number of watts."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "")):
        return None
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise NodeConfigError(
                f"{where}: power-cap-w must be a number of watts or none, got {value!r}"
            ) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NodeConfigError(f"{where}: power-cap-w must be a number of watts, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise NodeConfigError(f"{where}: power-cap-w must be a positive number of watts, got {value!r}")
    return float(value)


def parse_fleet_table(text: str) -> list[FleetEntry]:
    """``DEVICE[@CAP], ...`` (CAP in W, or none) → entries in order."""
    entries = []
    for i, item in enumerate(t.strip() for t in text.replace(";", ",").split(",")):
        if not item:
            continue
        device, _, cap = item.partition("@")
        if not device.strip():
            raise NodeConfigError(f"run config 'fleet' entry {i}: {item!r} has no device")
        entries.append(
            FleetEntry(device.strip(), parse_power_cap(cap or None, f"run config 'fleet' {item!r}"))
        )
    if not entries:
        raise NodeConfigError(f"run config 'fleet' is empty ({text!r}); e.g. 'sim:jetson-nano@3.5'")
    return entries


def load_fleet_file(path: Path) -> list[FleetEntry]:
    """A YAML fleet: ``boards:`` a list of {device, power-cap-w (absent/none = no cap), count}."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise NodeConfigError(f"fleet file {path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise NodeConfigError(f"fleet file {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("boards"), list) or not doc["boards"]:
        raise NodeConfigError(f"fleet file {path}: expected a non-empty list under 'boards:'")
    entries: list[FleetEntry] = []
    for i, raw in enumerate(doc["boards"]):
        where = f"fleet file {path}: boards[{i}]"
        if not isinstance(raw, dict):
            raise NodeConfigError(f"{where}: expected a mapping with device, power-cap-w, count")
        unknown = sorted(set(raw) - set(FLEET_KEYS))
        if unknown:
            raise NodeConfigError(f"{where}: unknown key {unknown[0]!r}; keys are {', '.join(FLEET_KEYS)}")
        device = raw.get("device")
        if not isinstance(device, str) or not device.strip():
            raise NodeConfigError(f"{where}: 'device' must be a device spec such as sim:jetson-nano")
        count = raw.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise NodeConfigError(f"{where}: 'count' must be a positive integer, got {count!r}")
        cap = parse_power_cap(raw.get("power-cap-w"), where)
        entries += [FleetEntry(device.strip(), cap)] * count
    return entries


@lru_cache(maxsize=8)
def load_fleet(value: str) -> tuple[FleetEntry, ...]:
    """The run config's `fleet`: a YAML path (absolute, or relative to the app) or a table.

    Read once per process: every message of a run carries the same run config."""
    text = value.strip()
    if text.endswith((".yaml", ".yml")):
        path = Path(text).expanduser()
        if not path.is_absolute():
            path = APP_DIR / path
        if not path.is_file():
            raise NodeConfigError(f"run config 'fleet': no such fleet file {path}")
        return tuple(load_fleet_file(path))
    return tuple(parse_fleet_table(text))


def fleet_entry(fleet: Sequence[FleetEntry], partition_id: int) -> FleetEntry:
    """Partition i runs on entry i % len: any number of virtual nodes maps onto the table."""
    return fleet[partition_id % len(fleet)]


def _int_key(node_config: Any, key: str, minimum: int) -> int | None:
    if key not in node_config:
        return None
    v = node_config[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise NodeConfigError(f"node config {key!r} must be an integer ≥ {minimum}, got {v!r}")
    return int(v)


def resolve_node(node_config: Any, run_config: Any) -> NodeSettings:
    """This node's settings: its node config, completed by the run's fleet for virtual nodes."""
    pid = _int_key(node_config, "partition-id", 0)
    num = _int_key(node_config, "num-partitions", 1)
    if pid is not None and num is not None and pid >= num:
        raise NodeConfigError(f"node config 'partition-id' {pid} is not below 'num-partitions' {num}")
    if "device" in node_config:
        device = node_config["device"]
        if not isinstance(device, str) or not device.strip():
            raise NodeConfigError(f"node config 'device' must be a device spec string, got {device!r}")
        device = device.strip()
        cap = parse_power_cap(node_config.get("power-cap-w"), "node config")
    else:
        fleet_text = run_config.get("fleet", "")
        if pid is None or not isinstance(fleet_text, str) or not fleet_text.strip():
            raise NodeConfigError(
                "node config has no 'device' (e.g. --node-config 'device=\"jetson\" power-cap-w=5') "
                "and the run has no 'fleet' to map its partition id to a board"
            )
        entry = fleet_entry(load_fleet(fleet_text), pid)
        device = entry.device
        cap = entry.power_cap_w
        if "power-cap-w" in node_config:
            cap = parse_power_cap(node_config["power-cap-w"], "node config")
    data = node_config.get("data")
    if data is not None and (not isinstance(data, str) or not data.strip()):
        raise NodeConfigError(f"node config 'data' must be a dataset spec string, got {data!r}")
    if data is None and pid is None:
        raise NodeConfigError(
            "node config has no 'data' (e.g. data=\"cifar10:/data/cifar\") and no 'partition-id' "
            "to take a share of the run's client-data"
        )
    if data is None and num is None:
        raise NodeConfigError(
            f"node config has 'partition-id' {pid} but no 'num-partitions': the share of the run's "
            "client-data it takes is undefined"
        )
    name = node_config.get("name")
    if name is not None and (not isinstance(name, str) or not name.strip()):
        raise NodeConfigError(f"node config 'name' must be a non-empty string, got {name!r}")
    key = name or (f"partition-{pid}" if pid is not None else f"{device}@{socket.gethostname()}")
    return NodeSettings(device, cap, data.strip() if data else None, pid, num, key)
