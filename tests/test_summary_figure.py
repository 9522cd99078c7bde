"""The summary figure beside results.json: `make run`'s and `make fleet`'s, drawn from a real small run.

One module fixture runs a small fleet (three boards, ours and the state of practice) through the real
ServerApp and ClientApp on the in-process grid (tests/fake_grid.py), with fixed starting weights and a
fixed relation vector: its `ours/results.json` is what `make run` writes, and the fleet's results are
built from the two methods' files as `make fleet` builds them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from matplotlib.image import imread

import simulations.__main__ as simulations_cli
from fl_client.app import app as client_app
from fl_server import app as server_app
from powerctl.records.relation import RelationVector
from simulations import launcher
from simulations.fleet import load_fleet_spec
from simulations.fleet_results import build_results
from simulations.summary_figure import SUMMARY_FIGURE, draw_or_say, fleet_figure, run_figure
from tests.fake_grid import FakeGrid

FLEET = """\
name: figure
groups:
  - {device: sim:jetson-nano, power-cap-w: 3.0}
  - {device: sim:jetson-nano, power-cap-w: none}
  - {device: sim:jetson-tx2nx, power-cap-w: 3.5}
task: {model: cnn-tiny, target-accuracy: 0.3, batch-sizes: [8, 16], pretrain-samples: 256}
rounds: 1
budget: {samples: 96}
evaluation: {every-samples: 32, max-samples: 64}
methods: [ours, state-of-practice]
"""


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The real run's folders: `flwr` (METHOD/results.json) and the fleet's results dict."""
    from fl_server.weights import save_weights
    from powerfed.training.models import build_model

    tmp = tmp_path_factory.mktemp("summary-figure")
    weights = tmp / "start.safetensors"
    save_weights(weights, build_model("cnn-tiny", 10, seed=0), model_name="cnn-tiny", num_classes=10)
    relation = RelationVector.from_samples("cnn-tiny", "proxy", 0.3, {8: 300.0, 16: 400.0})
    (tmp / "fleet.yaml").write_text(FLEET)
    spec = load_fleet_spec(tmp / "fleet.yaml")
    flwr = tmp / "flwr"
    config = spec.run_config(flwr, spec.settings.methods, tmp / "profiles")
    config.update({"profile-samples": 512, "profile-warmup": 0, "profile-steps": 1})
    n = len(spec.boards)
    nodes = {100 + i: {"partition-id": i, "num-partitions": n} for i in range(n)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POWERFED_CACHE", str(tmp / "cache"))
        mp.setattr(server_app, "prepare_apart", lambda cfg: (weights, relation))
        context = Context(run_id=42, node_id=0, node_config={}, state=RecordDict(), run_config=config)
        server_app.run(FakeGrid(client_app, nodes, config), context)
    results = build_results(spec, flwr, spec.settings.methods, wall_s=1.0)
    yield {"tmp": tmp, "flwr": flwr, "results": results}


def _check_png(path: Path, least_px: tuple[int, int] = (900, 600)) -> None:
    """A real picture: at least `least_px` (width, height), not blank, many colours."""
    pixels = imread(path)
    height, width = pixels.shape[:2]
    assert width >= least_px[0] and height >= least_px[1], (width, height)
    rgb = (pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    assert float(rgb.var()) > 100.0  # not one flat colour
    assert len(np.unique(rgb, axis=0)) > 20  # the maps' colours, the methods' bars, the text


def test_make_runs_figure_is_drawn_beside_its_results_json(small_run: dict[str, Any], tmp_path: Path) -> None:
    """ours alone (as `make run`): its pair and bars, the state of practice estimated beside it."""
    results = tmp_path / "results.json"
    results.write_bytes((small_run["flwr"] / "ours" / "results.json").read_bytes())
    path = run_figure(results)
    assert path == tmp_path / SUMMARY_FIGURE
    _check_png(path, (1200, 3 * 300))  # a row per board and cap: three here


def test_a_run_of_several_methods_draws_them_all_from_its_folder(small_run: dict[str, Any]) -> None:
    path = run_figure(small_run["flwr"])
    assert path == small_run["flwr"] / SUMMARY_FIGURE
    _check_png(path, (1200, 3 * 300))


def test_make_fleets_figure_is_drawn_beside_its_results_json(
    small_run: dict[str, Any], tmp_path: Path
) -> None:
    results = small_run["results"]
    assert {r["method"] for r in results["records"]} == {"ours", "state-of-practice"}
    path = fleet_figure(results, tmp_path)
    assert path == tmp_path / SUMMARY_FIGURE
    _check_png(path, (1200, 3 * 300))


def test_a_board_without_a_board_model_gets_its_bars_and_no_map(
    small_run: dict[str, Any], tmp_path: Path
) -> None:
    """A deployed board the project has no model of: no profile to draw, its measured round still."""
    data = json.loads((small_run["flwr"] / "ours" / "results.json").read_text())
    for client in data["rounds"][0]["clients"]:
        client["device"], client["board"] = "jetson-orin-of-mine", "jetson-orin-of-mine"
    (tmp_path / "results.json").write_text(json.dumps(data))
    _check_png(run_figure(tmp_path / "results.json"), (1200, 300))


def test_a_results_file_without_a_client_is_one_line_and_the_run_stands(tmp_path: Path) -> None:
    data = {"schema": "fl_server.results/2", "run": {"method": "ours"}, "nodes": [], "rounds": []}
    (tmp_path / "results.json").write_text(json.dumps(data))
    said: list[str] = []
    assert draw_or_say(lambda: run_figure(tmp_path / "results.json"), said.append) is None
    why = f"{tmp_path / 'results.json'}: no client reported in any round: nothing to draw"
    assert said == [f"summary figure not drawn: {why}"]
    assert not (tmp_path / SUMMARY_FIGURE).exists()


def test_make_run_prints_the_figures_path_then_the_results_line_last(
    small_run: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`python -m simulations flwr-run` with Flower's run replaced by one that ends as a real run does:
    its results line naming the results.json the small run wrote."""
    out = tmp_path / "flwr"
    out.mkdir()
    (out / "results.json").write_bytes((small_run["flwr"] / "ours" / "results.json").read_bytes())
    ended = launcher.FlowerRun(results_line=f"results: {out / 'results.json'}")
    monkeypatch.setattr(launcher, "run_flwr", lambda *a, **k: ended)
    rc = simulations_cli.main(["flwr-run", "--out", str(out), "--log", str(tmp_path / "flwr.log")])
    lines = capsys.readouterr().out.strip().splitlines()
    assert rc == 0
    assert lines[-2:] == [f"summary figure: {out / SUMMARY_FIGURE}", f"results: {out / 'results.json'}"]
    _check_png(out / SUMMARY_FIGURE)


def test_make_fleet_writes_the_figure_beside_its_results_and_prints_its_path(
    small_run: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`python -m simulations run FLEET` with Flower's run replaced by the small run's records."""
    import shutil

    from simulations import runner

    def flower_ran(spec: object, out: Path, methods: list[str], **_: object) -> tuple[Path, list[int]]:
        shutil.copytree(small_run["flwr"], out / "flwr", ignore=shutil.ignore_patterns(SUMMARY_FIGURE))
        return out / "flwr", []

    monkeypatch.setattr(runner, "run_flower", flower_ran)
    monkeypatch.setenv("POWERFED_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "fleet"
    assert simulations_cli.main(["run", str(small_run["tmp"] / "fleet.yaml"), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"summary figure: {out / SUMMARY_FIGURE}"
    assert json.loads((out / "results.json").read_text())["summary_figure"] == SUMMARY_FIGURE
    _check_png(out / SUMMARY_FIGURE, (1200, 3 * 300))


def test_a_fleet_of_more_boards_and_caps_than_one_figure_holds_draws_the_first_and_says_so() -> None:
    """Past MAX_ROWS board-and-cap rows the figure would outgrow what Agg draws: the first rows, counted."""
    from simulations.summary_figure import MAX_ROWS, Bar, Row, summary_figure

    rows = [
        Row(f"board-{i}", 1.0 + i, 1, None, bars=[Bar("ours", 1.0, 0.5, 2.0)]) for i in range(MAX_ROWS + 1)
    ]
    fig = summary_figure(rows, "a large fleet")
    assert f"(the first {MAX_ROWS} of {MAX_ROWS + 1} boards and caps)" in fig._suptitle.get_text()
    assert len(fig.subfigs) == MAX_ROWS
    few = summary_figure(rows[:2], "a small fleet")
    assert "the first" not in few._suptitle.get_text() and len(few.subfigs) == 2
