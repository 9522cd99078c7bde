"""What a board's ClientApp process imports for each message: a deployed SuperNode starts one process per
message, so a `query` (the node describes itself) must import no torch, no training core, nothing of
the fleet runner, plots or Ray; a `train` message imports what training needs. Each check runs in a
fresh interpreter (this test process has torch loaded already), as `flwr-clientapp` would.

The query loads no data either: the node's data (name, train and test sizes) comes back with its
evaluate reply, and the server completes its node record with it (results.json's `nodes`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

from strategies.rounds import NodeInfo
from tests.fake_grid import set_task_identity

ROOT = Path(__file__).resolve().parents[1]
HEAVY = {"torch", "ray", "matplotlib", "simulations", "tensorboard"}
"""Top-level packages a board's query must not import."""

NANO = {
    "device": "sim:jetson-nano",
    "power-cap-w": 5.0,
    "partition-id": 0,
    "num-partitions": 2,
    "name": "nano",
}
RUN_CONFIG = {"model": "cnn-tiny", "client-data": "synthetic-image", "client-data-seed": 2}

SCRIPT = """
import json, sys
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.supercore.task_identity import TaskIdentity

import fl_client.app
import fl_client.mod
from fl_client.mod import describe_node, power_aware_mod

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 0
node, run_config = json.loads(sys.argv[1]), json.loads(sys.argv[2])
HEAVY = set(json.loads(sys.argv[3]))


def send(app, kind, content=None):
    msg = Message(content or RecordDict({}), dst_node_id=3, message_type=kind)
    ctx = Context(run_id=7, node_id=3, node_config=node, state=RecordDict(), run_config=run_config)
    reply = app(message=msg, context=ctx)
    return reply.error.reason if reply.has_error() else dict(reply.content.config_records["node"])


def heavy():
    return sorted({m.split(".")[0] for m in sys.modules} & HEAVY)


user_app = ClientApp(mods=[power_aware_mod])  # a user's own app with the Mod, describing itself
user_app.query()(describe_node)
out = {"after import": heavy()}
out["built-in query"] = send(fl_client.app.app, MessageType.QUERY)
out["user query"] = send(user_app, MessageType.QUERY)
out["after queries"] = heavy()
out["train"] = send(fl_client.app.app, MessageType.TRAIN)  # no plan, no weights: an error reply
out["after train"] = heavy()
print(json.dumps(out))
"""


def _board_process() -> dict[str, Any]:
    """A fresh interpreter that imports both apps, answers a query through each, then gets a train."""
    args = [json.dumps(NANO), json.dumps(RUN_CONFIG), json.dumps(sorted(HEAVY))]
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_query_imports_no_torch_and_a_train_message_does() -> None:
    out = _board_process()
    assert out["after import"] == [], "importing fl_client.mod and fl_client.app"
    described = {"node-key": "nano", "device": "sim:jetson-nano", "board": "jetson-nano", "power-cap-w": 5.0}
    assert out["built-in query"] == {**described, "partition-id": 0}
    assert out["user query"] == {**described, "partition-id": 0}
    assert out["after queries"] == [], "answering a query"
    assert isinstance(out["train"], str) and "\n" not in out["train"]  # one error line: no plan sent
    assert "torch" in out["after train"] and "simulations" not in out["after train"]


def test_the_evaluate_reply_names_the_node_data_and_the_server_keeps_it() -> None:
    from fl_client.app import app
    from tests.fl_helpers import initial_state

    set_task_identity()
    from flwr.app import ArrayRecord

    content = RecordDict(
        {
            "config": ConfigRecord({"model": "cnn-tiny", "num-classes": 10, "model-overrides": "{}"}),
            "arrays": ArrayRecord(initial_state(), keep_input=True),
        }
    )
    msg = Message(content, dst_node_id=3, message_type=MessageType.EVALUATE)
    ctx = Context(run_id=7, node_id=3, node_config=NANO, state=RecordDict(), run_config=RUN_CONFIG)
    reply = app(message=msg, context=ctx)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    record = reply.content.config_records["node"]
    assert (
        record["train-examples"] > 0 and record["test-examples"] == reply.content["metrics"]["num-examples"]
    )
    met = NodeInfo(node_id=3, key="nano", device="sim:jetson-nano", board="jetson-nano")
    known = met.with_data(record)
    assert (known.data, known.train_examples, known.test_examples) == (
        record["data"],
        record["train-examples"],
        record["test-examples"],
    )
    assert (known.key, known.board) == ("nano", "jetson-nano")


