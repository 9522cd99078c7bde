"""The simulation's message index (`simulations.linkstate_index`) answers as Flower 1.41's scan does.

Two link states, Flower's own `InMemoryLinkState` and the adapter, get the same nodes and the same
stored messages (fresh objects each), then the same sequence of calls; every call must return the same
message ids in the same order, and the stores must hold the same messages afterwards. Random sequences
(hypothesis) mix storing, asking a node (limit 1, 2 or none; a run filter), deleting, and messages that
have expired. A whole run through the index is tests/test_fleet_run.py's (its log says the index was
installed); one through Flower's own dispatch is tests/test_flwr_run.py's. (A 4-board fleet run twice,
with and without the index, compared their records until issue 38: a flag's variant, not a behaviour,
and two `flwr run` start-ups for what the random sequences here prove call by call.)
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from pathlib import Path
from queue import Queue
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("flwr")

from simulations import linkstate_index as li
from simulations.local_superlink import descendants

RUN_ID = 77
NODES = [1001, 1002, 1003, 1004]


@pytest.fixture(autouse=True)
def _identity(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.setattr(TaskIdentity, "_run_id", RUN_ID)
    monkeypatch.setattr(TaskIdentity, "_node_id", 1)
    monkeypatch.setattr(TaskIdentity, "_task_id", 5)


def make_state(cls: type, nodes: list[int]) -> Any:
    """A link state as the simulation sets it up (`run_simulation._main_loop`, `vce_api._register_nodes`),
    its node ids `nodes` in that order."""
    from flwr.common.constant import HEARTBEAT_INTERVAL_INF
    from flwr.proto.task_pb2 import Task
    from flwr.server.superlink.linkstate import in_memory_linkstate as ims
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.superlink.federation import NoOpFederationManager

    state = cls(NoOpFederationManager(), ObjectStoreFactory().store())
    ids = iter(nodes)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ims, "generate_rand_int_from_bytes", lambda *a, **k: next(ids))
        for n in nodes:
            node_id = state.create_node(
                "aid", "name", n.to_bytes(8, "big"), heartbeat_interval=HEARTBEAT_INTERVAL_INF
            )
            state.acknowledge_node_heartbeat(node_id=node_id, heartbeat_interval=HEARTBEAT_INTERVAL_INF)
    run = Run.create_empty(RUN_ID)
    run.primary_task_id = 9
    run.federation_id = NOOP_FEDERATION_ID
    state.run_ids[RUN_ID] = ims.RunRecord(run=run)
    state.task_store[9] = Task(task_id=9, run_id=RUN_ID)
    return state


def message(msg_id: str, dst: int, *, expired: bool = False, run_id: int = RUN_ID) -> Any:
    from flwr.app import Message, RecordDict

    msg = Message(RecordDict(), dst_node_id=dst, message_type="train")
    msg.metadata.__dict__["_message_id"] = msg_id
    msg.metadata.__dict__["_run_id"] = run_id
    if expired:
        msg.metadata.created_at = time.time() - 10 * msg.metadata.ttl
    return msg


# one operation: ("store", node index, expired) | ("get", node index, limit, filtered) | ("delete", k)
op = st.one_of(
    st.tuples(st.just("store"), st.integers(0, len(NODES) - 1), st.booleans()),
    st.tuples(st.just("get"), st.integers(0, len(NODES) - 1), st.sampled_from([None, 1, 2]), st.booleans()),
    st.tuples(st.just("delete"), st.integers(0, 40)),
)


def replay(state: Any, ops: list[tuple]) -> list[Any]:
    """Apply `ops` to `state`; what each call answered (message ids, in order). After every step, the
    adapter's dispatch would ask every node that has an undelivered message."""
    answers: list[Any] = []
    counter = itertools.count()
    stored: list[str] = []
    for o in ops:
        if o[0] == "store":
            msg_id = f"m{next(counter)}"
            answers.append(state.store_message_ins(message(msg_id, NODES[o[1]], expired=o[2])))
            stored.append(msg_id)
        elif o[0] == "get":
            got = state.get_message_ins(NODES[o[1]], o[2], run_id=RUN_ID if o[3] else None)
            answers.append([m.metadata.message_id for m in got])
        elif stored:
            state.delete_messages({stored[o[1] % len(stored)]})
            answers.append("deleted")
        if hasattr(state, "pending_nodes"):
            assert set(live_undelivered(state)) <= set(state.pending_nodes())
    return answers


def live_undelivered(state: Any) -> dict[int, list[str]]:
    """Per node, the stored messages not yet delivered and not expired, in storage order."""
    now = time.time()
    out: dict[int, list[str]] = {}
    for k, m in state.message_ins_store.items():
        if m.metadata.delivered_at == "" and m.metadata.created_at + m.metadata.ttl > now:
            out.setdefault(m.metadata.dst_node_id, []).append(k)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, max_size=40))
