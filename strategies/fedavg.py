"""The built-in ServerApp's strategy: `PowerAware` around a FedAvg that averages in a fixed order and
precision."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, cast

from flwr.app import ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAvg, Strategy

from powerctl.files.mapping import Integer, Number, check_arguments
from strategies.objectives import NodeWaits
from strategies.power_aware import PowerAware
from strategies.protocol import ARRAYS_KEY, CONFIG_KEY, EXAMPLES_KEY, TrainInstructions
from strategies.rounds import weighted_average


class FedAvgInOrder(FedAvg):
    """Flower's FedAvg averaging by `weighted_average`: the same global model in every run."""

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        valid, _ = self._check_and_log_replies(replies, is_train=True)
        if not valid:
            return None, None
        contents = [msg.content for msg in valid]
        arrays = [next(iter(c.array_records.values())) for c in contents]
        weights = [cast(float, next(iter(c.metric_records.values()))[self.weighted_by_key]) for c in contents]
        items = [(a, float(w)) for a, w in zip(arrays, weights, strict=True)]
        return weighted_average(items, arrays[0]), self.train_metrics_aggr_fn(contents, self.weighted_by_key)


class PowerAwareFedAvg(PowerAware):
    """`PowerAware` around FedAvg (`FedAvgInOrder`): the project's own ServerApp's strategy.

    The sampling parameters are FedAvg's, the rest `PowerAware`'s; `inner` wraps the FedAvg before
    `PowerAware` holds it (e.g. `lambda fedavg: PopulationSampled(fedavg, population)`)."""

    def __init__(
        self,
        *,
        instructions: TrainInstructions,
        fraction_train: float = 1.0,
        fraction_evaluate: float = 1.0,
        min_train_nodes: int = 1,
        min_evaluate_nodes: int = 1,
        waits: NodeWaits = NodeWaits(min_available_nodes=1),
        inner: Callable[[Strategy], Strategy] | None = None,
        **power_aware: Any,
    ) -> None:
        # FedAvg reads them only when a round samples: a NaN there is Flower's error
        checked = check_arguments(
            "PowerAwareFedAvg",
            fraction_train=(fraction_train, Number(0.0, 1.0)),
            fraction_evaluate=(fraction_evaluate, Number(0.0, 1.0)),
            min_train_nodes=(min_train_nodes, Integer(0)),
            min_evaluate_nodes=(min_evaluate_nodes, Integer(0)),
        )
        fedavg: Strategy = FedAvgInOrder(
            **checked,
            min_available_nodes=1,
            arrayrecord_key=ARRAYS_KEY,
            configrecord_key=CONFIG_KEY,
            weighted_by_key=EXAMPLES_KEY,
        )
        if inner is not None:
            fedavg = inner(fedavg)
        super().__init__(fedavg, instructions, waits=waits, **power_aware)
