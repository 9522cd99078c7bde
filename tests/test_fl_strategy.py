"""The power-aware strategy driving the real ClientApp through an in-process grid (no Ray, no network)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fl_client.app import app as client_app
from powerctl.devices.simulated import POWER_NOISE
from powerctl.errors import ArgumentError
from powerctl.records.relation import RelationVector
from strategies.fedavg import PowerAwareFedAvg
from strategies.objectives import NodeWaits
from strategies.protocol import ProtocolError, TrainInstructions, evaluation_metrics, reader
from strategies.rounds import NoClientReported, weighted_average
from tests.fake_grid import FakeGrid, set_task_identity
from tests.fl_helpers import RUN_CONFIG, initial_state, instructions, relation


def _nodes(n: int) -> dict[int, dict]:
    # node ids deliberately NOT in partition order: per-node values must follow partitions, not ids
    ids = [9001, 17, 4242, 555, 88][:n]
    return {nid: {"partition-id": i, "num-partitions": n} for i, nid in enumerate(ids)}


def power_aware(**kwargs) -> PowerAwareFedAvg:
    """The ServerApp's strategy with the test instructions (`_run` may give others)."""
    return PowerAwareFedAvg(instructions=instructions(), **kwargs)


def _run(grid: FakeGrid, strategy: PowerAwareFedAvg, rounds: int = 1, instr: TrainInstructions | None = None):
    if instr is not None:
        strategy.instructions = instr
    eval_cfg = ConfigRecord({"model": "cnn-tiny", "num-classes": 10, "model-overrides": "{}"})
    return strategy.start(
        grid=grid,
        initial_arrays=ArrayRecord.from_torch_state_dict(initial_state()),
        num_rounds=rounds,
        timeout=60,
        evaluate_config=eval_cfg,
    )


def test_each_node_gets_its_own_message_and_every_report_is_kept() -> None:
    replies: dict[str, tuple[ArrayRecord, float]] = {}

    class Keeping(FakeGrid):  # the weights each client sent back, to check the average
        def send_and_receive(self, messages, *, timeout=None):
            got = super().send_and_receive(messages, timeout=timeout)
            for r in got:
                if r.metadata.message_type == MessageType.TRAIN:
                    c = r.content
                    key = c.config_records["report"]["node-key"]
                    replies[key] = (c.array_records["arrays"], c.metric_records["metrics"]["num-examples"])
            return got

    grid = Keeping(client_app, _nodes(3), RUN_CONFIG)
    strategy = power_aware()
    result = _run(grid, strategy)

    train_msgs = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert len(train_msgs) == 3
    assert len({id(m.content) for m in train_msgs}) == 3  # no shared RecordDict
    keys = {m.metadata.dst_node_id: m.content.config_records["config"]["node-key"] for m in train_msgs}
    assert keys == {9001: "partition-0", 17: "partition-1", 4242: "partition-2"}

    record = strategy.rounds[1]
    by_key = {c["node_key"]: c for c in record.clients}
    assert [(by_key[k]["device"], by_key[k]["power_cap_w"]) for k in sorted(by_key)] == [
        ("sim:jetson-nano", 3.0),
        ("sim:jetson-tx2nx", 4.5),
        ("sim:jetson-nano", None),
    ]
    for c in record.clients:
        assert c["power_cap_w"] is None or c["profiled_peak_power_w"] <= c["power_cap_w"]
        assert c["power_cap_w"] is None or c["peak_power_w"] <= c["power_cap_w"] * (1 + 5 * POWER_NOISE)
        assert {"device", "batch_size", "frequency_hz", "energy_j", "samples", "reached_target"} <= set(c)
    s = record.summary
    assert s["reported"] == 3 and s["failed"] == [] and s["over_cap"] == []
    assert s["makespan_s"] == pytest.approx(max(c["device_s"] + c["profiling_s"] for c in record.clients))
    assert s["total_energy_j"] == pytest.approx(sum(c["energy_j"] for c in record.clients))
    assert record.evaluation is not None and len(record.evaluation["clients"]) == 3

    expected = weighted_average(
        [replies[k] for k in sorted(replies)], ArrayRecord.from_torch_state_dict(initial_state())
    )
    for name, arr in result.arrays.items():
        np.testing.assert_allclose(arr.numpy(), expected[name].numpy())
        assert arr.numpy().dtype == initial_state()[name].numpy().dtype


