"""The server trains where it is told (issue 29): `--device`/`server-device` reach every model and batch
of pre-training and the relation estimate, `auto` is the CPU on this machine, a GPU that is not here is
one line, the weights on disk are CPU tensors, and the caches' keys hold torch's thread count but not the
device.

This machine has no GPU, so a GPU is pretended: torch says CUDA is there, and every `.to(cuda...)` of a
module or a tensor is recorded and left where it is (on the CPU), so the real code runs through."""

from __future__ import annotations

import contextlib
import types
import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from ray import cloudpickle

import fl_server.relation.runs as relmod
import powerfed.training.finetune as finetune
import powerfed.training.numerics as numerics
from fl_server.app import pretrained_weights
from fl_server.cli import main
from fl_server.pretrain import PretrainSettings, pretrain
from fl_server.relation import RelationError
from fl_server.relation.parallel import gpu_share
from fl_server.weights import load_weights
from powerctl.devices import open_device
from powerctl.devices.host import HostDevice
from powerctl.devices.torchdev import check_torch_spec, resolve_torch_device
from powerctl.errors import DeviceError
from strategies.settings import read_settings
from tests.relation_call import flat_estimate

SMALL = {
    "limit": 150,
    "eval_every_samples": 32,
    "max_samples": 3000,
    "progress": False,
    "seeds": (0,),
    "data_seed": 0,
    "lr_max": 2e-3,
    "batch_sizes": [8, 16],
    "target_accuracy": 0.5,
}


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Two pretend CUDA devices; returns the (what, target) of every move to one of them."""
    moved: list[tuple[str, str]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)

    def recorder(real: Any, what: Any) -> Any:
        def to(self: Any, *args: Any, **kwargs: Any) -> Any:
            target = args[0] if args else kwargs.get("device")
            if isinstance(target, (str, torch.device)) and str(target).startswith("cuda"):
                moved.append((what(self), str(target)))
                return self
            return real(self, *args, **kwargs)

        return to

    monkeypatch.setattr(torch.nn.Module, "to", recorder(torch.nn.Module.to, lambda m: type(m).__name__))
    monkeypatch.setattr(torch.Tensor, "to", recorder(torch.Tensor.to, lambda _: "tensor"))
    # the training loop puts its batches where the model is: a model sent to a pretend GPU is there for
    # it (its RNG fork on that GPU is the one thing the CPU cannot pretend)
    sent: weakref.WeakKeyDictionary[torch.nn.Module, torch.device] = weakref.WeakKeyDictionary()
    moving = torch.nn.Module.to

    def module_to(self: Any, *args: Any, **kwargs: Any) -> Any:
        target = args[0] if args else kwargs.get("device")
        if isinstance(target, (str, torch.device)) and str(target).startswith("cuda"):
            sent[self] = torch.device(str(target))
        return moving(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "to", module_to)
    monkeypatch.setattr(finetune, "_model_device", lambda model: sent.get(model, torch.device("cpu")))
    monkeypatch.setattr(torch.random, "fork_rng", lambda devices=(): contextlib.nullcontext())
    return moved


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[torch.nn.Module]:
    """Every model the relation estimate builds."""
    models: list[torch.nn.Module] = []
    real = relmod.build_spec

    def build(*args: Any, **kwargs: Any) -> torch.nn.Module:
        models.append(real(*args, **kwargs))
        return models[-1]

    monkeypatch.setattr(relmod, "build_spec", build)
    return models


def tensors(moved: list[tuple[str, str]]) -> list[str]:
    """Where the tensors (not the modules) were sent, in order."""
    return [t for w, t in moved if w == "tensor"]


# --- the one reader ----------------------------------------------------------------------------------
def test_auto_is_the_cpu_here_and_the_forms_are_read_once() -> None:
    assert not torch.cuda.is_available()  # this machine: the test is about it
    assert resolve_torch_device("auto") == "cpu" == resolve_torch_device("cpu")
    assert open_device("auto").torch_device() == "cpu" and HostDevice().torch_device() == "cpu"
    assert [check_torch_spec(s) for s in ("cuda", " cuda:3 ", "auto")] == ["cuda:0", "cuda:3", "auto"]
    assert read_settings({}).server_device == "auto"
    assert read_settings({"server-device": "cuda"}).server_device == "cuda:0"
    for bad in ("gpu", "cuda:x", "cuda:-1", "", "CPU"):
        with pytest.raises(DeviceError):
            check_torch_spec(bad)


def test_a_gpu_torch_does_not_have_is_one_line(fake_gpu: list) -> None:
    assert resolve_torch_device("auto") == "cuda:0" and resolve_torch_device("cuda:1") == "cuda:1"
    with pytest.raises(DeviceError, match=r"cuda:2: torch sees 2 CUDA device\(s\)"):
        resolve_torch_device("cuda:2")


@pytest.mark.parametrize("command", ["pretrain", "relation"])
@pytest.mark.parametrize(
    ("device", "says"),
    [("cuda", "sees no CUDA device here"), ("cuda:1", "sees no CUDA device"), ("gpu", "--device")],
)
def test_cli_refuses_a_device_in_one_line_nothing_written(
    command: str, device: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = {
        "pretrain": ["pretrain", "--data", "synthetic-image", "--out", f"{tmp_path}/w.safetensors"],
        "relation": [
            "relation",
            "--proxy",
            "synthetic-image",
            "--target",
            "0.5",
            "--out",
            f"{tmp_path}/r.json",
        ],
    }[command]
    assert main([*argv, "--model", "cnn-tiny", "--device", device, "--no-progress"]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fl-server") and says in lines[0], captured.err
    assert captured.out == "" and list(tmp_path.iterdir()) == []


# --- placement ---------------------------------------------------------------------------------------
def test_pretrain_moves_the_model_to_the_device_and_writes_cpu_weights(
    fake_gpu: list, tmp_path: Path
) -> None:
    out = tmp_path / "w.safetensors"
    settings = PretrainSettings(samples=64, limit=100)
    report = pretrain(
        "cnn-tiny", "synthetic-image", out=out, settings=settings, device="cuda:1", progress=False
    )
    assert [t for w, t in fake_gpu if w != "tensor"] == ["cuda:1"]  # the model
    # its data, evaluation subset and sample order follow it (train x, y; eval x, y; the order)
    assert len(tensors(fake_gpu)) >= 5 and set(tensors(fake_gpu)) == {"cuda:1"}
    assert report.data["torch_device"] == "cuda:1" and report.data["device"] == "cuda:1"
    state, _ = load_weights(out)
    assert {t.device.type for t in state.values()} == {"cpu"}


def test_pretrain_by_default_trains_on_the_cpu_here(tmp_path: Path) -> None:
    settings = PretrainSettings(samples=64, limit=100)
    report = pretrain(
        "cnn-tiny", "synthetic-image", out=tmp_path / "w.safetensors", settings=settings, progress=False
    )
    assert report.data["device"] == "auto" and report.data["torch_device"] == "cpu"


def test_every_relation_model_and_probe_batch_goes_to_the_device(
    fake_gpu: list, built: list, tmp_path: Path
) -> None:
    flat_estimate("cnn-tiny", None, "synthetic-image", device="cuda:1", cache_dir=tmp_path, **SMALL)
    models = [t for w, t in fake_gpu if w != "tensor"]
    # the first model built only makes the seeded starting weights; the probe's and every run's train
    assert len(built) >= 4 and models == ["cuda:1"] * (len(built) - 1)
    # the probe's x and y, then every run's data, evaluation subset and order
    runs = len(built) - 2
    assert len(tensors(fake_gpu)) >= 2 + 5 * runs and set(tensors(fake_gpu)) == {"cuda:1"}


class FakeRay(types.SimpleNamespace):
    """What `_run_parallel` asks of Ray, run in this process; records each task's resources."""

    def __init__(self, gpus: int) -> None:
        super().__init__(cloudpickle=cloudpickle, exceptions=types.SimpleNamespace(RayTaskError=RuntimeError))
        self.gpus, self.options = gpus, []

    def is_initialized(self) -> bool:
        return True

    def cluster_resources(self) -> dict[str, float]:
        return {"CPU": 2.0, "GPU": float(self.gpus)}

    def remote(self, **options: Any) -> Any:
        self.options.append(options)
        return lambda fn: types.SimpleNamespace(remote=lambda *a, **kw: fn(*a, **kw))

    def put(self, value: Any) -> Any:
        return value

    def wait(self, pending: list, num_returns: int) -> tuple[list, list]:
        return pending[:num_returns], pending[num_returns:]

    def get(self, ref: Any) -> Any:
        return ref


