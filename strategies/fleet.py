"""The fleet: the board and power cap of each virtual node (which has only its `partition-id`), as a
table (``"sim:jetson-nano@3.5, sim:jetson-tx2nx@none"``, entry i % len for partition i) or a YAML file
(``groups:`` or ``boards:``, each {device, power-cap-w, count, availability})."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from powerctl.errors import PowerctlError
from powerctl.files.mapping import Integer, Invalid, Number, Text, mapping_reader
from powerctl.files.readfile import YAML_LIMIT, read_bytes
from powerctl.selection.capsource import (
    POWER_CAP,
    CapSource,
    ConstantCap,
    InvalidPowerCapError,
    ScheduleCap,
    parse_cap_source,
)

APP_DIR = Path(__file__).resolve().parents[1]  # relative run config paths start here
FLEET_KEYS = ("device", "power-cap-w", "count", "availability")
MAX_BOARDS = 100_000  # a sampled population this large runs (docs/results/fleets.md); a typo is one line
YAML_SUFFIXES = (".yaml", ".yml")
FILE_NAME = re.compile(r"\.[A-Za-z]\w{0,4}$")  # a file's suffix such as .json: no device spec has one


class NodeConfigError(PowerctlError):
    """An unusable node config or fleet entry; the text names the key and the value."""


@dataclass(frozen=True)
class FleetEntry:
    device: str
    power_cap_w: float | None  # the cap at t = 0
    group: int = 0  # the fleet file's group this board came from
    cap_source: CapSource | None = None  # schedule, trace or live file (None: the constant cap)
    availability: float | None = None  # chance to be available in a sampled round (None: the run's)

    @property
    def power_cap_schedule(self) -> tuple[tuple[float, float | None], ...] | None:
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


def board_cap_problem(device: str, source: CapSource) -> str | None:
    """Why a simulated board can never run under this cap (every value below its least power), or None."""
    caps = getattr(source, "watts", (None,))  # a live file: what it will say is not known in advance
    if None in caps or not_simulated(device) is not None:
        return None  # uncapped at times, or no board model (an unknown sim board fails when opened)
    from powerctl.devices.boards import board_model

    least = board_model(device.removeprefix("sim:")).least_power_w()
    if (highest := max(caps)) >= least:
        return None
    return (
        f"a cap of {highest:g} W is below anything {device} can run (its least power is {least:.2f} W): "
        "raise it, or give none"
    )


def checked_cap_source(value: Any, device: str, where: str, base_dir: Path | None = None) -> CapSource:
    """A `power-cap-w` (node config or fleet entry) → its source, or one NodeConfigError line naming
    `where`: unparsable, or below anything the board can run."""
    try:
        source = parse_cap_source(value, where, base_dir)
    except InvalidPowerCapError as exc:
        raise NodeConfigError(str(exc)) from None
    if (problem := board_cap_problem(device, source)) is not None:
        raise NodeConfigError(f"{where}: {problem}")
    return source


def device_problem(device: str) -> str | None:
    """Why `device` is no device spec (nothing opened), or None."""
    from powerctl.devices import check_spec
    from powerctl.errors import DeviceError

    if "/" in device or FILE_NAME.search(device):
        return f"names a file, not a device (a fleet file is YAML: {' or '.join(YAML_SUFFIXES)})"
    try:
        check_spec(device)
    except DeviceError as exc:
        return str(exc)
    return None


def not_simulated(device: str) -> str | None:
    """Why `device` is not a simulated board, or None."""
    from powerctl.devices.simulated import SIM_BOARDS

    kind, _, name = device.partition(":")
    if kind == "sim" and name in SIM_BOARDS:
        return None
    known = ", ".join(f"sim:{n}" for n in SIM_BOARDS)
    return f"must be a simulated board ({known}), got {device!r}"


def fleet_table(text: str) -> list[FleetEntry]:
    """``DEVICE[@CAP], ...`` (CAP in W, or none) → entries in order; a problem raises `Invalid`."""
    if not text.strip():
        raise Invalid(f"is empty ({text!r}); e.g. 'sim:jetson-nano@3.5'")
    items = [t.strip() for t in text.replace(";", ",").split(",")]
    if len(items) > MAX_BOARDS:
        raise Invalid(f"has {len(items)} entries; a fleet has at most {MAX_BOARDS} boards")
    entries = []
    for n, item in enumerate(items, start=1):
        if not item:
            raise Invalid(
                f"entry {n} is empty in {text!r} (a comma too many?); entries are DEVICE@CAP separated "
                "by commas, e.g. 'sim:jetson-nano@3.5, sim:jetson-tx2nx@none'"
            )
        device, at, cap = (part.strip() for part in item.partition("@"))
        if not device:
            raise Invalid(f"entry {item!r} has no device (e.g. sim:jetson-nano@3.5)")
        if at and not cap:
            raise Invalid(f"entry {item!r} has no cap after '@': give watts or none (e.g. {device}@none)")
        if problem := device_problem(device):
            raise Invalid(f"entry {item!r}: {problem}")
        try:
            watts = POWER_CAP(cap)
        except Invalid as exc:
            hint = "; entries are separated by commas" if "@" in cap else ""
            raise Invalid(f"entry {item!r}: its cap {exc}{hint}") from None
        if problem := board_cap_problem(device, ConstantCap(watts)):
            raise Invalid(f"entry {item!r}: {problem}")
        entries.append(FleetEntry(device, watts))
    return entries


def parse_fleet_groups(
    groups: Any, where: str, key: str = "groups", base_dir: Path | None = None
) -> list[FleetEntry]:
    """A fleet file's groups → one entry per board, in order; an error names its place in the file.
    Cap file paths start at `base_dir` (default: the folder of `where`)."""
    if not isinstance(groups, list) or not groups:
        raise NodeConfigError(f"{where}: {key!r} must be a non-empty list of groups, got {groups!r}")
    entries: list[FleetEntry] = []
    for i, raw in enumerate(groups):
        r = mapping_reader(raw, f"{where}: {key}[{i}]", NodeConfigError, FLEET_KEYS)
        device = r.value("device", Text(what="a device spec such as sim:jetson-nano"))
        if problem := device_problem(device):
            raise NodeConfigError(f"{r.where}: 'device': {problem}")
        count = r.value("count", Integer(1), 1)
        if len(entries) + count > MAX_BOARDS:
            raise NodeConfigError(
                f"{r.where}: 'count': a fleet has at most {MAX_BOARDS} boards, got {count} more"
            )
        source = checked_cap_source(
            r.get("power-cap-w", None), device, f"{r.where}: 'power-cap-w'", base_dir or Path(where).parent
        )
        changing = None if isinstance(source, ConstantCap) else source  # a one-value schedule stays one
        availability = r.value("availability", Number(0.0, 1.0), None)
        entries += [FleetEntry(device, source.cap_at(0.0), i, changing, availability)] * count
    return entries


def app_path_of(text: str) -> Path:
    """A path named in the run config: absolute, or relative to the app folder."""
    path = Path(text.strip()).expanduser()
    return path if path.is_absolute() else APP_DIR / path


def fleet_file(value: str) -> Path | None:
    """The fleet file `fleet` names, which must exist (else `Invalid`); None when it is a table."""
    if not value.strip().endswith(YAML_SUFFIXES):
        return None
    path = app_path_of(value)
    if not path.is_file():
        raise Invalid(f"names no such fleet file: {path}")
    return path


def fleet_entry(fleet: Any, partition_id: int) -> FleetEntry:
    """Partition i runs on entry i % len: any number of virtual nodes maps onto the table."""
    return fleet[partition_id % len(fleet)]


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        problem=f"key {key!r} is given twice (lines {seen[key].line + 1} and "
                        f"{key_node.start_mark.line + 1}); keep one",
                        problem_mark=key_node.start_mark,
                    )
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


MAX_YAML_VALUES = 1_000_000  # once aliases are expanded; a 4 MB file without aliases holds fewer


def _check_expansion(root: yaml.Node, path: Path) -> None:
    """Refuse a document whose aliases expand to more than MAX_YAML_VALUES values, or that holds itself,
    before it is built (a "billion laughs"). One frame a level, fewer than the composer's: no deeper limit."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: yaml.Node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        if id(node) in open_:
            raise NodeConfigError(f"{path}: an alias (*name) refers to a value that holds it; remove it")
        open_.add(id(node))
        total = 1
        if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
            for child in node.value:
                for c in child if isinstance(node, yaml.MappingNode) else (child,):
                    total += size(c)
        if total > MAX_YAML_VALUES:
            raise NodeConfigError(
                f"{path}: its aliases (*name) expand to more than {MAX_YAML_VALUES:,} values; "
                "write the values out or use fewer aliases"
            )
        sizes[id(node)] = total
        return total

    size(root)


