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

from powerctl.capsource import CapSource, CapSourceError, ConstantCap, ScheduleCap, parse_cap_source
from powerctl.errors import PowerctlError

NODE_KEYS = ("device", "power-cap-w", "data", "name", "partition-id", "num-partitions")
FLEET_KEYS = ("device", "power-cap-w", "count")
MAX_BOARDS = 10_000
"""Most boards a fleet (and virtual nodes a simulation) may have: each is a Ray actor's worth of state,
and a typo (count: 1000000000) must be one line, not a machine out of memory."""
APP_DIR = Path(__file__).resolve().parents[1]
"""The app's root (the project folder, or Flower's copy of it): relative fleet paths start here."""


class NodeConfigError(PowerctlError):
    """A node config or fleet entry that cannot be used; the text names the key and the value."""


CapSchedule = tuple[tuple[float, float | None], ...]
"""A power cap over time: ((t_s, W or None), ...), t_s ascending from 0."""


@dataclass(frozen=True)
class FleetEntry:
    device: str
    power_cap_w: float | None
    """The cap at t = 0: the constant, or a schedule's or trace's first value."""
    group: int = 0
    """Index of the fleet file's group this board came from."""
    cap_source: CapSource | None = None
    """The schedule, trace or live file the group follows (None: the constant `power_cap_w`)."""

    def caps(self) -> CapSource | None:
        """The changing cap this board follows, None for a constant one."""
        return self.cap_source

    @property
    def power_cap_schedule(self) -> CapSchedule | None:
        """The full schedule when the file gave one."""
        return self.cap_source.steps if isinstance(self.cap_source, ScheduleCap) else None

    def label(self) -> str:
        return f"{self.device}@{'none' if self.power_cap_w is None else f'{self.power_cap_w:g}'}"

    def cap_label(self) -> str:
        """The cap as a report shows it: W, none, the schedule, or the trace / live file."""
        if (schedule := self.power_cap_schedule) is not None:
            steps = ", ".join(f"{t:g}s:{'none' if w is None else f'{w:g}'}" for t, w in schedule)
            return f"schedule [{steps}]"
        if self.cap_source is not None:
            return self.cap_source.describe()
        return "none" if self.power_cap_w is None else f"{self.power_cap_w:g}"


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
    cap_source: CapSource | None = None
    """The node's cap over time (powerctl.capsource); None: the constant `power_cap_w`."""

    def caps(self) -> CapSource:
        """The cap over time this node must stay under (a constant when nothing else was given)."""
        return self.cap_source if self.cap_source is not None else ConstantCap(self.power_cap_w)


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


