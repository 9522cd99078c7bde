"""Every test runs against temporary roots: never the real /sys, state dir, caches or Flower home."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import torch

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_configure(config: pytest.Config) -> None:
    # One intra-op thread per test process: small models on a shared 2-core machine run many times
    # faster than with oversubscribed threads, and `pytest -n 2` then uses both cores.
    torch.set_num_threads(1)
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
