"""A user's model that is not one of the built-ins gets a relation vector (issue 27 item 4): a small CNN
on 1×16×16 tensors, registered with register_model, through the estimator's crossing, stopping rule and
cache — and the same model through the user's own loop (`train_to_target`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fl_server.relation.runs as relmod
from fl_server.relation import RelationError
from powerctl.errors import PowerctlError
from powerfed.training.data import load_dataset
from powerfed.training.errors import ModelError
from powerfed.training.lr import scaled_lr
from powerfed.training.models import (
    build_model,
    get_model_spec,
    model_names,
    register_model,
    unregister_model,
)
from tests.relation_call import flat_estimate

NAME = "test-user-cnn"


class UserCNN(nn.Module):
    """The user's own network: one grey channel, 16×16, four classes."""

    def __init__(self, num_classes: int = 4, width: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(F.relu(self.conv2(x)), 1), 1))


def user_data(n: int = 400, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Four classes, each a fixed 1×16×16 pattern under noise: learnt within a few hundred samples."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(4, 1, 16, 16, generator=g)
    y = torch.arange(n) % 4
    return torch.randn(n, 1, 16, 16, generator=g) + 2.5 * patterns[y], y


SETTINGS: dict[str, Any] = {
    "target_accuracy": 0.75,
    "batch_sizes": (8, 16, 32),
    "seeds": (0,),
    "lr_max": 1e-2,
    "eval_every_samples": 64,
    "max_samples": 4000,
    "data_seed": 0,
    "progress": False,
}


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    """The model registered as a user's app registers it; one torch thread (the shared cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    register_model(NAME, UserCNN, input_shape=(1, 16, 16), description="the user's CNN")
    try:
        yield
    finally:
        unregister_model(NAME)
        torch.set_num_threads(threads)


class CountingRuns:
    """Wraps the estimator's fine_tune to count the runs (a cache hit makes none)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        self.real = relmod.fine_tune
        monkeypatch.setattr(relmod, "fine_tune", self)

    def __call__(self, *args: Any, **kw: Any) -> Any:
        self.calls += 1
        return self.real(*args, **kw)


def test_registered_user_model_gets_a_relation_vector_with_crossing_and_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = CountingRuns(monkeypatch)
    kw = {**SETTINGS, "cache_dir": tmp_path, "cache_key": "user-cnn-v1"}
    rel = flat_estimate(NAME, None, user_data(), **kw)
    assert rel.model == NAME and rel.proxy_dataset == "tensors:400x1x16x16"
    assert rel.batch_sizes == (8, 16, 32) and rel.relation[-1] == 1.0
    assert all(s > 0 for s in rel.samples_to_target)
    for run in rel.extra["runs"]:  # the dense rule: ≥ 8 evaluations before the crossing, or one step apart
        assert run["reached"] and run["initial_accuracy"] < 0.75
        assert run["evaluations"] >= 8 or run["eval_every_samples"] == run["batch_size"]
    first = runs.calls
    assert first >= 3
    # the cache: the same model, data and settings again train nothing and give the same file
    assert flat_estimate(NAME, None, user_data(), **kw).to_dict() == rel.to_dict()
    assert runs.calls == first and len(list(tmp_path.iterdir())) == 1
    # other data of the same shape, or another cache_key (the user's code changed): estimated again
    x, y = user_data()
    x[0, 0, 0, 0] += 1.0
    flat_estimate(NAME, None, (x, y), **{**kw, "max_seeds": None})
    assert runs.calls > first
    again = runs.calls
    flat_estimate(NAME, None, user_data(), **{**kw, "cache_key": "user-cnn-v2"})
    assert runs.calls > again and len(list(tmp_path.iterdir())) == 3


def test_user_code_without_a_cache_key_is_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_training(*_: Any, **__: Any) -> Any:
        raise AssertionError("stop after the cache decision")

    monkeypatch.setattr(relmod, "fine_tune", no_training)
    with pytest.raises(AssertionError):
        flat_estimate(NAME, None, user_data(), **SETTINGS, cache_dir=tmp_path)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_the_same_data_as_tensors_a_dataset_a_loader_or_a_factory_gives_the_same_vector() -> None:
    x, y = user_data()
    kw = {**SETTINGS, "use_cache": False, "batch_sizes": (8, 32)}
    tensors = flat_estimate(NAME, None, (x, y), **kw)
    loader = flat_estimate(NAME, None, DataLoader(TensorDataset(x, y), batch_size=50), **kw)
    samples = [(x[i], int(y[i])) for i in range(len(y))]  # a map-style dataset of pairs, as users write
    factory = flat_estimate(lambda: UserCNN(), None, samples, **kw)
    assert loader.samples_to_target == tensors.samples_to_target == factory.samples_to_target
    assert factory.model == "user-model"


def test_loss_and_metric_are_the_users(tmp_path: Path) -> None:
    seen: dict[str, int] = {"loss": 0, "metric": 0}

    def loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        seen["loss"] += 1
        return F.cross_entropy(out, target, label_smoothing=0.1)

    def metric(out: torch.Tensor, target: torch.Tensor) -> float:
        seen["metric"] += 1
        return float((out.argmax(1) == target).float().mean())

    kw = {**SETTINGS, "batch_sizes": (16, 32), "cache_dir": tmp_path}
    rel = flat_estimate(NAME, None, user_data(), loss=loss, metric=metric, **kw)
    assert seen["loss"] > 10 and seen["metric"] > 4 and rel.relation[-1] == 1.0
    assert not list(tmp_path.iterdir()), "a user's loss and metric without a cache_key are not cached"


def test_own_loop_through_train_to_target(tmp_path: Path) -> None:
    """The user's plain PyTorch loop over a DataLoader, to the target, for each (batch size, rate, seed)."""
    x, y = user_data()
    train, test = TensorDataset(x[:320], y[:320]), (x[320:], y[320:])
    calls: list[tuple[int, float, int]] = []

    def train_to_target(batch_size: int, lr: float, seed: int) -> float | None:
        calls.append((batch_size, lr, seed))
        torch.manual_seed(seed)
        model = UserCNN()
        opt = torch.optim.Adam(model.parameters(), lr=lr)
        loader = DataLoader(train, batch_size=batch_size, shuffle=True, drop_last=True)
        samples = 0
        for _ in range(10):
            for xb, yb in loader:
                opt.zero_grad()
                F.cross_entropy(model(xb), yb).backward()
                opt.step()
                samples += len(xb)
                with torch.no_grad():
                    if (model(test[0]).argmax(1) == test[1]).float().mean() >= 0.75:
                        return samples
        return None

    kw = {k: v for k, v in SETTINGS.items() if k in ("target_accuracy", "batch_sizes", "seeds", "lr_max")}
    rel = flat_estimate(
        NAME, train_to_target=train_to_target, cache_dir=tmp_path, cache_key="own-loop-v1", **kw
    )
    assert rel.model == NAME and rel.relation[-1] == 1.0 and all(s > 0 for s in rel.samples_to_target)
    assert calls == [(b, scaled_lr(1e-2, b, 32), 0) for b in (8, 16, 32)]
    assert rel.extra["samples_rule"] == "the user's train_to_target"
    again = flat_estimate(
        NAME, train_to_target=train_to_target, cache_dir=tmp_path, cache_key="own-loop-v1", **kw
    )
    assert again.to_dict() == rel.to_dict() and len(calls) == 3, "a cache hit runs nothing"


def test_own_loop_keeps_the_stopping_rule_and_names_a_miss() -> None:
    per_seed = {0: {4: 100, 8: 320}, 1: {4: 192, 8: 320}, 2: {4: 480, 8: 320}}

    def samples(batch_size: int, lr: float, seed: int) -> float:
        return float(per_seed[seed][batch_size])

    rel = flat_estimate(
        "anything",
        train_to_target=samples,
        target_accuracy=0.5,
        batch_sizes=(4, 8),
        seeds=(0, 1),
        max_seeds=5,
    )
    assert rel.extra["seeds_needed"] == 3 and rel.extra["ranking_stable"] is True
    with pytest.raises(
        RelationError, match=r"^batch size 8 \(seed 0\) did not reach target accuracy 0\.5 on"
    ):
        flat_estimate(
            "anything",
            train_to_target=lambda b, lr, s: None if b == 8 else 10.0,
            target_accuracy=0.5,
            batch_sizes=(4, 8),
            seeds=(0,),
        )
    with pytest.raises(RelationError, match=r"returned 'ten': it must return the samples"):
        flat_estimate(
            "anything",
            train_to_target=lambda b, lr, s: "ten",
            target_accuracy=0.5,
            batch_sizes=(4,),
            seeds=(0,),
        )


def test_unpicklable_model_runs_one_at_a_time_with_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    lock = threading.Lock()

    def factory() -> nn.Module:
        with lock:  # a closure over a lock cannot cross to a Ray worker
            return UserCNN()

    kw = {**SETTINGS, "use_cache": False, "batch_sizes": (16, 32), "parallel": True}
    with caplog.at_level(logging.WARNING, logger="fl_server.relation"):
        rel = flat_estimate(factory, None, user_data(), **kw)
    assert rel.relation[-1] == 1.0
    assert any("one at a time" in r.getMessage() for r in caplog.records)


DRIVER_ONLY = """
from torch import nn
class DriverOnlyNet(nn.Module):
    def __init__(self, num_classes=4):
        super().__init__()
        self.fc = nn.Sequential(nn.Flatten(), nn.Linear(256, num_classes))
    def forward(self, x):
        return self.fc(x)
"""


@pytest.mark.slow
def test_registered_user_model_in_ray_equals_serial_and_one_only_the_driver_imports_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registered model importable by the workers gives the serial vector, seed by seed, on the Ray
    that estimate_relation starts and stops itself (the built-in models' path: the same code); one whose
    module only this process can import (a folder put on sys.path here) is one line naming the module
    and what to do, not Ray's nine-line RayTaskError (issue 36, class 6), on a Ray started beforehand."""
    import ray

    kw = {**SETTINGS, "use_cache": False, "batch_sizes": (8, 16, 32), "seeds": (0, 1)}
    serial = flat_estimate(NAME, None, user_data(), **kw)
    parallel = flat_estimate(NAME, None, user_data(), parallel=True, num_cpus=2, **kw)
    assert not ray.is_initialized()  # the Ray it started is stopped
    assert parallel.samples_to_target == serial.samples_to_target
    assert parallel.extra["samples_per_seed"] == serial.extra["samples_per_seed"]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        (tmp_path / "driver_only_models.py").write_text(DRIVER_ONLY)
        monkeypatch.syspath_prepend(str(tmp_path))
        from driver_only_models import DriverOnlyNet  # type: ignore[import-not-found]

        register_model("driver-only-net", DriverOnlyNet, input_shape=(1, 16, 16))
        try:
            with pytest.raises(PowerctlError) as err:
                flat_estimate("driver-only-net", None, user_data(), parallel=True, num_cpus=2, **kw)
        finally:
            unregister_model("driver-only-net")
    finally:
        ray.shutdown()
    text = str(err.value)
    assert "\n" not in text and "a Ray worker cannot import module 'driver_only_models'" in text, text
    assert text.endswith("or give how=RelationCompute(parallel=False)"), text  # the flag is a field of it


# --------------------------------------------------------------------------- registry and channels


def test_registry_refuses_duplicates_and_names_the_registered() -> None:
    assert model_names()[:7] == [
        "resnet18",
        "resnet18-small",
        "mobilenetv2",
        "mobilenetv2-small",
        "cnn-tiny",
        "chartransformer",
        "chartransformer-small",
    ]
    assert NAME in model_names() and get_model_spec(NAME).input_shape == (1, 16, 16)
    with pytest.raises(ModelError, match=rf"^model '{NAME}' is already registered .*replace=True"):
        register_model(NAME, UserCNN, input_shape=(1, 16, 16))
    register_model(NAME, UserCNN, input_shape=(1, 16, 16), replace=True, width=4)
    assert build_model(NAME, 4).conv1.out_channels == 4  # the registered variant, built by name
    with pytest.raises(ModelError, match=rf"^unknown model 'mycnn'; choose one of: resnet18, .*{NAME}"):
        build_model("mycnn")
    with pytest.raises(ModelError, match="input_shape must be one sample's shape"):
        register_model("other", UserCNN, input_shape=(1, 0, 16))
    with pytest.raises(ModelError, match="its factory takes no depth"):
        register_model("other", UserCNN, input_shape=(1, 16, 16), depth=3)
    assert "other" not in model_names()


def test_npz_takes_one_channel_and_the_model_decides(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "grey.npz"
    np.savez(path, x=rng.integers(0, 256, (200, 1, 16, 16), dtype=np.uint8), y=np.arange(200) % 4)
    ds = load_dataset(f"npz:{path}", split="all")
    assert tuple(ds.x.shape) == (200, 1, 16, 16) and ds.task == "image"
    channels_last = tmp_path / "last.npz"
    np.savez(channels_last, x=rng.integers(0, 256, (20, 16, 16, 1), dtype=np.uint8), y=np.arange(20) % 4)
    assert tuple(load_dataset(f"npz:{channels_last}", split="all").x.shape) == (20, 1, 16, 16)
    with pytest.raises(ModelError) as err:
        flat_estimate("cnn-tiny", None, f"npz:{path}", **SETTINGS, use_cache=False)
    msg = str(err.value)
    assert msg.startswith("model 'cnn-tiny' takes samples of shape 3x32x32 (3 channels)") and "\n" not in msg
    assert "has 1x16x16" in msg


def _sgd_momentum_step(
    calls: list[int],
) -> Callable[[nn.Module], Callable[[torch.Tensor, torch.Tensor], None]]:
    """The user's own step, the one their PowerSession takes: SGD with momentum, their rate."""

    def make_step(model: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], None]:
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def step(x: torch.Tensor, y: torch.Tensor) -> None:
            calls.append(len(x))
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()

        return step

    return make_step


def test_the_relation_vector_is_the_users_step_s_when_it_gives_one(tmp_path: Path) -> None:
    """Issue 37, item 1: `flat_estimate(make_step=...)` trains every run with the user's step (their
    optimizer), with the project's crossing, seeds and cache; a step without a cache_key is not cached."""
    calls: list[int] = []
    kw = {**SETTINGS, "cache_dir": tmp_path}
    own = flat_estimate(NAME, None, user_data(), make_step=_sgd_momentum_step(calls), **kw)
    assert calls and set(calls) == {8, 16, 32}, "every run's steps are the user's"
    adam = flat_estimate(NAME, None, user_data(), **kw)
    assert own.samples_to_target != adam.samples_to_target  # another optimizer, another vector
    assert not list(tmp_path.glob("relation-*.json")), "user code without a cache_key: nothing cached"
    before = len(calls)
    flat_estimate(NAME, None, user_data(), make_step=_sgd_momentum_step(calls), **kw)
    assert len(calls) > before, "user code without a cache_key is estimated again, never served a cache"
    keyed = flat_estimate(
        NAME, None, user_data(), make_step=_sgd_momentum_step(calls), cache_key="sgd-v1", **kw
    )
    at = len(calls)
    again = flat_estimate(
        NAME, None, user_data(), make_step=_sgd_momentum_step(calls), cache_key="sgd-v1", **kw
    )
    assert len(calls) == at and again.to_dict() == keyed.to_dict()  # keyed: cached
    assert keyed.samples_to_target == own.samples_to_target  # the same step and seeds: the same numbers


def test_train_to_target_is_given_the_target_and_its_key_holds_the_datas_bytes(tmp_path: Path) -> None:
    seen: list[float] = []

    def four(batch_size: int, lr: float, seed: int, target: float) -> float:
        seen.append(target)
        return 100.0 * batch_size

    kw = {"target_accuracy": 0.6, "batch_sizes": (8, 16), "seeds": (0,), "cache_dir": tmp_path}
    x, y = user_data(n=64)
    flat_estimate(NAME, proxy=(x, y), train_to_target=four, cache_key="k", **kw)
    assert seen == [0.6, 0.6]
    flat_estimate(NAME, proxy=(x, y), train_to_target=four, cache_key="k", **kw)
    assert len(seen) == 2, "the same data: cached"
    flat_estimate(NAME, proxy=(x + 1.0, y), train_to_target=four, cache_key="k", **kw)
    assert len(seen) == 4, "other data bytes under the same cache_key: estimated again"
    three = flat_estimate(
        NAME, train_to_target=lambda b, lr, s: 50.0 * b, target_accuracy=0.6, batch_sizes=(8, 16), seeds=(0,)
    )
    assert three.samples_to_target == (400.0, 800.0)  # the documented three arguments still work


@pytest.mark.parametrize(
    ("given", "fragment"),
    [
        ({"loss": lambda outputs: outputs.sum()}, "'loss' must take (outputs, targets)"),
        ({"metric": lambda outputs, targets, extra: 1.0}, "'metric' must take (outputs, targets)"),
        ({"make_step": lambda: None}, "'make_step' must take (model)"),
        ({"train_to_target": lambda b, lr: 1.0}, "'train_to_target' must take (batch_size, lr, seed["),
        ({"metric": 3}, "'metric' must be callable, got 3"),  # refused where UserFunctions is made
    ],
)
def test_user_functions_that_cannot_take_their_arguments_are_refused_where_they_are_given(
    given: dict, fragment: str
) -> None:
    from powerctl.errors import ArgumentError
    from powerfed.training.finetune_records import UserFunctions

    with pytest.raises(ArgumentError) as err:
        UserFunctions(**given)
    assert "\n" not in str(err.value) and str(err.value).startswith("UserFunctions: ")
    assert fragment in str(err.value), str(err.value)


def test_a_make_step_that_returns_no_step_is_one_line_not_the_projects_step_trained_instead(
    tmp_path: Path,
) -> None:
    from powerctl.errors import ArgumentError

    kw = {**SETTINGS, "batch_sizes": (8,), "max_samples": 64, "cache_dir": tmp_path}
    with pytest.raises(ArgumentError) as err:
        flat_estimate(NAME, None, user_data(n=64), make_step=lambda model: None, **kw)
    assert "\n" not in str(err.value) and "make_step(model) returned None" in str(err.value), str(err.value)
