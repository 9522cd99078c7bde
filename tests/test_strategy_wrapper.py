"""`PowerAware` around any Flower strategy (issue 27): FedAdam, FedProx and Flower's DP wrappers run a
round with the real ClientApp through an in-process grid; Flower's `Strategy` contract holds."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType
from flwr.serverapp.strategy import (
    DifferentialPrivacyServerSideFixedClipping,
    FedAdam,
    FedAvg,
    FedProx,
    Strategy,
)

from fl_client.app import app as client_app
from strategies.fedavg import PowerAwareFedAvg
from strategies.power_aware import PowerAware
from strategies.protocol import REPORT_KEY, ProtocolError, TrainInstructions
from strategies.rounds import weighted_average
from tests.fake_grid import FakeGrid
from tests.fl_helpers import RUN_CONFIG, initial_state, instructions, relation
from tests.test_fl_strategy import _nodes

EVAL_CONFIG = {"model": "cnn-tiny", "num-classes": 10, "model-overrides": "{}"}
SMALL = {"min_train_nodes": 1, "min_evaluate_nodes": 1, "min_available_nodes": 1}


class Spy:
    """Records what an inner strategy's `aggregate_train` was handed, then lets it aggregate."""

    def __init__(self, strategy: Strategy) -> None:
        self.seen: list[list[Message]] = []
        original = strategy.aggregate_train

        def aggregate_train(server_round: int, replies):
            replies = list(replies)
            self.seen.append(replies)
            return original(server_round, replies)

        strategy.aggregate_train = aggregate_train  # type: ignore[method-assign]


def _start(strategy: Strategy, grid: FakeGrid, rounds: int = 1, **kwargs):
    return strategy.start(
        grid,
        ArrayRecord.from_torch_state_dict(initial_state()),
        rounds,
        60,
        ConfigRecord({"lr": 0.05}),  # the user's own train config: it travels next to the plan
        ConfigRecord(EVAL_CONFIG),
        **kwargs,
    )


def _train_configs(grid: FakeGrid) -> dict[int, ConfigRecord]:
    return {
        m.metadata.dst_node_id: m.content.config_records["config"]
        for m in grid.sent
        if m.metadata.message_type == MessageType.TRAIN
    }


def _changed(result, start: dict) -> bool:
    return any(not np.array_equal(a.numpy(), start[k].numpy()) for k, a in result.arrays.items())


def test_start_is_flowers_own() -> None:
    def shape(f):
        return [(p.name, p.kind, p.default) for p in inspect.signature(f).parameters.values()]

    assert shape(PowerAware.start) == shape(Strategy.start)


def test_around_fedadam_a_round_runs_with_the_plan_in_the_train_config_and_the_report_taken_out() -> None:
    fedadam = FedAdam(**SMALL)
    spy = Spy(fedadam)
    strategy = PowerAware(fedadam, instructions())
    grid = FakeGrid(client_app, _nodes(2), RUN_CONFIG)
    result = _start(strategy, grid)
    configs = _train_configs(grid)
    assert len(configs) == 2
    for config in configs.values():
        sent = TrainInstructions.from_config(config)
        assert sent.relation_vector == instructions().relation_vector and sent.node_key.startswith(
            "partition-"
        )
        assert config["lr"] == 0.05 and config["server-round"] == 1  # the user's config, FedAvg's round
    record = strategy.rounds[1]
    assert sorted(c["node_key"] for c in record.clients) == ["partition-0", "partition-1"]
    assert record.summary["reported"] == 2 and "unreported" not in record.summary
    (handed,) = spy.seen
    assert len(handed) == 2 and all(REPORT_KEY not in r.content.config_records for r in handed)
    assert _changed(result, initial_state())  # FedAdam's server step moved the weights
    assert result.train_metrics_clientapp[1]["reported"] == 2


