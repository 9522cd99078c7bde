"""The ServerApp: run config checks, results written per round, the whole server side on a fake grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from flwr.app import Context, RecordDict

from fl_client.app import app as client_app
from fl_server import app as server_app
from fl_server.results import CLIENT_COLUMNS, RESULTS_SCHEMA
from fl_server.run_config import RunConfigError, ServerConfig, parse_server_config
from powerctl.errors import FileFormatError
from powerctl.records.relation import RelationVector
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
    assert cfg.relation_seeds == [0, 1, 2] and cfg == ServerConfig(**{**cfg.__dict__})
    fleet = app["config"]["fleet"]
    assert "@none" in fleet and fleet.count("sim:jetson-nano") >= 1 and "sim:jetson-tx2nx" in fleet


@pytest.mark.parametrize(
    ("run_config", "fragment"),
    [
        ({"model": "resnet99"}, "'model' must be one of"),
        ({"target-accuracy": 1.5}, "'target-accuracy' must be a number in (0, 1], got 1.5"),
        ({"target-accuracy": 0.0}, "'target-accuracy' must be a number in (0, 1], got 0.0"),
        ({"target-accuracy": "high"}, "'target-accuracy' must be a number in (0, 1], got 'high'"),
        ({"num-server-rounds": 0}, "'num-server-rounds' must be an integer in [1, 100000], got 0"),
        ({"relation-seeds": "0,x"}, "'relation-seeds' must be distinct integers ≥ 0"),
        ({"batch-sizes": "8,8"}, "'batch-sizes' must be distinct"),
        ({"results-dir": "runs/out"}, "'results-dir' must be an absolute folder"),
        ({"lr-rule": "cubic"}, "'lr-rule' must be one of"),
        ({"targte-accuracy": 0.5}, "unknown key 'targte-accuracy'; did you mean 'target-accuracy'?"),
        ({"num-server-roundz": 3}, "unknown key 'num-server-roundz'; did you mean 'num-server-rounds'?"),
        ({"cap-poll-s": 0.0}, "'cap-poll-s' must be a number of seconds in [0.01, 3600], got 0.0"),
        ({"cap-pause-timeout-s": -1.0}, "'cap-pause-timeout-s' must be a number of seconds > 0, got -1.0"),
        # the keys only the clients read are checked by the server too, before round 1 (issue 18)
        ({"fleet": "sim:jetson-nano@abc"}, "'fleet' entry 'sim:jetson-nano@abc': its cap must be a number"),
        ({"fleet": "sim:jetson-nano@0.5"}, "a cap of 0.5 W is below anything sim:jetson-nano can run"),
        ({"fleet": "/no/such/fleet.yaml"}, "'fleet' names no such fleet file: /no/such/fleet.yaml"),
        ({"fleet": ""}, "'fleet' must be a non-empty string"),
        ({"inject-failures": "boom:0.5"}, "'inject-failures' holds 'boom:0.5', which is not KIND:P"),
        ({"inject-hang-s": 0.0}, "'inject-hang-s' must be a number of seconds in (0, 3600)"),
        ({"client-data": "cifar11:/data"}, "'client-data' must be a dataset spec"),
        ({"partitioning": "skewed"}, "'partitioning' must be one of iid, dirichlet, got 'skewed'"),
        ({"dirichlet-alpha": 0}, "'dirichlet-alpha' must be a number > 0, got 0"),
        ({"profile-cache": "cache"}, "'profile-cache' must be an absolute folder"),
        ({"client-data-seed": -1}, "'client-data-seed' must be an integer in [0, 4294967295], got -1"),
        ({"weights": "/no/such.safetensors"}, "'weights' names no such file: /no/such.safetensors"),
        ({"rejoin-wait-s": -1}, "'rejoin-wait-s' must be a number of seconds ≥ 0, got -1"),
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
def test_the_server_side_runs_rounds_writes_results_after_each_and_a_seeded_run_repeats_its_numbers(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Two runs of the same seeded config, each from an empty cache (pre-training, the relation vector
    and the profiles redone): the first is checked round by round, the second must repeat its numbers."""
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
            assert set(CLIENT_COLUMNS[:11]) <= set(client)  # those every report has
        assert rnd["summary"]["share_at_target"] <= 2 / 3 and "evaluation" in rnd
    assert data["rounds"][1]["clients"][0]["profiling_s"] == 0.0  # profile cached after round 1
    assert {n["key"] for n in data["nodes"]} == {"partition-0", "partition-1", "partition-2"}
    assert RelationVector.from_dict(data["run"]["relation"]).batch_sizes == (8, 16)
    assert (tmp_path / "results" / "global.safetensors").is_file()
    assert "[round 1] clients" in out and "FAILED (error)" in out and "makespan" in out

    monkeypatch.setenv("POWERFED_CACHE", str(tmp_path / "second-cache"))  # empty: everything redone
    again, _ = _server(tmp_path / "second", _run_config(tmp_path / "second"), behaviour={102: "raise"})
    first, second = _numbers(path), _numbers(again)
    assert first == second
    assert first[0]["clients"] and first[0]["summary"]["makespan_s"] > 0


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"fleet": "sim:jetson-nano@abc"}, "'fleet' entry 'sim:jetson-nano@abc'"),
        ({"fleet": "sim:jetson-nano@3.0, sim:jetson-tx2nx@0.5"}, "a cap of 0.5 W is below anything"),
        ({"inject-failures": "raise:2"}, "'inject-failures' holds 'raise:2'"),
        ({"partitioning": "skewed"}, "'partitioning' must be one of iid, dirichlet"),
    ],
)
def test_a_bad_key_the_clients_read_stops_the_server_before_any_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: dict, fragment: str
) -> None:
    def refuse(*_: object) -> None:
        raise AssertionError("prepared weights before the run config was checked")

    monkeypatch.setattr(server_app, "prepare_apart", refuse)
    results = tmp_path / "results"
    results.mkdir()
    (results / "results.json").write_text("{}")  # an earlier run's: left where it is
    with pytest.raises(RunConfigError) as err:
        _server(tmp_path, _run_config(tmp_path, **extra))
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert [p.name for p in results.iterdir()] == ["results.json"]


