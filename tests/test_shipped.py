"""What `make run` meets first (issue 57). The default run's starting point ships with the package
(fl_server/shipped.py): the default run config starts from the shipped weights and relation vector,
nothing trained; a shipped file whose bytes do not match its manifest is one warning line and the run
trains instead; the shipped files are what the documented command makes (slow: it pre-trains and
estimates). The preparation and the rounds say where they are; two clients train at once on 2 cores."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

import fl_server.app as server_app
import fl_server.pretrain as pretrain_module
import fl_server.shipped as shipped
from fl_server.progress import Heartbeat, ProgressGrid, SampleProgress
from fl_server.relation import NotCached
from fl_server.run_config import parse_server_config
from fl_server.weights import weights_hash
from powerctl.records.relation import RelationVector


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("POWERFED_CACHE", str(cache))
    return cache


def _no_training(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []

    def record(*args: Any, **kwargs: Any) -> None:
        calls.append(args)
        raise AssertionError("pre-trained although the weights ship")

    monkeypatch.setattr(pretrain_module, "pretrain", record)
    return calls


def _manifest() -> dict[str, Any]:
    return json.loads((shipped.SHIPPED_DIR / shipped.MANIFEST).read_text())


def test_the_default_run_starts_from_the_shipped_weights_and_vector(
    empty_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_training(monkeypatch)
    cfg = parse_server_config({})
    said: list[str] = []
    weights = server_app.pretrained_weights(cfg, say=said.append)
    entries = {e["kind"]: e for e in _manifest()["files"]}
    assert weights.parent == empty_cache / "weights" and server_app.is_shipped(weights)
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == entries["weights"]["sha256"]
    assert said and said[0].startswith("shipped weights of resnet18-small")
    relation = server_app.relation_vector(cfg, weights, compute=False, say=said.append)
    assert (
        relation.to_dict() == RelationVector.load(shipped.SHIPPED_DIR / entries["relation"]["file"]).to_dict()
    )
    assert said[-1].startswith("shipped relation vector of resnet18-small")
    # the whole preparation in this process: no spawned pre-training, no relation runs
    ready = server_app.cached_preparation(cfg)
    assert ready is not None and ready[0] == weights
    # another recipe is not the shipped one: the cache's entry, keyed by the CPU and threads as before
    other = parse_server_config({"pretrain-samples": 1000})
    assert not server_app.is_shipped(server_app.weights_path(other))
    with pytest.raises(NotCached):
        server_app.relation_vector(parse_server_config({"relation-seeds": "0,1"}), weights, compute=False)


def _copy_shipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "shipped"
    shutil.copytree(shipped.SHIPPED_DIR, folder)
    monkeypatch.setattr(shipped, "SHIPPED_DIR", folder)
    return folder


def test_a_changed_shipped_file_is_one_warning_and_the_run_trains_instead(
    empty_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    folder = _copy_shipped(tmp_path, monkeypatch)
    entries = {e["kind"]: e for e in _manifest()["files"]}
    packed_path = folder / entries["weights"]["file"]
    packed = json.loads(packed_path.read_text())
    data = bytearray(base64.b64decode(packed["safetensors_base64"]))
    data[-1] ^= 1  # one bit of one weight
    packed["safetensors_base64"] = base64.b64encode(bytes(data)).decode()
    packed_path.write_text(json.dumps(packed))
    relation_path = folder / entries["relation"]["file"]
    relation_path.write_text(relation_path.read_text().replace("resnet18-small", "resnet18-small "))

    trained: list[Path] = []

    def pretrain(model: str, data: str, *, out: Path, **kwargs: Any) -> None:
        trained.append(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.touch()

    monkeypatch.setattr(pretrain_module, "pretrain", pretrain)
    cfg = parse_server_config({})
    with caplog.at_level(logging.WARNING, logger="fl_server.shipped"):
        weights = server_app.pretrained_weights(cfg)
    assert trained == [weights] and not server_app.is_shipped(weights)  # trained, into the cache's entry
    lines = [r.getMessage() for r in caplog.records]
    assert (
        len(lines) == 1
        and "shipped weights" in lines[0]
        and "do not match the manifest's SHA-256" in lines[0]
    )
    assert "\n" not in lines[0] and shipped.WRITE_COMMAND in lines[0]

    caplog.clear()
    good = shipped.unpacked_weights(server_app.pretrain_recipe(cfg), tmp_path / "w", shipped_dir())
    assert good is not None  # the package's own weights: their vector's recipe names them
    with caplog.at_level(logging.WARNING, logger="fl_server.shipped"), pytest.raises(NotCached):
        server_app.relation_vector(cfg, good, compute=False)  # not the shipped vector: estimated instead
    assert len(caplog.records) == 1 and "shipped relation" in caplog.records[0].getMessage()


def shipped_dir() -> Path:
    """The package's own shipped folder (the test above points the module at a damaged copy)."""
    return Path(server_app.__file__).resolve().parent / "shipped"


