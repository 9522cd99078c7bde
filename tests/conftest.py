"""Every test runs against temporary roots: never the real /sys, state dir, caches or Flower home."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
SEEDED_KINDS = ("weights", "relation")
"""What a seeded cache holds: the server's pre-trained weights and relation vector, never profiles or
checkpoints (a test that reuses a board's profile says so itself)."""


def pytest_configure(config: pytest.Config) -> None:
    # One intra-op thread per test process: small models on a shared 2-core machine run many times
    # faster than with oversubscribed threads, and `pytest -n 2` then uses both cores.
    torch.set_num_threads(1)
    # ... and one in every process a test starts (`flwr run`, the SuperLink, the ServerApp, a SuperNode;
    # Ray already gives its workers one): two OpenMP threads each, in processes that share the 2 cores,
    # spin while they wait (a quoted run alone: 68.6 → 59.3 CPU-s, the same numbers).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # The tests that press Ctrl-C (SIGINT to a process group) expect what a terminal gives its jobs:
    # SIGINT's default. A pytest started as a script's background job (`cmd &`) inherits SIGINT ignored,
    # and so would every process a test starts; a handler here is reset to the default by their exec.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _isolated_environment(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path_factory.mktemp("env")
    (root / "sysfs").mkdir()
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(root / "sysfs"))
    monkeypatch.setenv("POWERCTL_STATE_DIR", str(root / "state"))
    monkeypatch.setenv("POWERFED_CACHE", str(root / "cache"))
    monkeypatch.setenv("FLWR_HOME", str(root / "flwr"))
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    monkeypatch.setenv("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow tests first, so that the longest start first and the short ones fill in behind them.
    The Makefile's `--dist loadfile --no-loadscope-reorder` hands the test files out one at a time in
    the order of their first test, so the files with slow tests start first (xdist's default hands each
    worker a quarter of its share up front: one worker would get every slow test)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session")
def _seeded_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One folder for the whole test run, shared by the xdist workers (their base temps' parent is
    this run's own), never by another run."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "seeded-caches"


@pytest.fixture
def seeded_cache(_seeded_root: Path, tmp_path: Path) -> Callable[[str], Path]:
    """`seeded_cache(run_config)` is a new cache folder holding the pre-trained weights and relation
    vector of that run config (Flower's --run-config syntax over the app's defaults), built once per test
    run by the server's own code (`fl_server.app.prepare_apart`, which keys both as a run does) and
    copied afresh for each call. An end-to-end test that is about the run, not its preparation, starts
    from it; tests/test_flwr_run.py's four-board run keeps preparing from an empty cache."""

    def make(run_config: str) -> Path:
        from fl_server.run_config import parse_run_config

        # keyed by what the text says, not how it quotes it (tests write the same config both ways)
        said = json.dumps(parse_run_config(run_config), sort_keys=True)
        key = hashlib.sha256(said.encode()).hexdigest()[:16]
        built = _seeded_root / key
        _seeded_root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(_seeded_root / f"{key}.lock")):
            if not (built / "done").is_file():
                _build_seeded_cache(run_config, built)
        cache = Path(tempfile.mkdtemp(prefix=f"seeded-cache-{key}-", dir=tmp_path))  # a new copy each call
        for kind in SEEDED_KINDS:
            shutil.copytree(built / kind, cache / kind)
        return cache

    return make


def _build_seeded_cache(run_config: str, folder: Path) -> None:
    from fl_server.app import prepare_apart
    from fl_server.run_config import app_config, parse_run_config, parse_server_config

    cfg = parse_server_config({**app_config(ROOT), **parse_run_config(run_config)})
    shutil.rmtree(folder, ignore_errors=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POWERFED_CACHE", str(folder))
        prepare_apart(cfg)
    (folder / "done").write_text(run_config, encoding="utf-8")


@pytest.fixture
def shared_data() -> Path:
    """The real data beside the project; its absence is a failure, not a skip."""
    assert SHARED_DATA.is_dir(), f"real data expected at {SHARED_DATA} (../shared/data)"
    return SHARED_DATA


@pytest.fixture(scope="session")
def paper_workloads() -> dict[str, Any]:
    """Workloads of the paper's full-size models (measured once per test process: ~10 s)."""
    from powerfed.training.models import build_model, model_workload

    names = ("resnet18", "mobilenetv2", "chartransformer")
    return {n: model_workload(n, build_model(n, seed=0)) for n in names}


@pytest.fixture(scope="session")
def small_workload() -> Any:
    """A small image model's workload, with kernels and traffic measured."""
    from powerfed.training.models import build_model, model_workload

    return model_workload("resnet18-small", build_model("resnet18-small", seed=0))


@pytest.fixture(scope="session")
def all_workloads(paper_workloads: dict[str, Any]) -> dict[str, Any]:
    """Workloads of every model the project ships (the small ones added to the paper's)."""
    from powerfed.training.models import build_model, model_names, model_workload

    rest = {n: model_workload(n, build_model(n, seed=0)) for n in model_names() if n not in paper_workloads}
    return {**paper_workloads, **rest}