def test_parallel_runs_on_a_gpu_ask_ray_for_a_share_of_it(
    fake_gpu: list, built: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray = FakeRay(gpus=1)
    monkeypatch.setitem(__import__("sys").modules, "ray", ray)
    flat_estimate(
        "cnn-tiny",
        None,
        "synthetic-image",
        device="cuda:1",
        parallel=True,
        num_cpus=2,
        cache_dir=tmp_path,
        **SMALL,
    )
    assert ray.options == [{"num_cpus": 1, "num_gpus": 0.5}]
    # in a task, the GPU Ray gave is its cuda:0 (Ray sets CUDA_VISIBLE_DEVICES)
    assert [t for w, t in fake_gpu if w != "tensor"] == ["cuda:1"] + ["cuda:0"] * (len(built) - 2)
    moved = tensors(fake_gpu)
    assert moved[:2] == ["cuda:1"] * 2 and len(moved) > 2 and set(moved[2:]) == {"cuda:0"}
    assert gpu_share(3, 12) == 0.3333 and gpu_share(8, 2) == 0.5 and gpu_share(1, 5) == 1.0


def test_parallel_gpu_runs_where_ray_has_no_gpu_are_one_line(
    fake_gpu: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "ray", FakeRay(gpus=0))
    with pytest.raises(RelationError, match="Ray sees none"):
        flat_estimate(
            "cnn-tiny", None, "synthetic-image", device="cuda", parallel=True, cache_dir=tmp_path, **SMALL
        )


# --- the caches: the device out of the key, the thread count in it -----------------------------------
def test_the_relation_cache_key_has_the_thread_count_and_cpu_not_the_device(
    fake_gpu: list, built: list, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        first = flat_estimate("cnn-tiny", None, "synthetic-image", device="cpu", cache_dir=tmp_path, **SMALL)
        runs = len(built)
        again = flat_estimate(
            "cnn-tiny", None, "synthetic-image", device="cuda:1", cache_dir=tmp_path, **SMALL
        )
        assert len(built) == runs and again.extra["cache_key"] == first.extra["cache_key"]  # from the cache
        torch.set_num_threads(2)
        other = flat_estimate("cnn-tiny", None, "synthetic-image", device="cpu", cache_dir=tmp_path, **SMALL)
        assert len(built) > runs and other.extra["cache_key"] != first.extra["cache_key"]
        assert torch.get_num_threads() == 2  # the runs gave the caller's count back
        runs = len(built)
        monkeypatch.setattr(numerics, "cpu_identity", lambda: "AVX512 another CPU")
        elsewhere = flat_estimate(
            "cnn-tiny", None, "synthetic-image", device="cpu", cache_dir=tmp_path, **SMALL
        )
        assert len(built) > runs and elsewhere.extra["cache_key"] != other.extra["cache_key"]
    finally:
        torch.set_num_threads(before)
    assert len(list(tmp_path.glob("relation-*.json"))) == 3


def test_the_weights_recipe_has_the_thread_count_and_cpu_not_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fl_server.pretrain as premod

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(premod, "pretrain", lambda *a, **kw: calls.append(kw))
    paths = {}
    before = torch.get_num_threads()
    try:
        for threads, device, cpu in (
            (1, "cpu", "here"),
            (1, "cuda", "here"),
            (2, "cpu", "here"),
            (2, "cpu", "AVX512"),
        ):
            torch.set_num_threads(threads)
            monkeypatch.setattr(numerics, "cpu_identity", lambda cpu=cpu: cpu)
            cfg = read_settings({"model": "cnn-tiny", "server-device": device})
            paths[threads, device, cpu] = pretrained_weights(cfg)
    finally:
        torch.set_num_threads(before)
    assert paths[1, "cpu", "here"] == paths[1, "cuda", "here"] != paths[2, "cpu", "here"]
    assert paths[2, "cpu", "AVX512"] not in (paths[1, "cpu", "here"], paths[2, "cpu", "here"])
    assert [c["device"] for c in calls] == ["cpu", "cuda:0", "cpu", "cpu"]
