"""How long `PowerAware` waits for nodes: one record, given to the strategy when it is made.

Flower's own sampling waits forever for a node that died; the wrapper instead gathers the fleet once,
waits a bounded time for nodes it has seen before, and bounds each question it asks a node. The three
bounds belong together (a deployment tunes them together: slow links, boards that reboot), so they
are one argument, not three.
"""

from __future__ import annotations

from dataclasses import dataclass

from powerctl.files.mapping import Integer, Number, check_arguments


@dataclass(frozen=True)
class NodeWaits:
    """The waits of a `PowerAware` run.

    Parameters
    ----------
    min_available_nodes : int
        Wait once, before the first round, for this many nodes (0: leave it to the inner strategy).
    rejoin_wait_s : float
        After that, each round waits up to this long for the nodes seen before, then goes on with
        whoever is connected.
    query_timeout_s : float
        How long a question to a node (who it is, its plan) may take (> 0).
    """

    min_available_nodes: int = 0
    rejoin_wait_s: float = 30.0
    query_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        checked = check_arguments(  # kept as checked: plain numbers where numpy's were given
            "NodeWaits",
            min_available_nodes=(self.min_available_nodes, Integer(0)),
            rejoin_wait_s=(self.rejoin_wait_s, Number(0.0, unit="seconds")),
            query_timeout_s=(self.query_timeout_s, Number(0.0, above=True, unit="seconds")),
        )
        for name, value in checked.items():
            object.__setattr__(self, name, value)