def test_bad_weights_or_relation_files_stop_the_server_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "relation.json"
    bad.write_text('{"schema": "powerctl.relation/2", "model": "cnn-tiny"}')
    with pytest.raises(FileFormatError, match="missing key"):
        _server(tmp_path, _run_config(tmp_path, relation=str(bad)))
    other = tmp_path / "other.json"
    RelationVector.from_samples("resnet18", "proxy", 0.5, {8: 10.0, 16: 20.0}).save(other)
    weights = tmp_path / "nope.safetensors"
    with pytest.raises(RunConfigError, match="no such file"):
        _server(tmp_path, _run_config(tmp_path, weights=str(weights)))
    cfg = _run_config(tmp_path, relation=str(other), weights="")
    cfg["pretrain-samples"] = 64
    capsys.readouterr()
    with pytest.raises(Exception, match="the vector is for model 'resnet18'"):
        _server(tmp_path, cfg)
    assert "pre-train" not in capsys.readouterr().out  # refused before any work


def _numbers(path: Path) -> list:
    """Everything a run measured, less host wall times (which no seed can fix)."""
    rounds = json.loads(path.read_text())["rounds"]
    for rnd in rounds:
        for client in rnd["clients"]:
            client.pop("wall_s")
    return rounds


# --- a restarted ServerApp resumes ------------------------------------------------------------


