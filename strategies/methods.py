"""Which method each node runs and whether it trains the real model (scale mode), per round."""

from __future__ import annotations

import dataclasses
import math

from powerctl.selection.methods import run_method_named
from strategies.power_aware import NodeInstructions
from strategies.protocol import TrainInstructions
from strategies.rounds import NodeInfo


def trains_real_model(partition_id: int | None, real_share: float) -> bool:
    """Partition i trains the real model when ⌊(i+1)·s⌋ > ⌊i·s⌋: a share s spread evenly over the ids
    (s = 0.25: partitions 3, 7, 11, ...). A node without a partition id (deployment) always trains."""
    if real_share >= 1.0 or partition_id is None:
        return True
    return math.floor((partition_id + 1) * real_share + 1e-9) > math.floor(partition_id * real_share + 1e-9)


def for_method(method: str, real_share: float = 1.0) -> NodeInstructions:
    """Node instructions that run `method`'s client method on every node, the real model on `real_share`
    of them."""
    client_method = run_method_named(method).client_method

    def instruct(node: NodeInfo, server_round: int, base: TrainInstructions) -> TrainInstructions:
        stand_in = not trains_real_model(node.partition_id, real_share)
        return dataclasses.replace(
            base, server_round=server_round, node_key=node.key, method=client_method, stand_in=stand_in
        )

    return instruct