@pytest.mark.parametrize(
    "record",
    [
        {},
        {"node-key": "nano"},
        {"train-examples": -1, "test-examples": 2},
        {"train-examples": True, "test-examples": 2},
    ],
)
def test_an_evaluate_reply_without_data_sizes_leaves_the_node_as_it_was(record: dict[str, Any]) -> None:
    met = NodeInfo(
        node_id=3, key="nano", device="sim:jetson-nano", data="x", train_examples=5, test_examples=2
    )
    assert met.with_data(record) == met


def test_a_process_started_for_its_message_measures_its_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """`flwr-clientapp` (a deployed SuperNode's process per message): seconds since this process
    started; any other process (simulation's actors, this test) serves many messages: None."""
    import time

    from fl_client.round import message_process_startup_s
    from powerctl.procs import seconds_since_start

    assert message_process_startup_s() is None
    monkeypatch.setattr(sys, "argv", ["/venv/bin/flwr-clientapp", "--token", "x"])
    before = seconds_since_start(os.getpid())
    time.sleep(0.05)
    startup = message_process_startup_s()
    assert before is not None and startup is not None and before <= startup + 0.01
    assert abs(startup - (seconds_since_start(os.getpid()) or 0.0)) < 0.2


def _client(**extra: Any) -> dict[str, Any]:
    return {
        "node_key": "nano",
        "device": "jetson",
        "power_cap_w": 5.0,
        "batch_size": 8,
        "frequency_hz": 614_400_000,
        "profiling_s": 1.25,
        "device_s": 13.5,
        "energy_j": 40.0,
        "peak_power_w": 4.9,
        "accuracy": 0.5,
        "reached_target": False,
        **extra,
    }


def test_the_round_table_shows_start_up_seconds_where_a_client_measured_them() -> None:
    from fl_server.results import client_table
    from strategies.rounds import RoundRecord

    plain = client_table(RoundRecord(round=1, clients=[_client()], failed=[], summary={})).splitlines()
    assert "start s" not in plain[0]  # simulation: the table as it always was
    both = [_client(startup_s=6.34), _client(node_key="tx2nx", startup_s=None)]
    lines = client_table(RoundRecord(round=1, clients=both, failed=[], summary={})).splitlines()
    head = lines[0].split()
    assert head[head.index("device") + 12 : head.index("device") + 14] == ["start", "s"]
    assert lines[2].split()[8:10] == ["13.5", "6.3"] and lines[3].split()[8:10] == ["13.5", "-"]
    assert lines[0].replace(" start s", "") == plain[0] and lines[2].replace("     6.3", "") == plain[2]


def test_the_report_carries_start_up_seconds_to_the_results_file() -> None:
    from fl_server.results import client_table
    from strategies.report import ClientReport, Profiling, Training
    from strategies.rounds import RoundRecord, report_row

    fields = {"device": "jetson", "power_cap_w": 5.0, "batch_size": 8, "frequency_hz": 614_400_000}
    fields |= {"training": Training(13.5, 40.0, 4.9, 64, 0.5, False), "profiling": Profiling(1.25)}
    report = ClientReport(**fields, startup_s=6.34)
    back = ClientReport.from_config(report.to_config())
    assert (
        back.startup_s == 6.34
        and ClientReport.from_config(ClientReport(**fields).to_config()).startup_s is None
    )
    row = report_row(back, NodeInfo(node_id=1, key="nano", device="jetson"))
    assert row["startup_s"] == 6.34 and json.loads(json.dumps(row))["startup_s"] == 6.34
    assert "start s" in client_table(RoundRecord(round=1, clients=[row], failed=[], summary={}))


def test_results_json_nodes_keep_their_data_though_the_query_loads_none(tmp_path: Path) -> None:
    """A round through the server and the built-in ClientApp: each node's data name and sizes reach
    results.json's `nodes` from its evaluate reply, as they did from its query."""
    from tests.test_fl_server import _run_config, _server

    path, _ = _server(tmp_path, _run_config(tmp_path, **{"num-server-rounds": 1}), nodes=2)
    nodes = json.loads(path.read_text(encoding="utf-8"))["nodes"]
    assert [n["key"] for n in nodes] == ["partition-0", "partition-1"]
    for i, node in enumerate(nodes):
        assert node["data"] == f"synthetic-image#client{i}", node
        assert node["train_examples"] > 0 and node["test_examples"] > 0, node
