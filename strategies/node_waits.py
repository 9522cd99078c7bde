"""How long `PowerAware` waits for nodes (Flower's own sampling waits forever for a node that died)."""

from __future__ import annotations

from dataclasses import dataclass

from powerctl.files.mapping import Integer, Number, check_arguments


@dataclass(frozen=True)
class NodeWaits:
    """The waits of a `PowerAware` run."""

    min_available_nodes: int = 0  # waited for once, before the first round (0: the inner strategy's)
    rejoin_wait_s: float = 30.0  # each round waits this long for the nodes seen before
    query_timeout_s: float = 120.0  # for a question to a node (who it is, its plan); > 0

    def __post_init__(self) -> None:
        checked = check_arguments(  # kept as checked: plain numbers where numpy's were given
            "NodeWaits",
            min_available_nodes=(self.min_available_nodes, Integer(0)),
            rejoin_wait_s=(self.rejoin_wait_s, Number(0.0, unit="seconds")),
            query_timeout_s=(self.query_timeout_s, Number(0.0, above=True, unit="seconds")),
        )
        for name, value in checked.items():
            object.__setattr__(self, name, value)