def test_same_messages_in_the_same_order_as_flowers_scan(ops: list[tuple]) -> None:
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState

    flower = make_state(InMemoryLinkState, NODES)
    ours = make_state(li.indexed_state_class(), NODES)
    assert replay(ours, ops) == replay(flower, ops)
    assert live_undelivered(ours) == live_undelivered(flower)
    store = ours.message_ins_store
    assert {n: list(ids) for n, ids in store.by_node.items()} == {
        n: [k for k, m in store.items() if m.metadata.dst_node_id == n]
        for n in {m.metadata.dst_node_id for m in store.values()}
    }


def test_the_dispatch_delivers_every_message_once_in_node_order() -> None:
    state = make_state(li.indexed_state_class(), NODES)
    for i, dst in enumerate([1003, 1001, 1003, 1002]):
        state.store_message_ins(message(f"m{i}", dst))
    queue: Queue[Any] = Queue()
    stop = threading.Event()
    mapping = {n: i for i, n in enumerate(NODES)}
    thread = threading.Thread(target=li.add_messages_to_queue, args=(state, queue, mapping, stop))
    thread.start()
    got: list[str] = [queue.get(timeout=10).metadata.message_id for _ in range(4)]
    stop.set()
    thread.join()
    # first pass: one message per node in the engine's node order; the second m2
    assert got == ["m1", "m3", "m0", "m2"]
    assert queue.empty() and state.pending_nodes() == []


def test_a_dict_change_of_any_kind_keeps_the_index() -> None:
    class Meta:
        def __init__(self, dst: int) -> None:
            self.dst_node_id = dst

    class Msg:
        def __init__(self, dst: int) -> None:
            self.metadata = Meta(dst)

    store = li.IndexedStore()
    store["a"] = Msg(1)
    store.update({"b": Msg(2), "c": Msg(1)})
    store.setdefault("d", Msg(2))
    store["a"] = Msg(2)  # the same id, another node: keeps its place in the dict
    assert store.by_node == {1: {"c": None}, 2: {"a": None, "b": None, "d": None}}
    assert store.pop("b").metadata.dst_node_id == 2 and store.pop("zz", None) is None
    del store["c"]
    assert store.by_node == {2: {"a": None, "d": None}} and store.pending == {2}
    assert store.popitem()[0] == "a" and store.by_node == {2: {"d": None}}  # the first, as MutableMapping's
    store |= {"e": Msg(1)}
    assert store.by_node == {2: {"d": None}, 1: {"e": None}} and store.pending == {1, 2}
    store.clear()
    assert store.by_node == {} and store.pending == set() and not store


def test_the_nodes_contexts_are_flowers_with_the_app_config_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flwr.common import config as flwr_config
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.supercore.run import Run

    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "app"\nversion = "1.0.0"\n'
        '[tool.flwr.app]\npublisher = "me"\n'
        '[tool.flwr.app.components]\nserverapp = "a:b"\nclientapp = "a:c"\n'
        '[tool.flwr.app.config]\nrounds = 3\nmodel = "cnn-tiny"\n[tool.flwr.app.config.task]\nlr = 0.1\n'
    )
    run = Run.create_empty(run_id=RUN_ID)
    run.override_config = {"rounds": 5}
    mapping = {node: i for i, node in enumerate(NODES)}
    reads: list[Path] = []
    parse = flwr_config.get_project_config

    def counted(project_dir: Path) -> dict[str, Any]:
        reads.append(Path(project_dir))
        return parse(project_dir)

    monkeypatch.setattr(flwr_config, "get_project_config", counted)
    flowers = vce_api._register_node_info_stores(mapping, run, str(tmp_path))
    assert len(reads) == len(NODES)  # Flower's own: once per node
    reads.clear()
    ours = li.config_read_once(vce_api._register_node_info_stores)(mapping, run, str(tmp_path))
    assert reads == [tmp_path]
    configs = [ours[n].retrieve_context(RUN_ID).run_config for n in NODES]
    assert configs == [flowers[n].retrieve_context(RUN_ID).run_config for n in NODES]
    assert configs[0] == {"rounds": 5, "model": "cnn-tiny", "task.lr": 0.1}
    assert len({id(c) for c in configs}) == len(NODES)  # each node its own dict, as before
    assert [ours[n].node_config for n in NODES] == [flowers[n].node_config for n in NODES]
    from flwr.compat.client import run_info_store

    assert run_info_store.get_fused_config_from_dir is flwr_config.get_fused_config_from_dir  # restored


def test_another_flower_version_is_refused_in_one_line() -> None:
    with pytest.raises(li.LinkStateIndexError) as info:
        li.check_flower_version("1.43.0")
    text = str(info.value)
    assert "\n" not in text and "flwr 1.43.0 is installed" in text and "1.41.*, 1.42.*" in text
    assert li.check_flower_version("1.41.0") == "1.41.0" and li.check_flower_version("1.42.0") == "1.42.0"
    assert li.check_flower_version().startswith(li.SUPPORTED_FLOWER)


