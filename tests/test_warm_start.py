"""What a second run costs before its first round: the cached weights and relation vector are found in
the ServerApp's own process, the proxy's samples unread; `flwr run` packs a staged copy of the app."""

from __future__ import annotations

import sys
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

import fl_server.app as server_app
import fl_server.relation.estimate as relation_estimate
import fl_server.relation.runs as relation_runs
from fl_server.fab import fab_roots, staged_app
from fl_server.relation import NotCached
from fl_server.run_config import app_config, parse_run_config, parse_server_config
from tests.relation_call import flat_estimate

ROOT = Path(__file__).resolve().parents[1]
TINY = (
    'model="cnn-tiny" relation-seeds="0" batch-sizes=\'8,16\' pretrain-samples=128 target-accuracy=0.2 '
    "eval-every-samples=32 eval-max-samples=64 relation-max-samples=2000"
)


def _cfg(run_config: str = TINY):
    return parse_server_config({**app_config(ROOT), **parse_run_config(run_config)})


def _refuse(what: str):
    def refuse(*args, **kwargs):
        raise AssertionError(f"{what} was called")

    return refuse


def test_a_warm_cache_is_found_in_process_without_reading_the_proxy_or_spawning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = _cfg()
    assert server_app.cached_preparation(cfg) is None  # an empty cache: nothing found, nothing trained
    weights, relation = server_app.prepare(cfg)  # as the spawned child does it
    monkeypatch.setattr(server_app, "ProcessPoolExecutor", _refuse("a spawned preparation"))
    monkeypatch.setattr(relation_estimate, "load_proxy", _refuse("reading the proxy data"))  # the one reader
    monkeypatch.setattr(relation_runs, "fine_tune", _refuse("training"))
    found = server_app.prepare_apart(cfg)
    assert found[0] == weights and found[1].to_dict() == relation
    assert (
        server_app.cached_preparation(_cfg(TINY.replace("target-accuracy=0.2", "target-accuracy=0.25")))
        is None
    )  # another setting


def test_compute_false_trains_nothing_and_says_not_cached(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relation_runs, "fine_tune", _refuse("training"))
    with pytest.raises(NotCached, match="no cached relation vector of cnn-tiny"):
        flat_estimate(
            "cnn-tiny", None, "synthetic-image", target_accuracy=0.2, batch_sizes=[8, 16], compute=False
        )


def _fab_names(app: Path) -> tuple[list[str], bytes]:
    from flwr.cli.build import build_fab_from_disk

    fab = build_fab_from_disk(app)
    with zipfile.ZipFile(BytesIO(fab)) as z:
        return sorted(n for n in z.namelist() if not n.startswith(".info/")), fab


def test_the_staged_app_packs_to_the_same_fab_without_the_rest_of_the_folder(tmp_path: Path) -> None:
    app = tmp_path / "app"
    (app / "pkg" / "sub").mkdir(parents=True)
    (app / "pkg" / "__init__.py").write_text("")
    (app / "pkg" / "sub" / "task.py").write_text("X = 1\n")
    (app / "pkg" / "sub" / "fleet.yaml").write_text("a: 1\n")
    (app / "pkg" / "ignored.py").write_text("")
    (app / "tests").mkdir()
    (app / "tests" / "test_x.py").write_text("")
    (app / ".venv" / "lib").mkdir(parents=True)
    for i in range(50):
        (app / ".venv" / "lib" / f"m{i}.py").write_text("")
    (app / ".gitignore").write_text("pkg/ignored.py\n")
    (app / "pyproject.toml").write_text(
        (ROOT / "pyproject.toml").read_text().replace("fab-include = [", 'fab-include = ["pkg/**"] # [', 1)
    )
    assert fab_roots(app) == ["pkg"]
    staged = staged_app(app, tmp_path / "staged")
    assert sorted(p.name for p in staged.iterdir()) == [".gitignore", "pkg", "pyproject.toml"]
    names, fab = _fab_names(app)
    assert names == ["pkg/__init__.py", "pkg/sub/fleet.yaml", "pkg/sub/task.py", "pyproject.toml"]
    assert _fab_names(staged) == (names, fab)  # byte for byte: the same FAB, the same hash


def test_the_projects_fab_roots_are_its_packages_and_an_unsaid_include_is_not_staged(tmp_path: Path) -> None:
    assert fab_roots(ROOT) == ["fl_client", "fl_server", "powerctl", "powerfed", "simulations", "strategies"]
    (tmp_path / "pyproject.toml").write_text('[tool.flwr.app]\npublisher = "x"\n')
    assert staged_app(tmp_path, tmp_path / "staged") == tmp_path and not (tmp_path / "staged").exists()
    (tmp_path / "pyproject.toml").write_text('[tool.flwr.app]\nfab-include = ["**/*.py"]\n')
    assert fab_roots(tmp_path) is None


def test_the_simulations_cli_answers_help_without_importing_torch() -> None:
    import subprocess

    code = (
        "import sys; from simulations.__main__ import main; main(['--help']); print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout[-500:]
