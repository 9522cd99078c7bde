"""Fuzz the ClientApp's message handling: whatever arrives, a valid reply or one error line, board restored.

Messages are a good message with keys dropped, retyped or set to odd values (NaN, negatives, strings,
lists, huge numbers), and weights missing, renamed, reshaped, retyped or holding NaN. The node is a
Jetson Nano on a fake sysfs tree, so "nothing left pinned" is checked byte for byte on its files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fl_client.app import app as client_app
from fl_client.mod import CLIENT_ERROR_CODE
from tests.fake_boards import make_nano_tree, tree_snapshot
from tests.fake_grid import set_task_identity
from tests.fl_helpers import RUN_CONFIG, initial_state, instructions

ODD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.lists(st.floats(allow_nan=True), max_size=3),
    st.sampled_from(["{}", "[]", '{"depth": 3}', "not json", "cnn-tiny", "sqrt", "grid"]),
)

GOOD_TRAIN = dict(
    instructions(relation_batch_sizes=[8], relation_samples=[300.0], budget_samples=16).to_config()
)
OPTIONAL_TRAIN_KEYS = {"power-cap-w"}
EVAL_CONFIG = {"model": "cnn-tiny", "num-classes": 10, "model-overrides": "{}"}


def _config_record(values: dict[str, Any]) -> ConfigRecord | None:
    """A ConfigRecord of `values`, or None when Flower itself refuses a value (the sender can't send it)."""
    clean = {k: v for k, v in values.items() if v is not None}
    try:
        return ConfigRecord(clean)
    except (TypeError, ValueError):
        return None


@st.composite
def configs(draw: st.DrawFn, good: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A good config with some keys dropped (returned too) and some set to odd values."""
    keys = sorted(good)
    cfg = dict(good)
    dropped = draw(st.lists(st.sampled_from(keys), max_size=2, unique=True))
    for key in dropped:
        del cfg[key]
    for key in draw(st.lists(st.sampled_from(keys), max_size=2, unique=True)):
        if key not in dropped:
            cfg[key] = draw(ODD_VALUES)
    if draw(st.booleans()):
        cfg[draw(st.text(min_size=1, max_size=8))] = draw(ODD_VALUES)
    return cfg, dropped


@st.composite
def arrays(draw: st.DrawFn) -> ArrayRecord | None:
    good = {k: v.numpy() for k, v in initial_state().items()}
    how = draw(st.sampled_from(["good", "none", "empty", "drop", "rename", "reshape", "retype", "nan"]))
    if how == "none":
        return None
    name = draw(st.sampled_from(sorted(good)))
    if how == "empty":
        good = {}
    elif how == "drop":
        del good[name]
    elif how == "rename":
        good[name + "_x"] = good.pop(name)
    elif how == "reshape":
        good[name] = np.zeros((3, 1), dtype=good[name].dtype)
    elif how == "retype":
        good[name] = good[name].astype(np.int64)
    elif how == "nan" and good[name].dtype.kind == "f":
        good[name] = np.full_like(good[name], np.nan)
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in good.items()})


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_nano_tree(tmp_path_factory.mktemp("fuzz") / "nano")


def _send(kind: str, config: ConfigRecord | None, weights: ArrayRecord | None, node_config: dict) -> Message:
    set_task_identity()
    content: dict[str, Any] = {}
    if config is not None:
        content["config"] = config
    if weights is not None:
        content["arrays"] = weights
    msg = Message(RecordDict(content), dst_node_id=3, message_type=kind)
    context = Context(run_id=7, node_id=3, node_config=node_config, state=RecordDict(), run_config=RUN_CONFIG)
    return client_app(message=msg, context=context)


def _check(reply: Message, sent: ConfigRecord | None, required: set[str]) -> None:
    """A valid reply, or an error reply of one line; a missing key is named."""
    event("error reply" if reply.has_error() else "valid reply")
    if reply.has_error():
        assert reply.error.code == CLIENT_ERROR_CODE
        reason = reply.error.reason
        assert reason and "\n" not in reason and "Traceback" not in reason, reason
        if "missing key" in reason:
            absent = ["config"] if sent is None else sorted(required - set(sent.keys()))
            assert any(repr(k) in reason for k in [*absent, "arrays"]), reason
    else:
        assert reply.content.metric_records["metrics"]["num-examples"] > 0
        for array in reply.content.array_records.get("arrays", ArrayRecord()).values():
            assert np.all(np.isfinite(array.numpy()))


NODE = {"device": "jetson", "power-cap-w": 10.0, "partition-id": 0, "num-partitions": 3}
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(cfg=configs(GOOD_TRAIN), weights=arrays())
def test_train_messages_get_a_valid_reply_or_one_error_line_and_the_board_is_restored(
    board: Path, monkeypatch: pytest.MonkeyPatch, cfg: tuple[dict, list[str]], weights: ArrayRecord | None
) -> None:
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(board))
    before = tree_snapshot(board)
    record = _config_record(cfg[0])
    reply = _send(MessageType.TRAIN, record, weights, NODE)
    _check(reply, record, set(GOOD_TRAIN) - OPTIONAL_TRAIN_KEYS)
    assert tree_snapshot(board) == before


@FUZZ
@given(cfg=configs(EVAL_CONFIG), weights=arrays())
def test_evaluate_messages_get_a_valid_reply_or_one_error_line(
    board: Path, monkeypatch: pytest.MonkeyPatch, cfg: tuple[dict, list[str]], weights: ArrayRecord | None
) -> None:
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(board))
    record = _config_record(cfg[0])
    reply = _send(MessageType.EVALUATE, record, weights, NODE)
    _check(reply, record, set(EVAL_CONFIG))


@FUZZ
@given(
    node=configs({"device": "sim:jetson-nano", "power-cap-w": 3.0, "partition-id": 1, "num-partitions": 3})
)
def test_query_with_odd_node_configs_gets_a_description_or_one_error_line(
    node: tuple[dict, list[str]],
) -> None:
    values, _ = node
    reply = _send(MessageType.QUERY, None, None, {k: v for k, v in values.items() if v is not None})
    if reply.has_error():
        assert reply.error.code == CLIENT_ERROR_CODE and "\n" not in reply.error.reason
    else:
        # described, and no data loaded
        assert reply.content.config_records["node"]["board"].startswith("jetson-")