def test_a_fleet_run_on_another_flower_is_refused_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from simulations.__main__ import main
    from simulations.launcher import check_launch

    monkeypatch.setattr(li, "flower_version", lambda: "1.43.0")
    fleet = tmp_path / "f.yaml"
    fleet.write_text(fleet_text(4))
    before = set(descendants(os.getpid()))
    assert main(["run", str(fleet), "--out", str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "flwr 1.43.0 is installed" in err
    assert not (tmp_path / "out").exists() and set(descendants(os.getpid())) == before
    with pytest.raises(li.LinkStateIndexError):
        check_launch(2, "", tmp_path / "run", tmp_path / "logs" / "run.log")
    assert not (tmp_path / "run").exists() and not (tmp_path / "logs").exists()


def fleet_text(n: int) -> str:
    """A scale-mode fleet of `n` boards (four kinds), two rounds, one method; a few boards fine-tune."""
    a = n // 4
    return f"""\
name: index-{n}
groups:
  - {{device: sim:jetson-nano, power-cap-w: 3.0, count: {n - 3 * a}}}
  - {{device: sim:jetson-nano, power-cap-w: none, count: {a}}}
  - {{device: sim:jetson-tx2nx, power-cap-w: 4.5, count: {a}}}
  - {{device: sim:jetson-tx2nx, power-cap-w: 3.5, count: {a}}}
task: {{model: cnn-tiny, pretrain-samples: 256, target-accuracy: 0.3, batch-sizes: [8, 16]}}
rounds: 2
seeds: {{relation: [0]}}
budget: {{samples: 96}}
evaluation: {{every-samples: 32, max-samples: 64}}
scale: {{profiles: predicted, real-share: 0.05}}
methods: [ours]
"""


@pytest.mark.parametrize("index", [False, True])
def test_the_index_is_installed_only_when_asked_and_the_nodes_are_recorded_either_way(
    monkeypatch: pytest.MonkeyPatch, index: bool
) -> None:
    """`run_flwr(index_messages=False)` (bench/fleet_scale.py's baseline) sets $POWERFED_MESSAGE_INDEX=0:
    the simulation keeps Flower's link state and dispatch, and still records its virtual nodes."""
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate import linkstate_factory

    flowers = {
        "state": linkstate_factory.InMemoryLinkState,  # type: ignore[attr-defined]
        "dispatch": vce_api.add_messages_to_queue,
        "register": vce_api._register_nodes,
    }
    for module, name in ((linkstate_factory, "InMemoryLinkState"), (vce_api, "add_messages_to_queue")):
        monkeypatch.setattr(module, name, getattr(module, name))  # put back after the test
    monkeypatch.setattr(vce_api, "_register_nodes", vce_api._register_nodes)
    monkeypatch.setattr(vce_api, "_register_node_info_stores", vce_api._register_node_info_stores)
    li.install(index=index)
    assert (linkstate_factory.InMemoryLinkState is li.indexed_state_class()) is index  # type: ignore[attr-defined]
    assert (linkstate_factory.InMemoryLinkState is flowers["state"]) is not index  # type: ignore[attr-defined]
    assert (vce_api.add_messages_to_queue is li.add_messages_to_queue) is index
    assert (vce_api.add_messages_to_queue is flowers["dispatch"]) is not index
    assert vce_api._register_nodes is not flowers["register"]  # the node record, with or without the index


def test_the_installed_flower_is_the_source_the_index_copies() -> None:
    """flwr 1.42 here and 1.41 in `make test-flower-floor`: the functions the index copies or wraps."""
    assert li.changed_flower_sources() == []


def test_a_flower_whose_copied_source_changed_keeps_its_own_dispatch(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A release of the supported series whose `add_messages_to_queue` is not the one the index copies:
    install() logs one line and leaves Flower's link state and dispatch; the nodes are still recorded."""
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.linkstate import linkstate_factory

    def changed_dispatch(state: Any, queue: Any, nodes_mapping: Any, f_stop: Any) -> None:
        """Flower's loop, changed in a later release."""

    flowers_state = linkstate_factory.InMemoryLinkState  # type: ignore[attr-defined]
    monkeypatch.setattr(linkstate_factory, "InMemoryLinkState", flowers_state)
    monkeypatch.setattr(vce_api, "add_messages_to_queue", changed_dispatch)
    monkeypatch.setattr(vce_api, "_register_nodes", vce_api._register_nodes)
    monkeypatch.setattr(vce_api, "_register_node_info_stores", vce_api._register_node_info_stores)
    register = vce_api._register_nodes
    with caplog.at_level("INFO"):
        li.install(index=True)
    lines = [r.getMessage() for r in caplog.records if "message index" in r.getMessage()]
    assert lines == [
        f"powerfed: the message index is not used (Flower's own dispatch is): flwr {li.flower_version()}'s "
        "vce_api.add_messages_to_queue differ from the source simulations.linkstate_index copies"
    ]
    assert linkstate_factory.InMemoryLinkState is flowers_state  # type: ignore[attr-defined]
    assert vce_api.add_messages_to_queue is changed_dispatch
    assert vce_api._register_nodes is not register  # the node record all the same
