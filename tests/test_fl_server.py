"""The ServerApp: run config checks, results written per round, the whole server side on a fake grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from fl_client.app import app as client_app
from fl_server import app as server_app
from fl_server.results import CLIENT_FIELDS, RESULTS_SCHEMA
from fl_server.run_config import RunConfigError, ServerConfig, parse_server_config
from powerctl.errors import FileFormatError
from powerctl.relation import RelationVector
from tests.fake_grid import FakeGrid
from tests.fl_helpers import FLEET

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_shipped_run_config_parses_and_has_no_federations_table() -> None:
    import tomllib

    doc = tomllib.loads(PYPROJECT.read_text())
    app = doc["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "fl_server.app:app", "clientapp": "fl_client.app:app"}
    assert "federations" not in doc["tool"]["flwr"]  # Flower 1.41 would migrate it and edit this file
    cfg = parse_server_config(app["config"])
    assert cfg.seeds() == [0, 1, 2] and cfg == ServerConfig(**{**cfg.__dict__})
    fleet = app["config"]["fleet"]
    assert "@none" in fleet and fleet.count("sim:jetson-nano") >= 1 and "sim:jetson-tx2nx" in fleet


@pytest.mark.parametrize(
    ("run_config", "fragment"),
    [
        ({"model": "resnet99"}, "'model' must be one of"),
        ({"target-accuracy": 1.5}, "'target-accuracy' must be in (0, 1], got 1.5"),
        ({"target-accuracy": 0.0}, "'target-accuracy' must be in (0, 1], got 0.0"),
        ({"target-accuracy": "high"}, "'target-accuracy' must be a finite number, got 'high'"),
        ({"num-server-rounds": 0}, "'num-server-rounds' must be ≥ 1"),
        ({"relation-seeds": "0,x"}, "'relation-seeds' must be integers"),
        ({"batch-sizes": "8,8"}, "'batch-sizes' must be distinct"),
        ({"results-dir": "runs/out"}, "'results-dir' must be an absolute path"),
        ({"lr-rule": "cubic"}, "'lr-rule' must be one of"),
        ({"targte-accuracy": 0.5}, "unknown key 'targte-accuracy'"),
    ],
)
def test_bad_run_config_is_one_line_naming_key_and_value(run_config: dict, fragment: str) -> None:
    with pytest.raises(RunConfigError) as err:
        parse_server_config(run_config)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def _run_config(tmp_path: Path, **extra: object) -> dict:
    return {
        "model": "cnn-tiny",
        "num-server-rounds": 2,
        "pretrain-samples": 256,
        "relation-seeds": "0",
        "batch-sizes": "8,16",
        "target-accuracy": 0.3,
        "relation-max-samples": 2048,
        "budget-samples": 96,
        "eval-every-samples": 32,
        "eval-max-samples": 64,
        "profile-samples": 512,
        "profile-warmup": 0,
        "profile-steps": 1,
        "results-dir": str(tmp_path / "results"),
        "fleet": FLEET,
        "client-data": "synthetic-image",
        "client-data-seed": 2,
        **extra,
    }


def _server(
    tmp_path: Path, run_config: dict, nodes: int = 3, behaviour: dict | None = None
) -> tuple[Path, FakeGrid]:
    node_cfgs = {100 + i: {"partition-id": i, "num-partitions": nodes} for i in range(nodes)}
    grid = FakeGrid(client_app, node_cfgs, run_config, behaviour)
    context = Context(run_id=42, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    return server_app.run(grid, context), grid


@pytest.mark.slow
def test_the_server_side_runs_rounds_and_writes_results_after_each(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    written: list[int] = []
    from fl_server import results as results_mod

    real = results_mod.ResultsWriter.record_round

    def spy(self, record, nodes=None):  # the file on disk already holds every earlier round
        on_disk = json.loads(self.path.read_text())
        written.append(len(on_disk["rounds"]))
        real(self, record, nodes)

    monkeypatch.setattr(results_mod.ResultsWriter, "record_round", spy)
    rc = _run_config(tmp_path)
    path, _ = _server(tmp_path, rc, behaviour={102: "raise"})
    out = capsys.readouterr().out
    data = json.loads(path.read_text())
    assert data["schema"] == RESULTS_SCHEMA and path == tmp_path / "results" / "results.json"
    assert [r["round"] for r in data["rounds"]] == [1, 2]
    assert written == [0, 1, 1, 2]  # round 1 train, round 1 eval, round 2 train, round 2 eval
    for rnd in data["rounds"]:
        assert len(rnd["clients"]) == 2 and [f["node_key"] for f in rnd["failed"]] == ["partition-2"]
        for client in rnd["clients"]:
            assert set(CLIENT_FIELDS) <= set(client)
        assert rnd["summary"]["share_at_target"] <= 2 / 3 and "evaluation" in rnd
    assert data["rounds"][1]["clients"][0]["profiling_seconds"] == 0.0  # profile cached after round 1
    assert {n["key"] for n in data["nodes"]} == {"partition-0", "partition-1", "partition-2"}
    assert RelationVector.from_dict(data["run"]["relation"]).batch_sizes == [8, 16]
    assert (tmp_path / "results" / "global.safetensors").is_file()
    assert "[round 1] clients" in out and "FAILED (error)" in out and "makespan" in out


def test_bad_weights_or_relation_files_stop_the_server_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "relation.json"
    bad.write_text('{"schema": "powerctl.relation/1", "model": "cnn-tiny"}')
    with pytest.raises(FileFormatError, match="missing field"):
        _server(tmp_path, _run_config(tmp_path, relation=str(bad)))
    other = tmp_path / "other.json"
    RelationVector.from_samples("resnet18", "proxy", 0.5, {8: 10.0, 16: 20.0}).save(other)
    weights = tmp_path / "nope.safetensors"
    with pytest.raises(RunConfigError, match="no such file"):
        _server(tmp_path, _run_config(tmp_path, weights=str(weights)))
    cfg = _run_config(tmp_path, relation=str(other), weights="")
    cfg["pretrain-samples"] = 64
    with pytest.raises(Exception, match="the vector is for model 'resnet18'"):
        _server(tmp_path, cfg)


def _numbers(path: Path) -> list:
    """Everything a run measured, less host wall times (which no seed can fix)."""
    rounds = json.loads(path.read_text())["rounds"]
    for rnd in rounds:
        for client in rnd["clients"]:
            client.pop("wall_seconds")
    return rounds


@pytest.mark.slow
def test_a_seeded_run_repeats_its_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = []
    for i in range(2):  # fresh caches each time: pre-training, relation and profiles are redone
        monkeypatch.setenv("POWERFED_CACHE", str(tmp_path / f"cache{i}"))
        rc = _run_config(tmp_path / f"run{i}", **{"num-server-rounds": 1})
        paths.append(_server(tmp_path / f"run{i}", rc)[0])
    first, second = _numbers(paths[0]), _numbers(paths[1])
    assert first == second
    assert first[0]["clients"] and first[0]["summary"]["makespan_s"] > 0
