"""The JSON files of docs/reference/files.md: round trips, and one clear error for every kind of bad file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from powerctl.errors import FileFormatError
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector


def _profile_dict() -> dict:
    return {
        "schema": "powerctl.profile/2",
        "device": "jetson-nano",
        "model": "resnet18",
        "input_shape": [3, 32, 32],
        "samples": 12500,
        "points": [
            {
                "batch_size": 32,
                "frequency_hz": 921600000,
                "peak_power_w": 9.8,
                "mean_power_w": 8.7,
                "seconds_per_batch": 0.21,
                "seconds_for_samples": 82.0,
            },
            {
                "batch_size": 4,
                "frequency_hz": 921600000,
                "peak_power_w": 5.1,
                "mean_power_w": 4.2,
                "seconds_per_batch": 0.05,
                "seconds_for_samples": 156.0,
            },
        ],
    }


def _write(tmp_path: Path, data: object, name: str = "f.json") -> Path:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return p


def test_design_example_profile_loads(tmp_path: Path) -> None:
    prof = Profile.load(_write(tmp_path, _profile_dict()))
    assert prof.batch_sizes() == [4, 32]
    assert prof.point(32, 921600000).peak_power_w == 9.8
    assert prof.point(8, 921600000) is None


def _mutations():
    def set_point(key, value):
        def f(d):
            d["points"][0][key] = value

        return f

    yield "NaN", "not valid JSON", lambda d: None, '{"schema": "powerctl.profile/2", "x": NaN}'
    yield "negative", "peak_power_w", set_point("peak_power_w", -1.0), None
    yield "zero time", "seconds_per_batch", set_point("seconds_per_batch", 0), None
    yield "string number", "frequency_hz", set_point("frequency_hz", "921600000"), None
    yield "bool batch", "batch_size", set_point("batch_size", True), None
    yield "mean above peak", "mean_power_w exceeds", set_point("mean_power_w", 99.0), None
    yield "wrong schema", "schema", lambda d: d.update(schema="powerctl.relation/2"), None
    yield "no points", "no profiled points", lambda d: d.update(points=[]), None
    yield "duplicate", "duplicate", lambda d: d["points"].append(dict(d["points"][0])), None
    yield "missing field", "missing key 'samples'", lambda d: d.pop("samples"), None
    yield "bad shape", "input_shape", lambda d: d.update(input_shape=[3, -32]), None


@pytest.mark.parametrize(
    ("case", "message", "mutate", "raw"), list(_mutations()), ids=[m[0] for m in _mutations()]
)
def test_bad_profiles_are_one_clear_line(tmp_path: Path, case, message, mutate, raw) -> None:
    d = _profile_dict()
    mutate(d)
    path = _write(tmp_path, raw if raw is not None else d)
    with pytest.raises(FileFormatError) as err:
        Profile.load(path)
    text = str(err.value)
    assert message in text and str(path) in text and "\n" not in text


def test_missing_and_garbage_files(tmp_path: Path) -> None:
    with pytest.raises(FileFormatError, match="no such file"):
        Profile.load(tmp_path / "nope.json")
    with pytest.raises(FileFormatError, match="not valid JSON"):
        RelationVector.load(_write(tmp_path, "{truncated"))
    with pytest.raises(FileFormatError, match="JSON object"):
        RelationVector.load(_write(tmp_path, "[1, 2]"))


def test_relation_round_trip_and_definition(tmp_path: Path) -> None:
    rv = RelationVector.from_samples("resnet18", "cifar10", 0.87, {64: 3000, 4: 1000, 128: 4000})
    rv.save(tmp_path / "r.json")
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["batch_sizes"] == [4, 64, 128]
    assert data["relation"] == [0.25, 0.75, 1.0]
    assert RelationVector.load(tmp_path / "r.json").as_map() == {4: 0.25, 64: 0.75, 128: 1.0}


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"batch_sizes": [8, 4], "samples_to_target": [1, 2]}, "strictly increasing"),
        ({"samples_to_target": [1.0]}, "differ in length"),
        ({"samples_to_target": [0, 5]}, "'samples_to_target' must be a number in (0, 1000000000000], got 0"),
        ({"relation": [0.5, 0.9]}, "not samples_to_target divided"),
        ({"target_accuracy": 1.5}, "(0, 1]"),
        ({"batch_sizes": []}, "empty"),
    ],
)
def test_bad_relations(tmp_path: Path, patch: dict, message: str) -> None:
    d = RelationVector.from_samples("m", "p", 0.8, {4: 10.0, 8: 20.0}).to_dict()
    d.update(patch)
    with pytest.raises(FileFormatError, match=message.replace("(", r"\(").replace("]", r"\]")):
        RelationVector.load(_write(tmp_path, d))


def test_write_is_atomic(tmp_path: Path) -> None:
    rv = RelationVector.from_samples("m", "p", 0.8, {4: 10.0})
    rv.save(tmp_path / "sub" / "r.json")
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["r.json"]
    old = os.umask(0o022)
    try:
        rv.save(tmp_path / "shared.json")
    finally:
        os.umask(old)
    assert (tmp_path / "shared.json").stat().st_mode & 0o777 == 0o644


def _xdg_folder(variable: str) -> Path:
    """The folder that follows `variable`: the profile cache, the pin records, a run's results."""
    if variable == "XDG_CACHE_HOME":
        from powerctl.files.cache import cache_dir

        return cache_dir("profile")
    if variable == "XDG_STATE_HOME":
        from powerctl.pinning.freqstate import state_dir

        return state_dir()
    from fl_server.app import default_results_dir

    return default_results_dir(7)


@pytest.mark.parametrize("variable", ["XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"])
def test_the_xdg_base_folders_are_honoured(tmp_path: Path, monkeypatch, variable: str) -> None:
    """The cache, the pin records and the results follow $XDG_*_HOME when it is absolute; a relative
    one is ignored (the XDG specification), the default under ~ used."""
    monkeypatch.delenv("POWERFED_CACHE", raising=False)
    monkeypatch.delenv("POWERCTL_STATE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(variable, str(tmp_path / "xdg"))
    assert _xdg_folder(variable).is_relative_to(tmp_path / "xdg")
    monkeypatch.setenv(variable, "relative/xdg")
    assert _xdg_folder(variable).is_relative_to(tmp_path / "home")
