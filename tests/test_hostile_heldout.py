"""Held-out hostile inputs (issue 28's last bar; docs: notes/redteam.md): inputs the issue did not list,
each answered with one line on stderr, exit status 2, and nothing written. The first part holds the
ones that were not (a YAML alias bomb hung, a seed of 10^20 reached Flower, a cap source option given
twice or a time of 1e300 was taken, a profile point of 1e308 W was read, a key given twice in a JSON
file was kept silently, $POWERFED_CACHE naming a file failed only after the work); the second a sample
of those that were, so that they stay so."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fl_server.cli import main as fl_server_main
from powerfed.training.powerctl_cli import main as powerctl_main
from simulations.__main__ import main as simulations_main

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
RELATION = EXAMPLES / "relation-cnn-tiny.json"

Main = Callable[[list[str]], Any]


def _refused(main: Main, argv: list[str], capsys: pytest.CaptureFixture[str], prog: str) -> str:
    """`main(argv)` exits 2 with one line on stderr starting with `prog`; returns the line."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(prog), err
    return err


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --- fleet files --------------------------------------------------------------------------------

_LAUGHS = (
    "[&a [x,x,x,x,x,x,x,x,x], "
    + ", ".join(f"&{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]" for i in range(9))
    + "]"
)
GROUP = "groups: [{device: sim:jetson-nano}]\n"
TASK = "task: {model: cnn-tiny}\n"

FLEETS = {
    # were accepted or hung
    "laughs-as-name": (f"name: {_LAUGHS}\n{GROUP}{TASK}", "expand to more than 1,000,000 values"),
    "laughs-as-model": (f"{GROUP}task: {{model: {_LAUGHS}}}\n", "expand to more than 1,000,000 values"),
    "laughs-as-batch-sizes": (
        f"{GROUP}task: {{model: cnn-tiny, batch-sizes: {_LAUGHS}}}\n",
        "expand to more than 1,000,000 values",
    ),
    "alias-inside-itself": (
        "groups: &g [{device: sim:jetson-nano, x: *g}]\n" + TASK,
        "refers to a value that holds it",
    ),
    "seed-over-int64": (f"{GROUP}{TASK}seeds: {{run: 99999999999999999999}}\n", "'run' must be an integer"),
    "rounds-1e12": (f"{GROUP}{TASK}rounds: 1000000000000\n", "'rounds' must be an integer in [1, 100000]"),
    "profiling-steps-1e6": (f"{GROUP}{TASK}profiling: {{steps: 1000000}}\n", "'steps' must be an integer"),
    "batch-sizes-empty-item": (f"{GROUP}task: {{model: cnn-tiny, batch-sizes: '8,,16'}}\n", "'batch-sizes'"),
    "name-newline": ('name: "a\\nb"\n' + GROUP + TASK, "'name' must be a name of one line without '/'"),
    "name-up-and-out": ('name: "../../etc"\n' + GROUP + TASK, "'name' must be a name of one line"),
    "name-nul": ('name: "a\\0b"\n' + GROUP + TASK, "got 'a\\x00b'"),
    # were refused already
    "python-tag": (
        "groups: !!python/object/apply:os.system ['true']\n" + TASK,
        "could not determine a constructor",
    ),
    "count-million": (
        "groups: [{device: sim:jetson-nano, count: 1000000}]\n" + TASK,
        "at most 100000 boards",
    ),
    "key-twice": ("groups: [{device: sim:jetson-nano, device: host}]\n" + TASK, "is given twice"),
    "cap-nan": ("groups: [{device: sim:jetson-nano, power-cap-w: .nan}]\n" + TASK, "'power-cap-w' must be"),
    "cap-trace-devzero": (
        "groups: [{device: sim:jetson-nano, power-cap-w: 'trace:/dev/zero'}]\n" + TASK,
        "not a regular file (a character device)",
    ),
    "rounds-a-date": (f"{GROUP}{TASK}rounds: 2024-01-01\n", "'rounds' must be an integer"),
    "binary": ("\x00\x01\xff", "not valid YAML"),
}