def read_yaml(path: Path) -> Any:
    """A YAML document, or one NodeConfigError line (unreadable, not text, not YAML, a key twice)."""
    try:
        text = read_bytes(path, limit=YAML_LIMIT, what="a fleet file (YAML)", error=NodeConfigError).decode()
    except OSError as exc:
        raise NodeConfigError(f"{path}: cannot read the fleet file ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise NodeConfigError(f"{path}: not a text file (not UTF-8); a fleet file is YAML text") from None
    try:
        loader = _UniqueKeyLoader(text)  # a SafeLoader subclass: no arbitrary objects
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_expansion(node, path)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.constructor.ConstructorError as exc:
        raise NodeConfigError(f"{path}: {exc.problem}") from None
    except yaml.YAMLError as exc:
        raise NodeConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None


def load_fleet_file(path: Path) -> list[FleetEntry]:
    """A YAML fleet file: ``groups:`` (a fleet runner's file) or ``boards:`` (a bare list)."""
    doc = read_yaml(path)
    if isinstance(doc, dict) and "groups" in doc:
        return parse_fleet_groups(doc["groups"], str(path), "groups")
    if isinstance(doc, dict) and set(doc) == {"boards"}:
        return parse_fleet_groups(doc["boards"], str(path), "boards")
    raise NodeConfigError(f"{path}: expected a list of boards under 'groups:' (or 'boards:')")


@lru_cache(maxsize=8)
def load_fleet(value: str) -> tuple[FleetEntry, ...]:
    """The run config's `fleet` (a YAML path or a table), read once per process."""
    try:
        path = fleet_file(value)
        return tuple(load_fleet_file(path) if path is not None else fleet_table(value))
    except Invalid as exc:
        raise NodeConfigError(f"run config: 'fleet' {exc}") from None
