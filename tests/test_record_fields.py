"""Every public record checks every field where it is made (issue 55): built from arbitrary values of the
wrong kind, each is either refused in one line of the project's own error type or a valid record,
never another exception, and what it holds is what a file or a message can carry."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import powerfed
from fl_client.node import NodeSettings
from fl_server.relation.request import RelationCompute
from powerctl.errors import PowerctlError
from powerctl.files.mapping import Kind, field_kinds
from powerctl.records.profile import POINT_KINDS, PROFILE_KINDS, Profile, ProfilePoint
from powerctl.records.relation import RelationVector

HOSTILE = st.one_of(
    st.text(max_size=4),
    st.sampled_from(["", " ", ".", "\ud800", "no", "false", "False", "0", "nan"]),
    st.floats(),  # nan and ±inf included
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**400, -1, 0, 1, 8, 2**31]),
    st.none(),
    st.booleans(),
    st.lists(st.one_of(st.integers(-3, 20), st.floats(), st.text(max_size=2)), max_size=3),
    st.tuples(st.integers(0, 64)),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.sampled_from(
        [np.float32(np.nan), np.float32(0.5), np.int64(-1), np.int64(8), np.bool_(True), np.float64(1e300)]
    ),
    st.sampled_from([Path(""), Path("."), Path("x"), b"x", object()]),
)
"""Values of every wrong kind a hostile caller hands a record."""

REL = RelationVector.from_samples("cnn-tiny", "proxy", 0.5, {8: 300.0, 16: 400.0})
POINT = {
    "batch_size": 8,
    "frequency_hz": 76_800_000,
    "peak_power_w": 4.0,
    "mean_power_w": 3.0,
    "seconds_per_batch": 0.1,
    "seconds_for_samples": 2.0,
}
PROFILE = {
    "device": "sim:jetson-nano",
    "model": "cnn-tiny",
    "input_shape": [3, 32, 32],
    "samples": 160,
    "points": [ProfilePoint(**POINT)],
    "profiling_s": None,
}
RELATION = {
    "model": "cnn-tiny",
    "proxy_dataset": "proxy",
    "target_accuracy": 0.5,
    "batch_sizes": [8, 16],
    "samples_to_target": [300.0, 400.0],
    "extra": {},
}
NODE = {
    "device": "sim:jetson-nano",
    "power_cap_w": 3.0,
    "data": None,
    "partition_id": 0,
    "num_partitions": 1,
    "key": "n0",
    "pin": None,
}
COMPUTE = {"cache_key": None, "cache_dir": None, "use_cache": True, "compute": True, "parallel": False}
PLAN = {
    "cap_poll_s": 1.0,
    "profile_warmup": 1,
    "stand_in": False,
    "node_key": "",
    "server_round": 1,
    "deadline_s": 0.0,
    "budget_samples": 0,
}


def _node(**fields: Any) -> Any:
    return powerfed.NodeSettings(**fields)


def _plan(**fields: Any) -> Any:
    return powerfed.TrainInstructions.for_relation(REL, num_classes=10, **fields)


def _round_context(profile_cache: Any) -> Any:
    return powerfed.RoundContext(_node(**NODE), _plan(), profile_cache)


RECORDS: dict[str, tuple[Callable[..., Any], dict[str, Any]]] = {
    "ProfilePoint": (ProfilePoint, POINT),
    "Profile": (Profile, PROFILE),
    "RelationVector": (RelationVector, RELATION),
    "NodeSettings": (_node, NODE),
    "RelationCompute": (powerfed.RelationCompute, COMPUTE),
    "TrainInstructions": (_plan, PLAN),
    "RoundContext": (_round_context, {"profile_cache": None}),
}
"""Each public record a user builds by hand: how it is made, and valid values of the fields tried."""

KINDS: dict[str, dict[str, Kind]] = {
    "ProfilePoint": POINT_KINDS,
    "Profile": PROFILE_KINDS,
    "NodeSettings": field_kinds(NodeSettings),
    "RelationCompute": field_kinds(RelationCompute),
}
"""The records whose fields are declared by kinds: what a made record holds must be what its kind gives
back (a plain number, never numpy's; a bool, never "false")."""


def _made_or_refused(record: str, field: str, value: Any) -> Any:
    """The record with `field` set to `value`, or None where it was refused in one line."""
    make, valid = RECORDS[record]
    try:
        made = make(**{**valid, field: value})
    except PowerctlError as exc:
        assert "\n" not in str(exc) and str(exc), repr(exc)
        return None
    return made


def _holds_what_it_was_checked_to(record: str, made: Any) -> None:
    for name, kind in KINDS.get(record, {}).items():
        held = getattr(made, name)
        assert kind(held) == held and type(kind(held)) is type(held), (name, held)
    if isinstance(made, RelationVector):
        json.dumps(made.to_dict(), allow_nan=False)  # savable and sendable as it is
        assert isinstance(made.batch_sizes, tuple) and isinstance(made.samples_to_target, tuple)
        assert all(type(b) is int for b in made.batch_sizes)
    if isinstance(made, ProfilePoint):
        assert made.mean_power_w <= made.peak_power_w * (1 + 1e-9)


@pytest.mark.parametrize("record", sorted(RECORDS))
@settings(max_examples=80, deadline=None)
@given(data=st.data(), value=HOSTILE)
def test_a_record_of_hostile_fields_is_refused_in_one_line_or_valid(
    record: str, data: Any, value: Any
) -> None:
    field = data.draw(st.sampled_from(sorted(RECORDS[record][1])), label="field")
    made = _made_or_refused(record, field, value)
    if made is not None:
        _holds_what_it_was_checked_to(record, made)


@pytest.mark.parametrize("record", sorted(RECORDS))
def test_every_record_is_made_from_its_valid_fields(record: str) -> None:
    make, valid = RECORDS[record]
    _holds_what_it_was_checked_to(record, make(**valid))


@pytest.mark.parametrize(
    "record, field, value",
    [
        ("NodeSettings", "pin", "false"),
        ("NodeSettings", "pin", np.False_),
        ("NodeSettings", "pin", 0),
        ("RelationCompute", "compute", "no"),
        ("RelationCompute", "use_cache", "no"),
        ("RelationCompute", "parallel", "False"),
        ("TrainInstructions", "stand_in", "no"),
    ],
)
def test_a_flag_is_exactly_a_bool(record: str, field: str, value: Any) -> None:
    assert _made_or_refused(record, field, value) is None


def test_a_flag_argument_is_exactly_a_bool(tmp_path: Path) -> None:
    from powerctl.selection.joint import select

    profile = Profile(**PROFILE)
    calls: list[Callable[[], Any]] = [
        lambda: powerfed.open_device("sim:jetson-nano", pin="false"),
        lambda: powerfed.open_device("sim:jetson-nano", pin=np.False_),
        lambda: select(profile, REL, None, allow_mismatch="no"),
        lambda: powerfed.register_model("held-out-flag", lambda: None, input_shape=(1,), replace="no"),
    ]
    for call in calls:
        with pytest.raises(PowerctlError) as err:
            call()
        assert "must be true or false" in str(err.value) and "\n" not in str(err.value)
    assert "held-out-flag" not in powerfed.model_names()
    assert powerfed.open_device("sim:jetson-nano", pin=False).pins is False  # a bool is still taken


def test_a_relation_vector_cannot_change_behind_a_plan() -> None:
    rel = RelationVector.from_samples("cnn-tiny", "proxy", 0.5, {8: 300.0, 16: 400.0})
    plan = _plan()
    with pytest.raises(TypeError):
        rel.samples_to_target[0] = -1  # type: ignore[index]
    with pytest.raises(AttributeError):
        rel.samples_to_target = (1.0, 2.0)  # type: ignore[misc]
    assert plan.relation_vector.relation == [0.75, 1.0]
    # what a file holds and what a Python vector holds are one record: lists written, tuples read back
    back = RelationVector.from_dict(json.loads(json.dumps(rel.to_dict())))
    assert back == rel and rel.to_dict()["batch_sizes"] == [8, 16]


@pytest.mark.parametrize("key", ["batch_sizes", "target_accuracy", "relation", "schema"])
def test_extra_never_shadows_a_field(key: str) -> None:
    with pytest.raises(PowerctlError) as err:
        RelationVector(**{**RELATION, "extra": {key: [4096]}})
    assert f"'extra' key {key!r} is a field" in str(err.value)


def test_numpy_values_in_a_relation_vector_are_kept_plain(tmp_path: Path) -> None:
    rel = RelationVector.from_samples(
        "cnn-tiny",
        "proxy",
        np.float32(0.5),
        {np.int64(8): np.float32(300.0), 16: 400.0},
        lr_max=np.float32(1e-3),
    )
    assert type(rel.target_accuracy) is float and type(rel.extra["lr_max"]) is float
    assert [type(b) for b in rel.batch_sizes] == [int, int]
    rel.save(tmp_path / "rel.json")
    assert RelationVector.load(tmp_path / "rel.json") == rel


def _seeded_vector() -> RelationVector:
    return RelationVector.from_seeds(
        "cnn-tiny", "proxy", 0.5, {8: [300.0, 320.0], 16: [400.0, 380.0]}, lr=[1e-3, 2e-3]
    )


def test_a_relation_vectors_evidence_cannot_change_behind_a_plan() -> None:
    rel = _seeded_vector()
    plan = powerfed.TrainInstructions.for_relation(rel, num_classes=10)
    before = rel.to_dict()
    with pytest.raises(TypeError):
        rel.extra["samples_per_seed"][0] = [1.0, 1.0]
    with pytest.raises(TypeError):
        rel.extra["samples_per_seed"][0][0] = 1.0
    with pytest.raises(TypeError):
        rel.extra["x"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        rel.extra["batch_efficiency"]["e_min"] = 0.0
    with pytest.raises(AttributeError):
        rel.extra["lr"].append(1.0)
    assert rel.to_dict() == before and plan.relation_vector.to_dict() == before
    assert rel.per_seed_samples() == [[300.0, 320.0], [400.0, 380.0]]


def test_a_relation_vectors_evidence_is_written_as_plain_json(tmp_path: Path) -> None:
    rel = _seeded_vector()
    d = rel.to_dict()
    assert type(d["samples_per_seed"]) is list and type(d["samples_per_seed"][0]) is list
    assert type(d["batch_efficiency"]) is dict and d["lr"] == [1e-3, 2e-3]
    rel.save(tmp_path / "rel.json")
    text = (tmp_path / "rel.json").read_text()
    back = RelationVector.load(tmp_path / "rel.json")
    assert back == rel and back.to_dict() == d
    back.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == text  # byte for byte


def test_a_relation_vector_pickles_compares_and_is_replaced() -> None:
    import dataclasses
    import pickle

    rel = _seeded_vector()
    assert pickle.loads(pickle.dumps(rel)) == rel  # Ray sends records between processes
    assert hash(pickle.loads(pickle.dumps(rel))) == hash(rel)
    more = dataclasses.replace(rel, extra={**rel.extra, "note": "x"})
    assert more.extra["note"] == "x" and more != rel and "note" not in rel.extra
    assert dataclasses.replace(rel) == rel


def test_a_profiles_sequences_cannot_change_behind_a_selection() -> None:
    skipped = [{"batch_size": 32, "reason": "out of memory"}]
    profile = Profile(
        **{**PROFILE, "skipped": skipped, "predicted": [ProfilePoint(**{**POINT, "batch_size": 16})]}
    )
    before = profile.to_dict()
    point = ProfilePoint(**{**POINT, "frequency_hz": 1})
    with pytest.raises(AttributeError):
        profile.points.append(point)  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        profile.points[0] = point  # type: ignore[index]
    with pytest.raises(AttributeError):
        profile.predicted.append(point)  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        profile.input_shape[0] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        profile.skipped[0]["batch_size"] = 8  # type: ignore[index]
    skipped.append({"batch_size": 64, "reason": "given after"})  # the caller's list is not the profile's
    assert profile.to_dict() == before and before["skipped"] == skipped[:1]
    assert type(before["input_shape"]) is list and type(before["points"]) is list


def test_a_profile_is_written_as_before(tmp_path: Path) -> None:
    profile = Profile(**{**PROFILE, "skipped": [{"batch_size": 32, "reason": "out of memory"}]})
    profile.save(tmp_path / "p.json")
    text = (tmp_path / "p.json").read_text()
    back = Profile.load(tmp_path / "p.json")
    assert back == profile and back.points == profile.points == (ProfilePoint(**POINT),)
    back.save(tmp_path / "again.json")
    assert (tmp_path / "again.json").read_text() == text
    assert (
        json.loads(text)["input_shape"] == [3, 32, 32] and json.loads(text)["skipped"][0]["batch_size"] == 32
    )


def test_readers_of_a_vectors_evidence_read_it_read_only() -> None:
    """What reads `extra` reads the read-only evidence as it read the dict: a vector of another input
    shape or another model is still told apart."""
    import torch

    from powerctl.selection.joint import MismatchError, check_pairing
    from powerfed.training.models import model_fingerprint, same_model

    profile = Profile(**PROFILE)
    other_shape = RelationVector(**{**RELATION, "extra": {"input_shape": [1, 28, 28]}})
    with pytest.raises(MismatchError, match=r"the relation vector's \[1, 28, 28\]"):
        check_pairing(profile, other_shape)
    same_shape = RelationVector(**{**RELATION, "extra": {"input_shape": [3, 32, 32]}})
    assert not any("input shape" in w for w in check_pairing(profile, same_shape))
    model = torch.nn.Linear(4, 2)
    rel = RelationVector(**{**RELATION, "extra": {"model_fingerprint": model_fingerprint(model)}})
    assert same_model(rel.extra["model_fingerprint"], model) is None
    assert same_model(rel.extra["model_fingerprint"], torch.nn.Linear(4, 3)) is not None


def test_a_workloads_shape_cannot_change_behind_a_profile() -> None:
    from powerctl.records.workload import Workload

    shape = [3, 32, 32]
    workload = Workload("cnn-tiny", shape, 1e6, 1e4, 1e5)  # type: ignore[arg-type]
    shape[0] = 1
    assert workload.input_shape == (3, 32, 32)
    with pytest.raises(TypeError):
        workload.input_shape[0] = 1  # type: ignore[index]
    assert workload.to_dict()["input_shape"] == [3, 32, 32]
    assert Workload(**json.loads(json.dumps(workload.to_dict()))) == workload


def test_a_plans_model_options_cannot_change_behind_it() -> None:
    import dataclasses
    import pickle

    options: dict[str, Any] = {"width": 8}
    plan = powerfed.TrainInstructions.for_relation(REL, num_classes=10, model_overrides=options)
    options["width"] = 1  # the caller's dict is not the plan's
    with pytest.raises(TypeError):
        plan.model_overrides["width"] = 2  # type: ignore[index]
    assert plan.model_overrides == {"width": 8} and plan.overrides_text() == '{"width": 8}'
    assert plan.to_config()["model-overrides"] == '{"width": 8}'
    assert pickle.loads(pickle.dumps(plan)) == plan
    again = dataclasses.replace(plan, model_overrides={**plan.model_overrides, "width": 4})
    assert again.model_overrides == {"width": 4} and plan.model_overrides == {"width": 8}


def test_nested_model_options_keep_their_own_json() -> None:
    """Equal-comparing options (1 == True) each write their own value, however often they are seen."""
    from powerctl.files.jsonfile import frozen_json
    from strategies.protocol import _thawed

    texts = [json.dumps({"o": frozen_json({"a": v})}, default=_thawed) for v in (1, True, 1.0)]
    assert texts == ['{"o": {"a": 1}}', '{"o": {"a": true}}', '{"o": {"a": 1.0}}']