def test_the_command_without_write_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert shipped.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "python -m fl_server.shipped: error: nothing to do: give --write"


@pytest.mark.slow
def test_the_shipped_files_are_what_the_documented_command_makes(empty_cache: Path, tmp_path: Path) -> None:
    """On the CPU that made them, with its thread count (the manifest's `made_on`; the test run's own
    count is set for the test): elsewhere the floats differ in the last digits, which is why they ship."""
    import torch

    from powerfed.training.numerics import numerics_key

    manifest = _manifest()
    threads = int(manifest["made_on"]["threads"])
    if manifest["made_on"] != shipped.normal(numerics_key(threads)):
        pytest.skip(f"the shipped files were made on {manifest['made_on']}: another CPU or torch")
    made_dir = tmp_path / "made"
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        made = shipped.write_shipped(made_dir, tell=lambda line: None)
    finally:
        torch.set_num_threads(before)
    # the same recipes; the same tensors (a safetensors file's metadata order is not fixed: not its
    # bytes); the same vector (its runs' wall seconds aside)
    assert [e["recipe"] for e in made["files"]] == [e["recipe"] for e in manifest["files"]]
    recipe = made["files"][0]["recipe"]
    ours = shipped.unpacked_weights(recipe, tmp_path / "ours", made_dir)
    theirs = shipped.unpacked_weights(recipe, tmp_path / "theirs")
    assert ours is not None and theirs is not None and weights_hash(ours) == weights_hash(theirs)
    a, b = (
        RelationVector.load(folder / made["files"][1]["file"]) for folder in (made_dir, shipped.SHIPPED_DIR)
    )
    assert a.as_map() == b.as_map() and a.per_seed_samples() == b.per_seed_samples()


# --- progress lines ----------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pretraining_says_samples_elapsed_and_left_every_few_seconds() -> None:
    clock, lines = Clock(), []
    progress = SampleProgress(lines.append, "pre-training", 2000, every_s=5.0, clock=clock)
    clock.now += 2.0
    progress(10, 640)  # too soon
    clock.now += 4.0
    progress(20, 1280)
    clock.now += 5.0
    progress(31, 2000)  # the end: the caller says how long it took
    assert lines == ["pre-training: 1280 of 2000 samples, 6 s so far, about 3 s left"]