@pytest.mark.parametrize("name", sorted(FLEETS))
def test_a_hostile_fleet_file_is_one_line_and_nothing_runs(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text, fragment = FLEETS[name]
    fleet = tmp_path / f"{name}.yaml"
    fleet.write_text(text, encoding="utf-8", errors="surrogateescape")
    out = tmp_path / "out"
    err = _refused(simulations_main, ["run", str(fleet), "--out", str(out)], capsys, "python -m simulations")
    assert fragment in err
    assert _tree(tmp_path) == [fleet.name]


def test_an_anchor_used_a_few_times_is_still_a_fleet_file(tmp_path: Path) -> None:
    from simulations.fleet import load_fleet_spec

    fleet = tmp_path / "anchors.yaml"
    fleet.write_text(
        "groups:\n  - &nano {device: sim:jetson-nano, power-cap-w: 3.0}\n  - *nano\n  - *nano\n" + TASK,
        encoding="utf-8",
    )
    assert len(load_fleet_spec(fleet).boards) == 3


# --- run config strings (make run / flwr-run) ------------------------------------------------------


@pytest.mark.parametrize(
    ("run_config", "fragment"),
    [
        ("seed=99999999999999999999", "'seed' must be an integer in [0, 4294967295]"),
        ("num-server-rounds=10000000000000", "'num-server-rounds' must be an integer in [1, 100000]"),
        ("batch-sizes='8,,16'", "'batch-sizes' must be distinct integers"),
        ("batch-sizes='8,16,'", "'batch-sizes' must be distinct integers"),
        ("inject-seed=-1", "'inject-seed' must be an integer in [0, 4294967295]"),
        ("profile-warmup=100000", "'profile-warmup' must be an integer in [0, 1000]"),
    ],
)
def test_a_run_config_out_of_range_is_refused_before_flower_starts(
    run_config: str, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "flwr-run",
        "--run-config",
        run_config,
        "--out",
        str(tmp_path / "out"),
        "--log",
        str(tmp_path / "l"),
    ]
    assert fragment in _refused(simulations_main, argv, capsys, "python -m simulations")
    assert _tree(tmp_path) == []


def test_every_integer_run_setting_has_a_ceiling() -> None:
    from powerctl.files.mapping import Integer
    from strategies.settings import SETTINGS

    unbounded = [s.key for s in SETTINGS.values() if isinstance(s.kind, Integer) and s.kind.maximum is None]
    assert unbounded == []


# --- cap sources ---------------------------------------------------------------------------------


@pytest.fixture
def caps(tmp_path: Path) -> Path:
    (tmp_path / "live").write_text("3\n")
    (tmp_path / "trace.csv").write_text("seconds,watts\n0,3\n10,4\n")
    (tmp_path / "watts.csv").write_text("0,3\n10,200000\n")
    (tmp_path / "late.csv").write_text("0,3\n1e300,4\n")
    return tmp_path


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        # were accepted
        ("trace:DIR/trace.csv?scale=1&scale=2", "option scale is given twice ('1', '2'); keep one"),
        ("live:DIR/live?poll=1&poll=2", "option poll is given twice"),
        ("live:DIR/live?poll=1e300", "poll must be a positive number ≤ 1e+09"),
        ("[[0, 3], [1e300, 4]]", "a time must be at most 1e+09 s"),
        ("trace:DIR/watts.csv", "watts.csv:2: a cap must be a number of watts > 0 and ≤ 100000, got 200000"),
        ("trace:DIR/trace.csv?scale=1e6", "got 3 × scale 1e+06"),
        ("trace:DIR/late.csv", "late.csv:2: a time must be at most 1e+09 s"),
        ("", "cap source: empty"),
        ("  ", "cap source: empty"),
        # were refused already
        ("trace:DIR/trace.csv?end=forever", "end must be one of repeat, clip"),
        ("trace:DIR", "Is a directory"),
        ("live:/dev/null", "not a regular file (a character device)"),
        ("[[-1, 3]]", "a time must be a number of seconds ≥ 0"),
        ("[[0, 3], [0, 4]]", "times must increase"),
        ("0x10", "cap source must be a number of watts"),
        ("[" * 5000 + "]" * 5000, "nested too deeply"),
    ],
)
def test_a_hostile_cap_source_is_one_line(
    source: str, fragment: str, caps: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _tree(caps)
    argv = ["cap-source", source.replace("DIR", str(caps))]
    assert fragment.replace("DIR", str(caps)) in _refused(powerctl_main, argv, capsys, "powerctl")
    assert _tree(caps) == before


def test_a_long_schedule_is_described_in_one_short_line(capsys: pytest.CaptureFixture[str]) -> None:
    schedule = json.dumps([[i, 3] for i in range(5000)])
    assert powerctl_main(["cap-source", schedule, "--until", "1"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "… 5000 steps to 4999s" in first and len(first) < 200


# --- profile and relation JSON edited by hand ------------------------------------------------------

PROFILE_ARGS = ["--device", "sim:jetson-nano", "--model", "cnn-tiny", "--batch-sizes", "8,16,32,64"]


@pytest.fixture(scope="module")
def profile_json(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("profile") / "profile.json"
    assert (
        powerctl_main(["profile", *PROFILE_ARGS, "--samples", "4000", "--predicted", "--out", str(out)]) == 0
    )
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def _point(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["points"][0].__setitem__(key, value)


PROFILE_EDITS: dict[str, tuple[Callable[[dict[str, Any]], None] | str, str]] = {
    # were accepted
    "peak-1e308": (_point("peak_power_w", 1e308), "'peak_power_w' must be a number in (0, 100000]"),
    "batch-1e30": (_point("batch_size", 10**30), "'batch_size' must be an integer in [1, 65536]"),
    "samples-twice": ('"samples": 4000, "samples": 5000,', "key 'samples' is given twice in one object"),
    # were refused already
    "peak-nan-string": (_point("peak_power_w", "NaN"), "'peak_power_w' must be a number"),
    "batch-true": (_point("batch_size", True), "'batch_size' must be an integer"),
    "infinity": ('"samples": 4000, "x": Infinity,', "Infinity is not a number this file may hold"),
    "points-object": (lambda d: d.__setitem__("points", {"a": 1}), "'points' must be a list"),
    "deep": ('"samples": 4000, "x": ' + "[" * 100000 + "]" * 100000 + ",", "nested too deeply"),
}


@pytest.mark.parametrize("name", sorted(PROFILE_EDITS))
def test_a_hand_edited_profile_is_one_line(
    name: str, profile_json: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    edit, fragment = PROFILE_EDITS[name]
    path = tmp_path / "profile.json"
    if isinstance(edit, str):
        path.write_text(json.dumps(profile_json).replace('"samples": 4000,', edit, 1))
    else:
        data = copy.deepcopy(profile_json)
        edit(data)
        path.write_text(json.dumps(data))
    argv = ["select", "--profile", str(path), "--relation", str(RELATION), "--power-cap", "3"]
    assert fragment in _refused(powerctl_main, argv, capsys, "powerctl")
    assert _tree(tmp_path) == ["profile.json"]


@pytest.mark.parametrize(
    ("edit", "fragment"),
    [
        (('"target_accuracy": 0.7', '"target_accuracy": 0.7, "target_accuracy": 0.5'), "given twice"),
        (('"model": "cnn-tiny"', '"model": "cnn-tiny", "x": {"model": 1, "model": 2}'), "given twice"),
        (('"batch_sizes": [\n    8,\n    16,', '"batch_sizes": [\n    16,\n    8,'), "strictly increasing"),
        (('"target_accuracy": 0.7', '"target_accuracy": "0.7"'), "'target_accuracy' must be a number"),
    ],
)
def test_a_hand_edited_relation_is_one_line(
    edit: tuple[str, str], fragment: str, profile_json: dict[str, Any], tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    text = RELATION.read_text()
    assert edit[0] in text
    (tmp_path / "relation.json").write_text(text.replace(edit[0], edit[1], 1))
    (tmp_path / "profile.json").write_text(json.dumps(profile_json))
    argv = [
        "select",
        "--profile",
        str(tmp_path / "profile.json"),
        "--relation",
        str(tmp_path / "relation.json"),
    ]
    assert fragment in _refused(powerctl_main, argv, capsys, "powerctl")


def test_an_empty_item_in_batch_sizes_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "profile",
        *PROFILE_ARGS[:4],
        "--batch-sizes",
        "8,,16",
        "--predicted",
        "--out",
        str(tmp_path / "p.json"),
    ]
    line = _refused(powerctl_main, argv, capsys, "powerctl")
    assert "expected distinct integers" in line and "got '8,,16'" in line
    assert _tree(tmp_path) == []


@pytest.mark.parametrize("command", ["pretrain", "relation"])
def test_seq_len_on_an_image_model_is_refused(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = (
        ["--data", "synthetic-image"]
        if command == "pretrain"
        else ["--proxy", "synthetic-image", "--target", "0.5"]
    )
    argv = [
        command,
        "--model",
        "cnn-tiny",
        *data,
        "--seq-len",
        "32",
        "--out",
        str(tmp_path / "w.safetensors"),
    ]
    assert "--seq-len is for text models" in _refused(fl_server_main, argv, capsys, "fl-server")
    assert _tree(tmp_path) == []


# --- $POWERFED_CACHE -------------------------------------------------------------------------------


def _cache_values(tmp_path: Path) -> dict[str, tuple[str, str]]:
    (tmp_path / "file").write_text("x")
    os.symlink(tmp_path / "loop", tmp_path / "loop")
    return {
        "a file": (str(tmp_path / "file"), "exists and is not a folder"),
        "/dev/null": ("/dev/null", "exists and is not a folder"),
        "relative": ("rel/cache", "a relative path"),
        "a link loop": (str(tmp_path / "loop"), "cannot be used (Too many levels of symbolic links)"),
    }


@pytest.mark.parametrize("which", ["a file", "/dev/null", "relative", "a link loop"])
def test_a_cache_that_cannot_be_a_folder_is_refused_before_the_work(
    which: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    value, fragment = _cache_values(tmp_path)[which]
    monkeypatch.setenv("POWERFED_CACHE", value)
    before = _tree(tmp_path)
    out = tmp_path / "r.json"
    argv = [
        "relation",
        "--model",
        "cnn-tiny",
        "--proxy",
        "synthetic-image",
        "--target",
        "0.5",
        "--out",
        str(out),
    ]
    assert f"POWERFED_CACHE={value}: {fragment}" in _refused(fl_server_main, argv, capsys, "fl-server")
    fleet = Path(__file__).resolve().parent.parent / "simulations" / "fleets" / "quick.yaml"
    argv = ["run", str(fleet), "--out", str(tmp_path / "fleet-out")]
    assert fragment in _refused(simulations_main, argv, capsys, "python -m simulations")
    assert _tree(tmp_path) == before