def test_node_instructions_set_per_node_values_by_partition() -> None:
    caps = {"partition-0": 2.4, "partition-1": 3.2}

    def own_cap(node, server_round, base):
        return dataclasses.replace(
            base, server_round=server_round, node_key=node.key, power_cap_w=caps[node.key]
        )

    grid = FakeGrid(client_app, _nodes(2), RUN_CONFIG)
    strategy = power_aware(node_instructions=own_cap, fraction_evaluate=0.0)
    _run(grid, strategy)
    got = {c["node_key"]: c["power_cap_w"] for c in strategy.rounds[1].clients}
    assert got == caps
    for c in strategy.rounds[1].clients:
        assert c["profiled_peak_power_w"] <= c["power_cap_w"]


def test_failed_clients_are_named_and_never_stop_the_round() -> None:
    nodes = _nodes(5)
    ids = list(nodes)
    behaviour = {ids[1]: "raise", ids[2]: "dead", ids[3]: "silent", ids[4]: "garbage"}
    grid = FakeGrid(client_app, nodes, RUN_CONFIG, behaviour)
    seen: list[int] = []
    strategy = power_aware(on_round=lambda r: seen.append(r.round), fraction_evaluate=0.0)
    result = _run(grid, strategy)
    record = strategy.rounds[1]
    assert [c["node_key"] for c in record.clients] == ["partition-0"]
    failed = {f.node_key: f.kind for f in record.failed}
    assert failed == {
        "partition-1": "error",
        "partition-2": "unavailable",  # came from the SuperLink's id: mapped back by message id
        "partition-3": "timeout",
        "partition-4": "error",
    }
    assert "boom" in next(f.reason for f in record.failed if f.node_key == "partition-1")
    # no weights: unusable (a reply with weights but no report is aggregated: tests/test_strategy_wrapper.py)
    assert "missing key 'arrays'" in next(f.reason for f in record.failed if f.node_key == "partition-4")
    assert record.summary["sampled"] == 5 and record.summary["share_at_target"] == 0.0
    assert len(record.summary["failed"]) == 4 and seen == [1]
    assert result.arrays is not None  # the one good client's weights


@pytest.mark.parametrize(
    ("mode", "kind"), [("query-silent", "timeout"), ("query-raise", "error"), ("query-dead", "unavailable")]
)
def test_a_node_that_never_described_itself_is_named_by_its_node_id(mode: str, kind: str) -> None:
    nodes = _nodes(2)
    bad = list(nodes)[1]
    grid = FakeGrid(client_app, nodes, RUN_CONFIG, {bad: mode})
    strategy = power_aware(fraction_evaluate=0.0)
    _run(grid, strategy)
    assert [(f.node_key, f.kind) for f in strategy.rounds[1].failed] == [(f"node-{bad}", kind)]
    assert [c["node_key"] for c in strategy.rounds[1].clients] == ["partition-0"]


@pytest.mark.parametrize(
    ("mode", "fragment"),
    [
        ("nan", "'accuracy' must be a number ≥ 0, got nan"),
        ("wrong-types", "'batch-size' must be an integer ≥ 1, got 'eight'"),
        ("bad-report", "missing key"),
        ("nan-weights", "weights hold NaN or infinity"),
    ],
)
def test_a_reply_with_unusable_values_is_named_and_kept_out_of_the_average(mode: str, fragment: str) -> None:
    nodes = _nodes(2)
    bad = list(nodes)[1]
    grid = FakeGrid(client_app, nodes, RUN_CONFIG, {bad: mode})
    strategy = power_aware(fraction_evaluate=0.0)
    result = _run(grid, strategy)
    record = strategy.rounds[1]
    assert [c["node_key"] for c in record.clients] == ["partition-0"]
    (failure,) = record.failed
    assert (failure.node_key, failure.kind) == ("partition-1", "error") and fragment in failure.reason
    for arr in result.arrays.values():
        assert np.all(np.isfinite(arr.numpy()))