def test_a_tiny_preparation_says_each_phase(empty_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cnn-tiny's pre-training and relation runs, as the ServerApp's spawned preparation reports them."""
    monkeypatch.setattr(
        server_app, "SampleProgress", lambda say, what, total: SampleProgress(say, what, total, every_s=0.0)
    )
    cfg = parse_server_config(
        {"model": "cnn-tiny", "pretrain-samples": 256, "relation-seeds": "0", "batch-sizes": "8,16",
         "target-accuracy": 0.2, "server-device": "cpu"}
    )  # fmt: skip

    class Lines(list[str]):
        def put(self, line: str) -> None:
            self.append(line)

    lines = Lines()
    server_app.prepare(cfg, lines)
    assert lines[0] == "pre-training cnn-tiny on synthetic-image: 256 samples ..."
    assert any(line.startswith("pre-training: ") and "s left" in line for line in lines[1:-3])
    assert any(line.startswith("pre-trained in ") for line in lines)
    runs = [line for line in lines if line.startswith("relation vector: run ")]
    assert len(runs) == 2 and runs[-1].startswith("relation vector: run 2 of 2") and "s left" in runs[-1]


def test_a_quiet_phase_says_it_is_still_going_and_a_round_says_where_it_is() -> None:
    clock, lines = Clock(), []
    beat = Heartbeat(lines.append, "preparing", quiet_s=8.0, clock=clock)
    clock.now += 7.0
    beat.tick()
    beat.heard("  relation vector: run 1 of 12")
    clock.now += 7.0
    beat.tick()  # 7 s since the last line: quiet
    clock.now += 2.0
    beat.tick()
    assert lines == ["  relation vector: run 1 of 12", "  ... still preparing: 16 s in all"]

    class Silent:
        """A grid whose one client never answers within the wait."""

        def push_messages(self, messages: list[Any]) -> list[str]:
            return ["m1"]

        def pull_messages(self, ids: Any) -> list[Any]:
            return []

    from flwr.app import ConfigRecord, Message, MessageType, RecordDict

    from tests.fake_grid import set_task_identity

    set_task_identity()

    said: list[str] = []
    grid = ProgressGrid(Silent(), said.append, every_s=5.0, poll_s=0.01, quiet_s=0.05)
    grid.label = "ours"
    message = Message(
        RecordDict({"config": ConfigRecord({"server-round": 1})}),
        dst_node_id=1,
        message_type=MessageType.TRAIN,
    )
    grid.send_and_receive([message], timeout=0.3)
    assert len(said) >= 3 and all(
        line.startswith("  [ours] round 1 train: 0/1 clients done") for line in said
    )


# --- make run's clients ------------------------------------------------------------------------------
def test_make_run_gives_each_client_one_cpu_so_two_train_at_once_on_two_cores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make run`'s simulation: one Ray CPU per client actor, as the fleet runner's (Flower's default,
    two, ran one client at a time on 2 cores)."""
    import simulations.launcher as launcher
    import simulations.runner as runner

    seen: list[str] = []

    def run_flwr(federation: str, *args: Any, **kwargs: Any) -> launcher.FlowerRun:
        seen.append(federation)
        return launcher.FlowerRun(results_line=f"results: {tmp_path / 'results.json'}")

    monkeypatch.setattr(launcher, "run_flwr", run_flwr)
    plan = launcher.Launch(nodes=4, overrides={}, log_path=tmp_path / "flwr.log", port=None)
    assert launcher.launch(plan, echo=lambda line: None) == tmp_path / "results.json"
    assert seen == ["num-supernodes=4 client-resources-num-cpus=1"]
    assert runner.run_flower.__globals__["federation"] is launcher.federation  # one place


def test_make_run_says_it_draws_the_summary_figure_before_drawing_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The figure (matplotlib's import and drawing) takes seconds after Flower has stopped: a line first."""
    import simulations.__main__ as simulations_cli
    import simulations.launcher as launcher
    import simulations.summary_figure as summary_figure

    out = tmp_path / "flwr"
    ended = launcher.FlowerRun(results_line=f"results: {out / 'results.json'}")
    monkeypatch.setattr(launcher, "run_flwr", lambda *a, **k: ended)
    before: list[str] = []

    def draw(path: Path) -> Path:
        before.extend(capsys.readouterr().out.strip().splitlines())
        return out / "summary.png"

    monkeypatch.setattr(summary_figure, "run_figure", draw)
    assert simulations_cli.main(["flwr-run", "--out", str(out), "--log", str(tmp_path / "flwr.log")]) == 0
    assert before[-1] == "drawing the summary figure ..."
    assert capsys.readouterr().out.strip().splitlines()[-2:] == [
        f"summary figure: {out / 'summary.png'}",
        f"results: {out / 'results.json'}",
    ]
