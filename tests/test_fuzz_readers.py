"""Every reader of a JSON or YAML file (and the weights loader) meets arbitrary input with its own one-line
error or a valid object, never another exception: hypothesis over whole documents and over valid
documents with one field replaced."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fl_client.node import resolve_node
from fl_server.run_config import RunConfigError, ServerConfig, parse_server_config
from fl_server.weights import load_weights
from powerctl.devices.boards import _raw_boards, parse_boards
from powerctl.errors import DeviceError, FileFormatError, PowerctlError
from powerctl.files.jsonfile import read_json
from powerctl.pinning.freqstate import STATE_SCHEMA, BoardRecord, read_record, record_path
from powerctl.records.profile import PROFILE_SCHEMA, Profile
from powerctl.records.relation import RELATION_SCHEMA, RelationVector
from strategies.fleet import NodeConfigError, load_fleet, load_fleet_file

RAW_BOARDS = _raw_boards()
"""boards.yaml read once (27 ms a read): each example breaks a copy."""
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)

VALID_PROFILE: dict[str, Any] = {
    "schema": PROFILE_SCHEMA,
    "device": "jetson-nano",
    "model": "cnn-tiny",
    "input_shape": [3, 32, 32],
    "samples": 1000,
    "points": [
        {"batch_size": 8, "frequency_hz": 76800000, "peak_power_w": 2.1, "mean_power_w": 2.0,
         "seconds_per_batch": 0.01, "seconds_for_samples": 1.25},
    ],
}  # fmt: skip
VALID_RELATION: dict[str, Any] = {
    "schema": RELATION_SCHEMA,
    "model": "cnn-tiny",
    "proxy_dataset": "synthetic-image",
    "target_accuracy": 0.7,
    "batch_sizes": [8, 16],
    "samples_to_target": [900.0, 1000.0],
}
VALID_RECORD: dict[str, Any] = {
    "schema": STATE_SCHEMA,
    "key": "jetson-nano@abc",
    "spec": "jetson",
    "kind": "pin",
    "state": {"min_freq": "76800000"},
    "pid": 12,
    "under": None,
}


def _mutated(valid: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """`valid` with one key replaced by (or deleted for) an arbitrary JSON value."""
    keys = sorted(valid)

    def mutate(key: str, value: Any, delete: bool) -> dict[str, Any]:
        d = json.loads(json.dumps(valid))
        if delete:
            d.pop(key)
        else:
            d[key] = value
        return d

    return st.builds(mutate, st.sampled_from(keys), json_values, st.booleans())


def _dump(data: Any) -> str:
    return json.dumps(data, allow_nan=True)


def _read_profile(path: Path) -> Any:
    return Profile.from_dict(read_json(path, PROFILE_SCHEMA), str(path))


def _read_relation(path: Path) -> Any:
    return RelationVector.from_dict(read_json(path, RELATION_SCHEMA), str(path))


@pytest.mark.parametrize(
    ("reader", "valid"),
    [(_read_profile, VALID_PROFILE), (_read_relation, VALID_RELATION)],
    ids=["profile", "relation"],
)
@FUZZ
@given(data=st.data())
def test_profile_and_relation_readers_raise_only_file_format_errors(
    tmp_path: Path, reader: Any, valid: dict[str, Any], data: st.DataObject
) -> None:
    path = tmp_path / "f.json"
    doc = data.draw(_mutated(valid) | json_values | st.text(max_size=60).map(lambda t: t))
    path.write_text(doc if isinstance(doc, str) and data.draw(st.booleans()) else _dump(doc))
    try:
        obj = reader(path)
    except FileFormatError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        return
    for p in getattr(obj, "points", []):  # what it accepts is usable: finite, positive
        assert math.isfinite(p.peak_power_w) and p.peak_power_w > 0 and p.mean_power_w <= p.peak_power_w
    for s in getattr(obj, "samples_to_target", []):
        assert math.isfinite(s) and s > 0


@FUZZ
@given(doc=_mutated(VALID_RECORD) | json_values)
def test_the_board_record_reader_raises_only_file_format_errors(doc: Any) -> None:
    path = record_path("jetson-nano@abc")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dump(doc))
    try:
        record = read_record("jetson-nano@abc")
    except FileFormatError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(record, BoardRecord) and record.kind in ("pin", "set")


def test_a_valid_board_record_round_trips() -> None:
    path = record_path("jetson-nano@abc")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_dump(VALID_RECORD))
    assert read_record("jetson-nano@abc") == BoardRecord(
        "jetson-nano@abc", "jetson", "pin", {"min_freq": "76800000"}, 12
    )


yaml_docs = json_values.map(lambda v: yaml.safe_dump(v)) | st.text(max_size=80)
fleet_entries = st.fixed_dictionaries(
    {},
    optional={
        "device": json_values | st.just("sim:jetson-nano"),
        "power-cap-w": json_values,
        "count": json_values,
    },
)


@FUZZ
@given(doc=yaml_docs | st.lists(fleet_entries, max_size=3).map(lambda b: yaml.safe_dump({"boards": b})))
def test_the_fleet_yaml_reader_raises_only_node_config_errors(tmp_path: Path, doc: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(doc)
    try:
        entries = load_fleet_file(path)
    except NodeConfigError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        return
    assert entries and all(e.power_cap_w is None or e.power_cap_w > 0 for e in entries)


@FUZZ
@given(text=st.text(max_size=60))
def test_the_fleet_table_and_node_config_raise_only_node_config_errors(text: str) -> None:
    try:
        load_fleet(text)
    except NodeConfigError as exc:
        assert "\n" not in str(exc)
    try:
        resolve_node({"device": text, "power-cap-w": text, "partition-id": 0, "num-partitions": 1}, {})
    except NodeConfigError as exc:
        assert "\n" not in str(exc)


run_config_keys = st.sampled_from(sorted(f.replace("_", "-") for f in ServerConfig.__dataclass_fields__))


@FUZZ
@given(config=st.dictionaries(run_config_keys | st.text(max_size=10), scalars, max_size=4))
def test_the_run_config_raises_only_run_config_errors(config: dict[str, Any]) -> None:
    try:
        cfg = parse_server_config(config)
    except RunConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert 0 < cfg.target_accuracy <= 1 and cfg.num_server_rounds >= 1


@FUZZ
@given(data=st.data())
def test_the_boards_yaml_loader_raises_only_device_errors(data: st.DataObject) -> None:
    raw = copy.deepcopy(RAW_BOARDS)
    name = data.draw(st.sampled_from(sorted(raw)))
    field = data.draw(st.sampled_from(sorted(raw[name])))
    broken = {**raw, name: {**raw[name], field: data.draw(json_values)}}
    doc = data.draw(st.just(broken) | json_values)
    try:
        parse_boards(doc)
    except DeviceError as exc:
        assert "\n" not in str(exc)


def test_the_shipped_boards_yaml_parses() -> None:
    assert {"jetson-nano", "jetson-tx2nx"} <= set(parse_boards(_raw_boards()))


@FUZZ
@given(blob=st.binary(max_size=200))
def test_a_weights_file_of_arbitrary_bytes_is_one_line_and_never_unpickled(
    tmp_path: Path, blob: bytes
) -> None:
    path = tmp_path / "w.safetensors"
    path.write_bytes(blob)
    with pytest.raises(PowerctlError) as err:
        load_weights(path)
    assert "\n" not in str(err.value) and str(path) in str(err.value)


def test_a_pickled_torch_file_is_refused_without_being_unpickled(tmp_path: Path) -> None:
    import pickle

    class Boom:
        def __reduce__(self) -> Any:
            return (pytest.fail, ("unpickled: a weights file ran code",))

    path = tmp_path / "w.safetensors"
    path.write_bytes(pickle.dumps(Boom()))
    with pytest.raises(PowerctlError, match="not a readable safetensors weights file"):
        load_weights(path)