def test_failures_while_evaluating_are_named_in_the_evaluation_and_the_rest_averaged() -> None:
    nodes = _nodes(5)
    ids = list(nodes)
    behaviour = {ids[1]: "eval-raise", ids[2]: "eval-dead", ids[3]: "eval-silent", ids[4]: "eval-nan"}
    grid = FakeGrid(client_app, nodes, RUN_CONFIG, behaviour)
    strategy = power_aware()
    _run(grid, strategy)
    record = strategy.rounds[1]
    assert len(record.clients) == 5 and record.failed == []  # all of them trained
    ev = record.evaluation
    assert [c["node_key"] for c in ev["clients"]] == ["partition-0"]
    assert ev["accuracy"] == ev["clients"][0]["accuracy"]
    kinds = {f["node_key"]: f["kind"] for f in ev["failed"]}
    assert kinds == {
        "partition-1": "error",
        "partition-2": "unavailable",
        "partition-3": "timeout",
        "partition-4": "error",
    }
    assert "'accuracy' must be a number ≥ 0, got nan" in ev["failed"][-1]["reason"]


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ({"accuracy": 0.5, "loss": 1.0}, {"accuracy": 0.5, "loss": 1.0}),
        ({"eval_acc": 0.25, "eval_loss": 2.0}, {"accuracy": 0.25, "loss": 2.0}),  # Flower's templates
        ({"acc": 0.75}, {"accuracy": 0.75, "loss": None}),
        ({"eval_accuracy": 0.5, "accuracy": 0.25}, {"accuracy": 0.25, "loss": None}),  # the first name wins
        ({"num-examples": 10.0}, {"accuracy": None, "loss": None}),
    ],
)
def test_an_evaluate_reply_names_its_metrics_as_flower_users_do(metrics: dict, expected: dict) -> None:
    assert evaluation_metrics(reader(MetricRecord(metrics), "evaluate reply metrics")) == expected


def test_an_evaluate_metric_under_flowers_name_is_checked_as_ours() -> None:
    with pytest.raises(ProtocolError, match="'eval_acc' must be a number ≥ 0, got -1"):
        evaluation_metrics(reader(MetricRecord({"eval_acc": -1.0}), "evaluate reply metrics"))


def test_a_round_where_every_evaluation_fails_has_no_accuracy_and_the_run_goes_on() -> None:
    nodes = _nodes(2)
    grid = FakeGrid(client_app, nodes, RUN_CONFIG, {nid: "eval-garbage" for nid in nodes})
    strategy = power_aware()
    _run(grid, strategy, rounds=2)
    for rnd in (1, 2):
        ev = strategy.rounds[rnd].evaluation
        assert ev["accuracy"] is None and len(ev["failed"]) == 2 and len(strategy.rounds[rnd].clients) == 2
        assert all("missing key 'metrics'" in f["reason"] for f in ev["failed"])


def test_a_round_where_every_client_fails_keeps_the_old_weights() -> None:
    nodes = _nodes(2)
    grid = FakeGrid(client_app, nodes, RUN_CONFIG, {nid: "dead" for nid in nodes})
    ends: list[tuple[int, ArrayRecord]] = []
    strategy = power_aware(fraction_evaluate=0.0, on_round_end=lambda r, a: ends.append((r, a)))
    with pytest.raises(NoClientReported) as err:  # a run with no result fails, naming why (issue 36)
        _run(grid, strategy)
    text = str(err.value)
    assert "\n" not in text and text.startswith("every client failed in every round (1 round): ")
    assert text.count("(unavailable)") == 2, text
    assert strategy.rounds[1].clients == [] and len(strategy.rounds[1].failed) == 2
    ((server_round, arrays),) = ends
    assert server_round == 1 and set(arrays.keys()) == set(initial_state())
    for name, arr in arrays.items():
        np.testing.assert_array_equal(arr.numpy(), initial_state()[name].numpy())


@pytest.mark.parametrize(
    ("node_config", "fragment"),
    [
        ({"device": "sim:jetson-orin", "partition-id": 0, "num-partitions": 1}, "'jetson-orin'"),
        ({"device": "sim:jetson-nano", "power-cap-w": -2.0, "partition-id": 0}, "-2.0"),
        ({"device": "sim:jetson-nano", "power-cap-w": "lots", "partition-id": 0}, "'lots'"),
        ({"device": "sim:jetson-nano", "data": "npz:/no/such/file.npz"}, "/no/such/file.npz"),
    ],
)
def test_bad_node_config_is_an_error_reply_naming_it_and_the_round_goes_on(
    node_config: dict, fragment: str
) -> None:
    nodes = {5: node_config, 6: {"partition-id": 1, "num-partitions": 2}}
    grid = FakeGrid(client_app, nodes, RUN_CONFIG)
    strategy = power_aware(fraction_evaluate=0.0)
    _run(grid, strategy)
    record = strategy.rounds[1]
    assert [c["node_key"] for c in record.clients] == ["partition-1"]
    (failure,) = record.failed
    assert failure.kind == "error" and fragment in failure.reason and "\n" not in failure.reason


