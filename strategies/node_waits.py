"""How long `PowerAware` waits for nodes (Flower's own sampling waits forever for a node that died)."""

from __future__ import annotations

from dataclasses import dataclass

from powerctl.files.mapping import Integer, Number, check_fields, field_kinds
from powerctl.files.mapping import kind_field as kind


@dataclass(frozen=True)
class NodeWaits:
    """The waits of a `PowerAware` run, kept as checked (plain numbers where numpy's were given)."""

    min_available_nodes: int = kind(Integer(0), 0)  # once, before round 1 (0: the inner strategy's)
    rejoin_wait_s: float = kind(Number(0.0, unit="seconds"), 30.0)  # each round, for the nodes seen before
    query_timeout_s: float = kind(Number(0.0, above=True, unit="seconds"), 120.0)  # a question to a node

    def __post_init__(self) -> None:
        check_fields(self, "NodeWaits", field_kinds(self))