def quoted(value: Any) -> str:
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _cap_value(value: Any, where: str) -> float | None:
    """A number of watts > 0 or none, for a fleet file (the message names the place in the file)."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise NodeConfigError(f"{where}: expected a number > 0 or none, got {quoted(value)}")
    return float(value)


def parse_cap_schedule(value: Any, where: str) -> tuple[float | None, ScheduleCap | None]:
    """`power-cap-w` of a fleet group: a constant, none, or ``[[t_s, W], ...]`` from t_s = 0 ascending
    (`powerctl.capsource.ScheduleCap`). Returns (the cap at t = 0, the schedule or None)."""
    if not isinstance(value, list):
        return _cap_value(value, where), None
    try:
        schedule = ScheduleCap.from_pairs(value, where)
    except CapSourceError as exc:
        raise NodeConfigError(str(exc)) from None
    return schedule.cap_at(0.0), schedule


def _is_source_text(value: Any) -> bool:
    """A cap written as text that is more than a number: a schedule, a trace or a live file."""
    return isinstance(value, str) and value.strip().startswith(("[", "trace:", "live:"))


def _source(value: Any, where: str, base_dir: Path | None) -> CapSource:
    try:
        return parse_cap_source(value, where, base_dir)
    except CapSourceError as exc:
        raise NodeConfigError(str(exc)) from None


def parse_fleet_groups(
    groups: Any, where: str, key: str = "groups", base_dir: Path | None = None
) -> list[FleetEntry]:
    """A fleet file's list of groups {device, count, power-cap-w} → one entry per board, in order.

    Every error names the place in the file, e.g. ``fleet.yaml: groups[1].power-cap-w: ...``. Trace
    and live-file paths start at `base_dir` (default: the folder of `where`)."""
    if not isinstance(groups, list) or not groups:
        raise NodeConfigError(f"{where}: {key}: expected a non-empty list of groups, got {quoted(groups)}")
    entries: list[FleetEntry] = []
    for i, raw in enumerate(groups):
        here = f"{where}: {key}[{i}]"
        if not isinstance(raw, dict):
            raise NodeConfigError(
                f"{here}: expected a mapping with {', '.join(FLEET_KEYS)}, got {quoted(raw)}"
            )
        unknown = sorted(str(k) for k in set(raw) - set(FLEET_KEYS))
        if unknown:
            raise NodeConfigError(f"{here}: unknown key {unknown[0]!r}; keys are {', '.join(FLEET_KEYS)}")
        device = raw.get("device")
        if not isinstance(device, str) or not device.strip():
            raise NodeConfigError(
                f"{here}.device: expected a device spec such as sim:jetson-nano, got {quoted(device)}"
            )
        count = raw.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise NodeConfigError(f"{here}.count: expected an integer ≥ 1, got {quoted(count)}")
        if len(entries) + count > MAX_BOARDS:
            raise NodeConfigError(f"{here}.count: a fleet has at most {MAX_BOARDS} boards, got {count} more")
        value = raw.get("power-cap-w")
        source: CapSource | None
        if _is_source_text(value):
            source = _source(value, f"{here}.power-cap-w", base_dir or Path(where).parent)
            cap = source.cap_at(0.0)
        else:
            cap, source = parse_cap_schedule(value, f"{here}.power-cap-w")
        entries += [FleetEntry(device.strip(), cap, i, source)] * count
    return entries


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently:
    a second `groups:` would replace the first without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)  # type: ignore[no-untyped-call]
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key!r} is given twice (lines {seen[key].line + 1} and "
                        f"{key_node.start_mark.line + 1}); keep one",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> Any:
    """A YAML document, or one NodeConfigError line (unreadable, not text, not YAML, a key twice)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise NodeConfigError(f"{path}: cannot read the fleet file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise NodeConfigError(f"{path}: not a text file (not UTF-8); a fleet file is YAML text") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.constructor.ConstructorError as exc:
        raise NodeConfigError(f"{path}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise NodeConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None


def load_fleet_file(path: Path) -> list[FleetEntry]:
    """A YAML fleet: ``groups:`` (a fleet file of `python -m simulations run`, whose other sections the
    fleet runner checks) or ``boards:`` (a bare list of boards), each {device, power-cap-w, count}."""
    doc = read_yaml(path)
    name = str(path)
    if isinstance(doc, dict) and "groups" in doc:
        return parse_fleet_groups(doc["groups"], name, "groups")
    if isinstance(doc, dict) and set(doc) == {"boards"}:
        return parse_fleet_groups(doc["boards"], name, "boards")
    raise NodeConfigError(f"{name}: expected a list of boards under 'groups:' (or 'boards:')")


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


def _node_cap(node_config: Any) -> tuple[float | None, CapSource | None]:
    """The node config's `power-cap-w`: a number or none, or a schedule / trace / live file (relative
    paths from the working directory) → (the cap at t = 0, the changing source or None)."""
    value = node_config.get("power-cap-w")
    if _is_source_text(value):
        source = _source(value, "node config 'power-cap-w'", None)
        return source.cap_at(0.0), None if source.is_constant else source
    return parse_power_cap(value, "node config"), None


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
        cap, cap_source = _node_cap(node_config)
    else:
        fleet_text = run_config.get("fleet", "")
        if pid is None or not isinstance(fleet_text, str) or not fleet_text.strip():
            raise NodeConfigError(
                "node config has no 'device' (e.g. --node-config 'device=\"jetson\" power-cap-w=5') "
                "and the run has no 'fleet' to map its partition id to a board"
            )
        entry = fleet_entry(load_fleet(fleet_text), pid)
        device = entry.device
        cap, cap_source = entry.power_cap_w, entry.caps()
        if "power-cap-w" in node_config:
            cap, cap_source = _node_cap(node_config)
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
    return NodeSettings(device, cap, data.strip() if data else None, pid, num, key, cap_source)