def _train_message(config: dict, arrays: ArrayRecord | None = None) -> Message:
    set_task_identity()
    content = {"config": ConfigRecord(config)}
    if arrays is not None:
        content["arrays"] = arrays
    return Message(RecordDict(content), dst_node_id=3, message_type=MessageType.TRAIN)


def _reply_to(msg: Message, node_config: dict | None = None) -> Message:
    grid = FakeGrid(client_app, {3: node_config or {"partition-id": 0, "num-partitions": 2}}, RUN_CONFIG)
    (reply,) = grid.send_and_receive([msg])
    return reply


def test_messages_with_missing_or_bad_keys_get_error_replies_naming_them() -> None:
    good = dict(instructions().to_config())
    arrays = ArrayRecord.from_torch_state_dict(initial_state())
    nan_state = initial_state()
    nan_state["fc.weight"][0, 0] = float("inf")
    nan_arrays = ArrayRecord.from_torch_state_dict(nan_state)
    cases = {
        "missing key 'relation-vector'": (
            {k: v for k, v in good.items() if k != "relation-vector"},
            arrays,
        ),
        "'target-accuracy' must be a number in (0, 1], got 1.5": ({**good, "target-accuracy": 1.5}, arrays),
        "'target-accuracy' must be a number in (0, 1], got 0.0": ({**good, "target-accuracy": 0.0}, arrays),
        "'lr-rule' must be one of": ({**good, "lr-rule": "cubic"}, arrays),
        "missing key 'arrays'": (good, None),
        "do not fit model 'cnn-tiny'": (good, ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})),
        "has no option": ({**good, "model-overrides": json.dumps({"depth": 3})}, arrays),
        "'arrays' hold NaN or infinity": (good, nan_arrays),
    }
    for fragment, (config, arr) in cases.items():
        reply = _reply_to(_train_message(config, arr))
        assert reply.has_error(), fragment
        assert fragment in reply.error.reason, (fragment, reply.error.reason)


def test_train_instructions_round_trip_and_reject_bad_values() -> None:
    instr = instructions(power_cap_w=4.0, node_key="partition-3", server_round=2)
    assert TrainInstructions.from_config(instr.to_config()) == instr
    assert "power-cap-w" not in instructions().to_config()
    other = json.dumps(relation(model="cnn-small").to_dict())
    with pytest.raises(ProtocolError, match="'relation-vector' is for model 'cnn-small', the instructions"):
        TrainInstructions.from_config({**instr.to_config(), "relation-vector": other})  # the receiver checks
    with pytest.raises(ArgumentError, match="'relation_vector' is for model 'cnn-small', the instructions"):
        instructions(relation_vector=relation(model="cnn-small"))  # and the sender, before it is sent
    broken = {**instr.relation_vector.to_dict(), "samples_to_target": [300.0, float("nan")]}
    del broken["relation"]
    bounded = r"'samples_to_target' must be a number in \(0, 1000000000000\], got nan"
    with pytest.raises(ProtocolError, match=bounded):
        TrainInstructions.from_config({**instr.to_config(), "relation-vector": json.dumps(broken)})
    assert instr.lr_for(16) == pytest.approx(2e-3) and instr.lr_for(8) == pytest.approx(2e-3 * 0.5**0.5)


def test_the_strategy_sends_the_relation_vector_whole_extra_fields_included() -> None:
    """One relation type from the server's estimate to the client's `select`: whatever fields the
    vector carries (per-seed samples, how it was estimated) reach the client unchanged."""
    rel = RelationVector.from_seeds(
        "cnn-tiny", "synthetic-image", 0.99, {8: [280.0, 320.0], 16: [390.0, 410.0]}, eval_every_samples=32
    )
    grid = FakeGrid(client_app, _nodes(2), RUN_CONFIG)
    _run(grid, power_aware(), instr=instructions(relation_vector=rel))
    sent = [TrainInstructions.from_config(m.content.config_records["config"])
            for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]  # fmt: skip
    assert len(sent) == 2 and all(i.relation_vector == rel for i in sent)
    assert sent[0].relation_vector.per_seed_samples() == [[280.0, 320.0], [390.0, 410.0]]