@pytest.fixture
def prepared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Skip pre-training and the relation estimate: fixed starting weights and relation vector."""
    from fl_server.weights import save_weights
    from powerfed.training.models import build_model

    weights = tmp_path / "start.safetensors"
    save_weights(weights, build_model("cnn-tiny", 10, seed=0), model_name="cnn-tiny", num_classes=10)
    relation = RelationVector.from_samples("cnn-tiny", "proxy", 0.3, {8: 300.0, 16: 400.0})
    monkeypatch.setattr(server_app, "prepare_apart", lambda cfg: (weights, relation))
    return weights


def test_the_run_configs_rejoin_wait_reaches_the_strategy(
    tmp_path: Path, prepared: Path, monkeypatch
) -> None:
    """`rejoin-wait-s`: how long a round waits for a node gone since the last (a deployment's SuperNode
    restarting); the strategy's own wait is tests/test_fl_strategy.py's."""
    built: dict = {}
    real = server_app.PowerAwareFedAvg

    def spy(**kwargs):
        built.update(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(server_app, "PowerAwareFedAvg", spy)
    _server(tmp_path, _run_config(tmp_path, **{"num-server-rounds": 1, "rejoin-wait-s": 4.5}), nodes=2)
    assert built["waits"].rejoin_wait_s == 4.5


def _state(path: Path) -> dict:
    from fl_server.weights import load_weights

    return load_weights(path)[0]


class ServerKilled(Exception):
    pass


def _kill_in_round(n: int):
    def on_call(nid: int, msg) -> None:
        cfg = msg.content.config_records.get("config")
        if msg.metadata.message_type == "train" and cfg["server-round"] == n:
            raise ServerKilled(f"round {n}")

    return on_call


def _trained_rounds(grid: FakeGrid) -> list[int]:
    return sorted(
        {
            m.content.config_records["config"]["server-round"]
            for m in grid.sent
            if m.metadata.message_type == "train"
        }
    )


def test_a_restarted_server_continues_after_its_last_round_to_the_same_model(
    tmp_path: Path, prepared: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = _run_config(tmp_path / "whole")
    _server(tmp_path / "whole", whole, nodes=2)
    ref = json.loads((tmp_path / "whole/results/results.json").read_text())
    monkeypatch.setenv("POWERFED_CACHE", str(tmp_path / "cache2"))  # profiles measured in round 1 again
    rc = _run_config(tmp_path / "cut")
    node_cfgs = {100 + i: {"partition-id": i, "num-partitions": 2} for i in range(2)}
    context = Context(run_id=42, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(ServerKilled):
        server_app.run(FakeGrid(client_app, node_cfgs, rc, on_call=_kill_in_round(2)), context)
    results = tmp_path / "cut" / "results" / "results.json"
    assert [r["round"] for r in json.loads(results.read_text())["rounds"]] == [1]
    capsys.readouterr()

    path, grid = _server(tmp_path / "cut", rc, nodes=2)  # the restart: a new grid, new node ids
    assert "resume: rounds 1-1 of this run are complete" in capsys.readouterr().out
    assert _trained_rounds(grid) == [2]
    data, ref = (
        json.loads(path.read_text()),
        json.loads((tmp_path / "whole/results/results.json").read_text()),
    )
    assert [r["round"] for r in data["rounds"]] == [1, 2]
    assert _numbers(path) == _numbers(tmp_path / "whole/results/results.json")
    assert data["run"]["fingerprint"] == ref["run"]["fingerprint"]
    got, want = (
        _state(path.parent / "global.safetensors"),
        _state(tmp_path / "whole/results/global.safetensors"),
    )
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in got)


def test_every_client_failing_is_a_failed_run_that_leaves_earlier_results_alone(
    tmp_path: Path, prepared: Path, capsys
) -> None:
    from fl_server.weights import load_weights

    rc = _run_config(tmp_path)
    with pytest.raises(server_app.NoClientReported, match="every client failed in every round"):
        _server(tmp_path, rc, nodes=2, behaviour={100: "raise", 101: "dead"})
    out = capsys.readouterr().out
    path = tmp_path / "results" / "results.json"
    data = json.loads(path.read_text())  # a fresh folder: the failures are recorded
    assert [len(r["failed"]) for r in data["rounds"]] == [2, 2]
    assert out.count("no client reported: the global model stays as it was") == 2
    assert "no client reported in any round (recorded in" in out and "FAILED (unavailable)" in out
    final, start = _state(path.parent / "global.safetensors"), load_weights(prepared)[0]
    assert all(torch.equal(final[k], start[k]) for k in start)

    # a new run (another target) over those files, failing too: nothing of it replaces them
    before = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    with pytest.raises(server_app.NoClientReported):
        _server(tmp_path, {**rc, "target-accuracy": 0.4}, nodes=2, behaviour={100: "raise", 101: "raise"})
    assert "(nothing written: the earlier results stay)" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == before


def test_a_new_run_stopped_before_its_first_report_leaves_the_earlier_results_in_place(
    tmp_path: Path, prepared: Path, capsys
) -> None:
    rc = _run_config(tmp_path)
    path, _ = _server(tmp_path, rc, nodes=2, behaviour={101: "raise"})
    before = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    other = {**rc, "target-accuracy": 0.4}  # another run: it will not continue these files
    node_cfgs = {100 + i: {"partition-id": i, "num-partitions": 2} for i in range(2)}
    context = Context(run_id=43, node_id=0, node_config={}, state=RecordDict(), run_config=other)
    with pytest.raises(ServerKilled):  # stopped in round 1, as Ctrl-C on `make run` stops it
        server_app.run(FakeGrid(client_app, node_cfgs, other, on_call=_kill_in_round(1)), context)
    assert "is of another run" in capsys.readouterr().out
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == before


def test_resume_continues_extends_or_sets_aside_never_mixes(tmp_path: Path, prepared: Path, capsys) -> None:
    failing = {101: "raise"}  # one client trains (a run where every client fails is a failed run)
    rc = _run_config(tmp_path)
    out_dir = tmp_path / "results"
    path, _ = _server(tmp_path, rc, nodes=2, behaviour=failing)
    first = json.loads(path.read_text())
    capsys.readouterr()

    _, grid = _server(tmp_path, rc, nodes=2, behaviour=failing)  # a finished run again: a new run
    assert "an earlier run with these settings is complete" in capsys.readouterr().out
    assert _trained_rounds(grid) == [1, 2]
    (done,) = out_dir.glob("previous-*-results.json")
    assert json.loads(done.read_text())["rounds"] == first["rounds"]  # kept whole, not overwritten
    assert len(json.loads(path.read_text())["rounds"]) == 2

    _, grid = _server(tmp_path, {**rc, "num-server-rounds": 3}, nodes=2, behaviour=failing)
    assert _trained_rounds(grid) == [3] and len(json.loads(path.read_text())["rounds"]) == 3

    _, grid = _server(tmp_path, {**rc, "target-accuracy": 0.4}, nodes=2, behaviour=failing)
    out = capsys.readouterr().out
    assert "is of another run" in out and "starting from round 1" in out and _trained_rounds(grid) == [1, 2]
    asides = [json.loads(p.read_text()) for p in out_dir.glob("previous-*-results.json")]
    assert sorted(len(a["rounds"]) for a in asides) == [2, 3]  # both earlier runs, kept whole
    assert len(list(out_dir.glob("previous-*-global.safetensors"))) == 2


@pytest.mark.parametrize(
    ("spoil", "fragment"),
    [
        (lambda d: (d / "results.json").write_text('{"schema": "fl_server.res'), "not valid JSON"),
        (lambda d: (d / "global.safetensors").write_bytes(b"\0" * 64), "not a readable safetensors"),
        (lambda d: (d / "global.safetensors").unlink(), "global.safetensors is missing"),
    ],
)
def test_a_corrupt_or_partial_state_is_one_line_set_aside_and_a_fresh_start(
    tmp_path: Path, prepared: Path, capsys, spoil, fragment: str
) -> None:
    failing = {101: "raise"}
    rc = _run_config(tmp_path)
    _server(tmp_path, rc, nodes=2, behaviour=failing)
    spoil(tmp_path / "results")
    capsys.readouterr()
    path, grid = _server(tmp_path, rc, nodes=2, behaviour=failing)
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.startswith("resume:")]
    assert len(lines) == 1 and fragment in lines[0] and "starting from round 1" in lines[0], lines
    assert out.count("moved the earlier results to") == 1
    assert _trained_rounds(grid) == [1, 2] and len(json.loads(path.read_text())["rounds"]) == 2
    assert list((tmp_path / "results").glob("previous-*-results.json"))


def test_resume_false_starts_over_and_keeps_the_old_results(tmp_path: Path, prepared: Path, capsys) -> None:
    failing = {101: "raise"}
    _server(tmp_path, _run_config(tmp_path), nodes=2, behaviour=failing)
    capsys.readouterr()
    _, grid = _server(tmp_path, _run_config(tmp_path, resume=False), nodes=2, behaviour=failing)
    out = capsys.readouterr().out
    assert "resume = false: the earlier results in" in out and "moved the earlier results to" in out
    assert _trained_rounds(grid) == [1, 2] and list((tmp_path / "results").glob("previous-*-results.json"))