def test_around_fedprox_its_own_config_key_travels_with_the_plan() -> None:
    strategy = PowerAware(FedProx(proximal_mu=0.5, **SMALL), instructions())
    grid = FakeGrid(client_app, _nodes(2), RUN_CONFIG)
    _start(strategy, grid)
    assert all(c["proximal-mu"] == 0.5 for c in _train_configs(grid).values())
    assert strategy.rounds[1].summary["reported"] == 2


@pytest.mark.parametrize("order", ["dp-outside", "dp-inside"])
def test_composes_with_flowers_server_side_dp_wrapper(order: str) -> None:
    fedavg = FedAvg(**SMALL)
    spy = Spy(fedavg)
    if order == "dp-outside":  # Flower's wrapper calls ours as its inner strategy
        ours = PowerAware(fedavg, instructions())
        strategy: Strategy = DifferentialPrivacyServerSideFixedClipping(ours, 0.0, 100.0, 2)
    else:
        ours = strategy = PowerAware(
            DifferentialPrivacyServerSideFixedClipping(fedavg, 0.0, 100.0, 2), instructions()
        )
    grid = FakeGrid(client_app, _nodes(2), RUN_CONFIG)
    result = _start(strategy, grid)
    assert len(_train_configs(grid)) == 2
    assert all(TrainInstructions.from_config(c).node_key for c in _train_configs(grid).values())
    record = ours.rounds[1]
    assert record.summary["reported"] == 2 and record.evaluation is not None
    assert len(record.evaluation["clients"]) == 2
    (handed,) = spy.seen
    assert len(handed) == 2 and all(REPORT_KEY not in r.content.config_records for r in handed)
    assert _changed(result, initial_state())


def test_a_reply_without_a_report_is_aggregated_and_counted_as_such() -> None:
    nodes = _nodes(2)
    quiet = list(nodes)[1]
    sent_back: dict[int, tuple[ArrayRecord, float]] = {}

    class NoReport(FakeGrid):  # a user's ClientApp that trains but reports nothing
        def send_and_receive(self, messages, *, timeout=None):
            got = super().send_and_receive(messages, timeout=timeout)
            for msg, reply in zip(messages, got, strict=True):
                if msg.metadata.message_type == MessageType.TRAIN:
                    c = reply.content
                    sent_back[msg.metadata.dst_node_id] = (
                        c.array_records["arrays"],
                        c.metric_records["metrics"]["num-examples"],
                    )
                    if msg.metadata.dst_node_id == quiet:
                        del c.config_records[REPORT_KEY]
            return got

    strategy = PowerAwareFedAvg(instructions=instructions(), fraction_evaluate=0.0)
    result = _start(strategy, NoReport(client_app, nodes, RUN_CONFIG))
    record = strategy.rounds[1]
    assert [c["node_key"] for c in record.clients] == ["partition-0"] and record.failed == []
    assert record.summary["unreported"] == ["partition-1"]
    assert record.summary["sampled"] == 2 and record.summary["reported"] == 1
    both = weighted_average([sent_back[n] for n in nodes], ArrayRecord.from_torch_state_dict(initial_state()))
    for name, arr in result.arrays.items():
        np.testing.assert_allclose(arr.numpy(), both[name].numpy())


def test_round_zero_evaluation_and_summary_are_flowers() -> None:
    fedavg = FedAvg(**SMALL)
    summaries: list[str] = []
    fedavg.summary = lambda: summaries.append("inner")  # type: ignore[method-assign]
    evaluated: list[int] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord):
        evaluated.append(server_round)
        return None

    _start(
        PowerAware(fedavg, instructions()),
        FakeGrid(client_app, _nodes(1), RUN_CONFIG),
        evaluate_fn=evaluate_fn,
    )
    assert evaluated == [0, 1] and summaries == ["inner"]