def test_weighted_average_keeps_integer_buffers_integers() -> None:
    a = ArrayRecord({"w": Array(np.array([1.0, 3.0], dtype=np.float32)), "n": Array(np.array(10))})
    b = ArrayRecord({"w": Array(np.array([3.0, 5.0], dtype=np.float32)), "n": Array(np.array(20))})
    avg = weighted_average([(a, 1.0), (b, 3.0)], a)
    np.testing.assert_allclose(avg["w"].numpy(), [2.5, 4.5])
    assert avg["n"].numpy().dtype == np.array(10).dtype and int(avg["n"].numpy()) == 18


def test_a_multi_line_coloured_reason_becomes_one_line_with_the_exception() -> None:
    from strategies.rounds import one_line

    ray = (
        "<class 'X'>:<'\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=1)\n  File a.py\n\n"
        "InjectedFailure: boom'>"
    )
    assert one_line(ray) == "<class 'X'>:<'ray::ClientAppActor.run() (pid=1) … InjectedFailure: boom'>"
    assert one_line("") == "(no reason given)" and len(one_line("x" * 1000)) == 400
    assert one_line(None) == "(no reason given)"  # Flower's Error.reason may be None


def test_a_ray_wrapped_error_of_the_project_is_its_own_line() -> None:
    """A train function without `power_aware_mod`, in Flower's simulation: Ray's lines, the traceback,
    then the project's error, which says what to do; the warning is that line alone (issue 37)."""
    from strategies.rounds import one_line

    said = "PowerSession: no round to join: add powerfed.power_aware_mod to the ClientApp's mods"
    reason = (
        "<class 'flwr.clientapp.client_app.ClientAppException'>:<'\nException ClientAppException occurred. "
        "Message: ray::ClientAppActor.run() (pid=4242, ip=127.0.0.1, actor_id=abc)\n"
        '  File "/app/task.py", line 12, in train\n    with PowerSession(model=net) as s:\n'
        f"fl_client.session.SessionError: {said}'>"
    )
    assert one_line(reason) == said
    other = reason.replace(f"fl_client.session.SessionError: {said}", "ValueError: bad shape (3, 2)")
    assert one_line(other) == "ValueError: bad shape (3, 2)"  # another library's: its class kept


# Error.reason of a simulated ClientApp whose train function raised ValueError("my words"), as Flower
# 1.42's simulation (Ray 2.55) replied it (pids and paths shortened)
SIMULATED_REASON = (
    "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor.run()\x1b[39m "
    "(pid=24480, ip=192.0.2.2, actor_id=67d9, repr=<flwr.simulation.ray_transport.ray_actor.ClientAppActor "
    "object at 0x7fcd>)\n                  ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
    '  File "/venv/flwr/clientapp/client_app.py", line 161, in __call__\n'
    "    return self._registered_funcs[full_name](message, context)\n"
    '  File "/app/task.py", line 10, in train\n    raise ValueError("my words")\nValueError: my words\n\n'
    "The above exception was the direct cause of the following exception:\n\n"
    "\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=24480, ip=192.0.2.2, actor_id=67d9)\n"
    '  File "/venv/flwr/simulation/ray_transport/ray_actor.py", line 65, in run\n'
    "    raise ClientAppException(str(ex)) from ex\nflwr.clientapp.client_app.ClientAppException: \n"
    "Exception ClientAppException occurred. Message: my words'>"
)


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        ("ValueError: my words", "ValueError: my words"),
        ("task.Boom: my words", "Boom: my words"),  # a class of the user's, named as they like
        ("fl_client.faults.InjectedFailure: my words", "my words"),  # the project's own: its words alone
    ],
)
def test_a_failed_clientapp_is_its_own_words_whatever_its_exception_is_called(raised: str, said: str) -> None:
    """Every client failed: each one's line is the exception it raised, not Ray's wrapping of it, also
    where its class does not end in Error (the soak tests' InjectedFailure, a user's own class)."""
    from strategies.rounds import Failure, RoundRecord, no_client_reported, one_line

    reason = SIMULATED_REASON.replace("ValueError: my words", raised)
    assert one_line(reason) == said
    record = no_client_reported([RoundRecord(1, [], [Failure(1, "partition-0", "d", "error", reason)], {})])
    assert str(record) == f"every client failed in every round (1 round): partition-0 (error) failed: {said}"


