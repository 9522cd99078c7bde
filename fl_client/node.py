"""Which device, power cap and data a node has (docs/reference/node-config.md): node config first, then
the run's fleet, which maps a simulated node's `partition-id` to a board."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from powerctl.files.mapping import (
    Custom,
    Flag,
    Integer,
    MappingReader,
    Maybe,
    Text,
    check_fields,
    field_kinds,
    kind_field,
    must_be,
)
from powerctl.selection.capsource import POWER_CAP_VALUE, CapSource, ConstantCap
from strategies.fleet import NodeConfigError, checked_cap_source, fleet_entry, load_fleet

NODE_KEYS = ("device", "power-cap-w", "data", "name", "partition-id", "num-partitions", "pin")
CAP_SOURCE = "a CapSource (powerctl.selection.capsource; a constant cap is power_cap_w)"


def _cap_source(value: Any) -> CapSource:
    """A node's cap over time: a CapSource, checked where the node is made."""
    if not isinstance(value, CapSource):
        raise must_be(CAP_SOURCE, value)
    return value


@dataclass(frozen=True)
class NodeSettings:
    """What this node trains on: its device, its cap and where its data comes from."""

    device: str = kind_field(Text())
    power_cap_w: float | None = kind_field(POWER_CAP_VALUE)
    # a dataset spec of its own, or None: a share of the run's default data
    data: str | None = kind_field(Maybe(Text()))
    partition_id: int | None = kind_field(Maybe(Integer(0)))
    num_partitions: int | None = kind_field(Maybe(Integer(1)))
    key: str = kind_field(Text())  # how reports name it: `name`, else partition-N, else device@host
    # None: the constant `power_cap_w`
    cap_source: CapSource | None = kind_field(Maybe(Custom(_cap_source, CAP_SOURCE)), None)  # noqa: RUF009
    # `open_device(pin=...)`: None, pin where this process may; False, never (a shared GPU); True, pin or fail
    pin: bool | None = kind_field(Maybe(Flag()), None)

    def __post_init__(self) -> None:
        """Made in Python, it holds what a node config would: one ArgumentError line each."""
        check_fields(self, "NodeSettings", field_kinds(self))

    def caps(self) -> CapSource:
        """The cap over time this node must stay under (a constant when nothing else was given)."""
        return self.cap_source if self.cap_source is not None else ConstantCap(self.power_cap_w)


def resolve_node(node_config: Any, run_config: Any, *, needs_data: bool = True) -> NodeSettings:
    """This node's settings: its node config, completed by the run's fleet for virtual nodes."""
    # a misspelt key (powercap-w) must not leave the node uncapped without a word
    r = MappingReader(node_config, "node config", NodeConfigError).only(NODE_KEYS)
    pid = r.value("partition-id", Integer(0), None)
    num = r.value("num-partitions", Integer(1), None)
    if pid is not None and num is not None and pid >= num:
        raise NodeConfigError(f"node config 'partition-id' {pid} is not below 'num-partitions' {num}")
    if "device" in r:
        device = r.value("device", Text(what="a device spec such as sim:jetson-nano"))
    else:
        fleet_text = MappingReader(run_config, "run config", NodeConfigError).value("fleet", Text(True), "")
        if pid is None or not fleet_text:
            raise NodeConfigError(
                "node config has no 'device' (e.g. --node-config 'device=\"jetson\" power-cap-w=5') "
                "and the run has no 'fleet' to map its partition id to a board"
            )
        entry = fleet_entry(load_fleet(fleet_text), pid)
        device, cap, cap_source = entry.device, entry.power_cap_w, entry.cap_source
    if "device" in r or "power-cap-w" in r:  # the node config's cap: the one at t = 0 and any changing one
        source = checked_cap_source(node_config.get("power-cap-w"), device, "node config 'power-cap-w'")
        cap, cap_source = source.cap_at(0.0), None if source.is_constant else source
    data = r.value("data", Text(what="a dataset spec such as cifar10:/data/cifar"), None)
    if data is None and pid is None and needs_data:
        raise NodeConfigError(
            "node config has no 'data' (e.g. data=\"cifar10:/data/cifar\") and no 'partition-id' "
            "to take a share of the run's client-data"
        )
    if data is None and num is None and needs_data:
        raise NodeConfigError(
            f"node config has 'partition-id' {pid} but no 'num-partitions': the share of the run's "
            "client-data it takes is undefined"
        )
    name = r.value("name", Text(), None)
    pin = r.value("pin", Flag(), None)
    key = name or (f"partition-{pid}" if pid is not None else f"{device}@{socket.gethostname()}")
    return NodeSettings(device, cap, data, pid, num, key, cap_source, pin)