def test_a_resumed_run_sends_nothing_for_the_rounds_done_before() -> None:
    evaluated: list[int] = []
    ends: list[int] = []
    strategy = PowerAwareFedAvg(
        instructions=instructions(), first_round=2, on_round_end=lambda r, a: ends.append(r)
    )
    grid = FakeGrid(client_app, _nodes(1), RUN_CONFIG)
    _start(strategy, grid, rounds=2, evaluate_fn=lambda r, a: evaluated.append(r))
    assert sorted(strategy.rounds) == [2] and ends == [2] and evaluated == [1, 2]
    assert {TrainInstructions.from_config(c).server_round for c in _train_configs(grid).values()} == {2}


def test_a_model_is_any_name_in_a_message() -> None:
    """Whether a name is a model is checked where the model is built (the registry), not in messages."""
    instr = instructions(model="mycnn", relation_vector=relation(model="mycnn"))
    assert TrainInstructions.from_config(instr.to_config()).model == "mycnn"
    with pytest.raises(ProtocolError, match="'model'"):
        TrainInstructions.from_config({**instr.to_config(), "model": ""})


def test_around_a_users_strategy_that_builds_its_own_config_the_plan_goes_in_whole() -> None:
    class Mine(FedAvg):  # a user's strategy: it sends its own config, not the one it is given
        def configure_train(self, server_round, arrays, config, grid):
            return super().configure_train(server_round, arrays, ConfigRecord({"epochs": 2}), grid)

    strategy = PowerAware(Mine(**SMALL), instructions())
    grid = FakeGrid(client_app, _nodes(2), RUN_CONFIG)
    _start(strategy, grid)
    configs = _train_configs(grid)
    assert len(configs) == 2 and all(c["epochs"] == 2 for c in configs.values())
    assert {TrainInstructions.from_config(c).node_key for c in configs.values()} == {
        "partition-0",
        "partition-1",
    }
    assert strategy.rounds[1].summary["reported"] == 2


# --- callbacks: checked where they are given, their results where they return ---------------------------
@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"node_instructions": lambda node, base: base}, "'node_instructions' must take (node, server_round"),
        ({"on_round": lambda: None}, "'on_round' must take (record), got '<lambda>()'"),
        ({"on_round_end": lambda record: None}, "'on_round_end' must take (server_round, arrays)"),
    ],
)
def test_a_callback_that_cannot_take_its_arguments_is_refused_where_it_is_given(
    kwargs: dict, fragment: str
) -> None:
    from powerctl.errors import ArgumentError

    with pytest.raises(ArgumentError) as err:
        PowerAware(FedAvg(**SMALL), instructions(), **kwargs)
    assert "\n" not in str(err.value) and fragment in str(err.value), str(err.value)


def test_callbacks_taking_their_arguments_any_way_are_taken() -> None:
    import functools

    from strategies.power_aware import same_for_every_node

    class Recorder:
        def __call__(self, *records: object) -> None: ...

    for kwargs in (
        {"on_round": print, "on_round_end": Recorder()},  # a builtin whose signature is not read; *args
        {"on_round": lambda record, extra=0: None, "on_round_end": lambda *a, **k: None},
        {"node_instructions": functools.partial(same_for_every_node)},
    ):
        PowerAware(FedAvg(**SMALL), instructions(), **kwargs)


@pytest.mark.parametrize("returned", [None, {"model": "cnn-tiny"}])
def test_node_instructions_returning_no_plan_is_one_line_naming_it_before_anything_is_sent(
    returned: object,
) -> None:
    from powerctl.errors import ArgumentError

    strategy = PowerAware(
        FedAvg(**SMALL), instructions(), node_instructions=lambda node, server_round, base: returned
    )
    grid = FakeGrid(client_app, _nodes(2), RUN_CONFIG)
    arrays = ArrayRecord.from_torch_state_dict(initial_state())
    with pytest.raises(ArgumentError) as err:
        list(strategy.configure_train(1, arrays, ConfigRecord({}), grid))
    text = str(err.value)
    assert "\n" not in text and "node_instructions(node, server_round, instructions) returned" in text, text
    assert "it must return a TrainInstructions" in text and not _train_configs(grid)