def test_a_deployed_clientapp_error_is_its_class_and_words() -> None:
    """A SuperNode replies `<class 'CLS'>:<'MESSAGE'>` (flwr.supernode.runtime.run_clientapp)."""
    from strategies.rounds import one_line

    assert one_line("<class 'ValueError'>:<'my words'>") == "ValueError: my words"
    assert one_line("<class 'fl_client.session.SessionError'>:<'add the mod'>") == "add the mod"


def test_min_available_nodes_gathers_the_fleet_once_and_a_node_gone_later_does_not_hold_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flwr.serverapp.strategy import strategy_utils

    def no_waiting(seconds: float) -> None:  # Flower's sampling would wait here forever
        raise AssertionError("the strategy waited for a node that is gone")

    monkeypatch.setattr(strategy_utils, "sleep", no_waiting)
    nodes = _nodes(2)
    gone = list(nodes)[1]

    class ShrinkingGrid(FakeGrid):
        def get_node_ids(self):  # the second SuperNode disappears once round 1's training is sent
            trained = any(m.metadata.message_type == MessageType.TRAIN for m in self.sent)
            return [n for n in self.node_configs if not (trained and n == gone)]

    grid = ShrinkingGrid(client_app, nodes, RUN_CONFIG, {gone: "dead"})
    # the gone node: one short wait
    strategy = power_aware(waits=NodeWaits(min_available_nodes=2, rejoin_wait_s=1.0))
    _run(grid, strategy, rounds=2)
    assert [(f.node_key, f.kind) for f in strategy.rounds[1].failed] == [("partition-1", "unavailable")]
    assert [c["node_key"] for c in strategy.rounds[2].clients] == ["partition-0"] and not strategy.rounds[
        2
    ].failed


class _Clock:
    """time.monotonic and time.sleep for the strategy's rejoin wait, without waiting."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds


class _Nodes(FakeGrid):
    """Only node ids: `back_at` is when a missing node reconnects (None: never)."""

    def __init__(self, clock: _Clock, missing: int, back_at: float | None) -> None:
        super().__init__(client_app, {1: {}, 2: {}, 3: {}}, RUN_CONFIG)
        self.clock, self.missing, self.back_at, self.present = clock, missing, back_at, True

    def get_node_ids(self):
        back = self.back_at is not None and self.clock.now >= self.back_at
        return [n for n in (1, 2, 3) if self.present or n != self.missing or back]


def test_the_first_sampling_takes_every_node_it_waited_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """`min_available_nodes` = 3 with 2 connected: the first round waits for the third and samples all
    three (it sampled the 2 counted before the wait; seen when a SuperNode reconnected late after a
    SuperLink restart)."""
    import flwr.serverapp.strategy.strategy_utils as flower_sampling

    import strategies.power_aware as power_aware_module

    clock = _Clock()
    monkeypatch.setattr(power_aware_module, "time", clock)
    monkeypatch.setattr(flower_sampling, "sleep", clock.sleep)
    grid = _Nodes(clock, missing=3, back_at=2.0)
    grid.present = False
    strategy = power_aware(waits=NodeWaits(min_available_nodes=3, rejoin_wait_s=10.0))
    assert strategy.connected(grid) == [1, 2, 3] and clock.slept == pytest.approx(2.0)
    assert strategy.connected(grid) == [1, 2, 3] and clock.slept == pytest.approx(2.0)


@pytest.mark.parametrize(("back_at", "sampled", "slept"), [(None, [1, 2], 10.0), (2.0, [1, 2, 3], 2.0)])
def test_a_round_waits_once_for_a_node_seen_before(
    monkeypatch: pytest.MonkeyPatch, back_at: float | None, sampled: list[int], slept: float
) -> None:
    import strategies.power_aware as power_aware_module

    clock = _Clock()
    monkeypatch.setattr(power_aware_module, "time", clock)
    grid = _Nodes(clock, missing=3, back_at=back_at)
    strategy = power_aware(waits=NodeWaits(min_available_nodes=1, rejoin_wait_s=10.0))
    assert strategy.connected(grid) == [1, 2, 3] and clock.slept == 0  # every node seen
    grid.present = False  # node 3 drops (a SuperLink restart: it may come back)
    assert strategy.connected(grid) == sampled and clock.slept == pytest.approx(slept)
    # the next samplings (the round's evaluation, later rounds) do not wait for it again
    assert strategy.connected(grid) == sampled and strategy.connected(grid) == sampled
    assert clock.slept == pytest.approx(slept)
