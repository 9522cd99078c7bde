"""Relation-vector estimation: real runs on synthetic data, errors that say what to change, the cache."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

import fl_server.relation as relmod
import fl_server.relation.runs as runsmod
from fl_server.relation import RelationError
from fl_server.weights import save_weights
from powerctl.devices.host import HostDevice
from powerctl.errors import ArgumentError, FileFormatError
from powerctl.records.relation import RelationVector, fit_batch_efficiency
from powerfed.training.data import load_dataset, train_test_split
from powerfed.training.errors import DataError
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import CurvePoint, FineTuneCallbacks, FineTuneConfig, FineTuneResult
from powerfed.training.lr import scaled_lr
from powerfed.training.models import build_model
from tests.relation_call import flat_estimate

IMAGE = {
    "limit": 150,
    "eval_every_samples": 32,
    "max_samples": 3000,
    "progress": False,
    "seeds": (0,),
    "data_seed": 0,
}
"""A small image estimate: one seed, and the proxy split of `train_test_split`'s default seed (0) that the
direct run below uses (the run config's defaults, 3 seeds and proxy seed 1, are the function's)."""


def test_end_to_end_on_synthetic_images(tmp_path: Path) -> None:
    rel = flat_estimate(
        "cnn-tiny",
        None,
        "synthetic-image",
        target_accuracy=0.5,
        batch_sizes=[32, 8, 16],
        lr_max=2e-3,
        cache_dir=tmp_path,
        **IMAGE,
    )
    assert rel.batch_sizes == (8, 16, 32)  # sorted, largest last
    assert all(s > 0 for s in rel.samples_to_target)
    assert rel.relation[-1] == 1.0
    assert rel.extra["lr"] == tuple(scaled_lr(2e-3, b, 32) for b in (8, 16, 32))
    assert rel.extra["samples_per_seed"] == tuple((s,) for s in rel.samples_to_target)
    assert rel.extra["weights_sha256"] == "init:0" and len(rel.extra["cache_key"]) == 64
    # the file of docs/reference/files.md, and back
    rel.save(tmp_path / "relation.json")
    back = RelationVector.load(tmp_path / "relation.json")
    assert back.batch_sizes == rel.batch_sizes and back.relation == pytest.approx(rel.relation)
    # samples_to_target is what the training loop itself reports for that batch size and rate
    train, test = train_test_split(load_dataset("synthetic-image", split="all", limit=150))
    config = FineTuneConfig(
        batch_size=16,
        lr=scaled_lr(2e-3, 16, 32),
        target_accuracy=0.5,
        max_samples=3000,
        eval_every_samples=32,
    )
    direct = fine_tune(
        build_model("cnn-tiny", train.num_classes, seed=0),
        train,
        test,
        config,
        device=HostDevice(),
        callbacks=FineTuneCallbacks(progress=False),
    )
    assert direct.reached and rel.samples_map()[16] == direct.samples


def test_what_is_not_given_is_the_run_configs_default() -> None:
    """Called with the essentials only, the estimate is the one the ServerApp makes by default."""
    import dataclasses

    from strategies.settings import read_settings

    run = read_settings({})
    given = {f.name: f.default for f in dataclasses.fields(relmod.RelationSettings)}
    assert list(given["seeds"]) == run.relation_seeds and given["data_seed"] == run.proxy_seed
    assert (given["lr_max"], given["lr_rule"], given["vector"]) == (
        run.lr_max,
        run.lr_rule,
        run.relation_values,
    )
    assert given["max_samples"] == run.relation_max_samples and given["max_seeds"] is None
    assert (given["eval_every_samples"], given["eval_max_samples"]) == (
        run.eval_every_samples,
        run.eval_max_samples,
    )


def test_batch_size_that_misses_the_target_is_named(tmp_path: Path) -> None:
    with pytest.raises(RelationError) as err:
        flat_estimate(
            "cnn-tiny",
            None,
            "synthetic-image",
            target_accuracy=0.99,
            batch_sizes=[8, 16],
            lr_max=1e-6,
            cache_dir=tmp_path,
            **{**IMAGE, "max_samples": 64},
        )
    msg = str(err.value)
    assert "batch size 8 (seed 0" in msg and ", 16 (seed 0" in msg and "\n" not in msg
    assert "lower the target or raise the sample budget" in msg
    assert not list(tmp_path.iterdir()), "a failed estimate must not be cached"


def test_target_met_before_training_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RelationError, match=r"already reach target 0\.01"):
        flat_estimate(
            "cnn-tiny",
            None,
            "synthetic-image",
            target_accuracy=0.01,
            batch_sizes=[8],
            cache_dir=tmp_path,
            **IMAGE,
        )


def test_bad_inputs_fail_before_any_training(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        flat_estimate(
            "cnn-tiny", None, "npz:/no/such.npz", target_accuracy=0.5, batch_sizes=[8], cache_dir=tmp_path
        )
    with pytest.raises(ArgumentError, match="'batch_sizes' must be a non-empty list of distinct"):
        flat_estimate(
            "cnn-tiny", None, "synthetic-image", target_accuracy=0.5, batch_sizes=[8, 8], cache_dir=tmp_path
        )
    with pytest.raises(DataError, match="no such weights file"):
        flat_estimate(
            "cnn-tiny",
            tmp_path / "nope.safetensors",
            "synthetic-image",
            target_accuracy=0.5,
            batch_sizes=[8],
            cache_dir=tmp_path,
        )


# --------------------------------------------------------------------------- cache


class CountingFineTune:
    """Stands in for fine_tune in cache tests: counts the runs, returns a plausible result quickly."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(
        self, model: Any, train: Any, test: Any, config: FineTuneConfig, **kw: Any
    ) -> FineTuneResult:
        self.calls += 1
        b, target = config.batch_size, config.target_accuracy
        samples = config.eval_every_samples * (1 + 64 // b) + config.seed
        curve = [CurvePoint(0, 0.0, 0.0), CurvePoint(samples, 1.0, target)]
        return FineTuneResult(True, samples, 1.0, None, None, None, target, curve, b, config.lr, samples // b)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingFineTune:
    fake = CountingFineTune()
    monkeypatch.setattr(runsmod, "fine_tune", fake)
    return fake


@pytest.fixture
def text_setup(tmp_path: Path) -> dict[str, Any]:
    proxy = tmp_path / "proxy.txt"
    proxy.write_text("It is a truth universally acknowledged, that a single man.\n" * 60, encoding="utf-8")
    weights = tmp_path / "w.safetensors"
    save_weights(
        weights,
        build_model("chartransformer-small", seed=0),
        model_name="chartransformer-small",
        num_classes=96,
    )
    return {
        "model": "chartransformer-small",
        "weights": weights,
        "proxy": f"text:{proxy}",
        "target_accuracy": 0.5,
        "batch_sizes": (4, 8),
        "seeds": (0,),
        "lr_max": 1e-3,
        "max_samples": 1000,
        "eval_every_samples": 16,
        "eval_max_samples": 32,
        "seq_len": 16,
        "limit": None,
        "data_seed": 0,
        "cache_dir": tmp_path / "cache",
        "progress": False,
    }


def _other_weights(setup: dict[str, Any]) -> dict[str, Any]:
    path = Path(setup["weights"]).with_name("w1.safetensors")
    save_weights(
        path, build_model("chartransformer-small", seed=1), model_name="chartransformer-small", num_classes=96
    )
    return {"weights": path}


def _edited_proxy(setup: dict[str, Any]) -> dict[str, Any]:
    path = Path(setup["proxy"].partition(":")[2])
    path.write_text(path.read_text(encoding="utf-8") + "x", encoding="utf-8")  # same spec, other bytes
    return {}


def _moved_proxy(setup: dict[str, Any]) -> dict[str, Any]:
    src = Path(setup["proxy"].partition(":")[2])
    dst = src.with_name("copy.txt")
    dst.write_bytes(src.read_bytes())  # same bytes, other spec
    return {"proxy": f"text:{dst}"}


CHANGES = {
    "target": lambda s: {"target_accuracy": 0.55},
    "batch_sizes": lambda s: {"batch_sizes": (4, 8, 16)},
    "seeds": lambda s: {"seeds": (0, 1)},
    "lr_max": lambda s: {"lr_max": 2e-3},
    "lr_rule": lambda s: {"lr_rule": "linear"},
    "min_evaluations": lambda s: {"min_evaluations": 4},
    "max_seeds": lambda s: {"max_seeds": 3},
    "vector": lambda s: {"vector": "fitted"},
    "max_samples": lambda s: {"max_samples": 2000},
    "eval_every": lambda s: {"eval_every_samples": 32},
    "eval_max": lambda s: {"eval_max_samples": 64},
    "seq_len": lambda s: {"seq_len": 32},
    "limit": lambda s: {"limit": 40},
    "data_seed": lambda s: {"data_seed": 1},
    "weights": _other_weights,
    "no_weights": lambda s: {"weights": None},
    "proxy_bytes": _edited_proxy,
    "proxy_spec": _moved_proxy,
}


def test_cache_hit_is_instant_and_equal(text_setup: dict[str, Any], counting: CountingFineTune) -> None:
    first = flat_estimate(**text_setup)
    assert counting.calls == 2
    start = time.perf_counter()
    second = flat_estimate(**text_setup)
    assert time.perf_counter() - start < 0.5
    assert counting.calls == 2, "a cache hit must not train"
    assert second.to_dict() == first.to_dict()
    assert first.samples_to_target == (16 * 17, 16 * 9)  # what the runs returned, median over one seed


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_changing_any_input_misses(
    text_setup: dict[str, Any], counting: CountingFineTune, change: str
) -> None:
    flat_estimate(**text_setup)
    flat_estimate(**text_setup)
    assert counting.calls == 2
    changed = {**text_setup, **CHANGES[change](text_setup)}
    flat_estimate(**changed)
    assert counting.calls > 2, f"changing {change} must not hit the cache"


def test_a_name_registered_again_with_other_defaults_is_estimated_afresh(
    text_setup: dict[str, Any], counting: CountingFineTune
) -> None:
    """The cache key holds the registry entry's variant, not only its name (issue 36, class 2). A built-in
    name is never registered again, so the user's own name is: the project's model code under it."""
    from powerfed.training.models import get_model_spec, register_model, unregister_model

    spec = get_model_spec("chartransformer-small")
    entry = {"task": spec.task, "input_shape": spec.input_shape, "description": spec.description}
    name = "my-chartransformer"
    register_model(name, spec.builder, **entry, **spec.defaults)
    try:
        setup = {**text_setup, "model": name, "weights": None}  # a seeded fresh init: no weights file's hash
        flat_estimate(**setup)
        register_model(name, spec.builder, **entry, replace=True, **{**spec.defaults, "n_embd": 32})
        flat_estimate(**setup)
        assert counting.calls == 4, "the wider registration must not be served the narrower one's vector"
        register_model(name, spec.builder, **entry, replace=True, **spec.defaults)
        flat_estimate(**setup)
        assert counting.calls == 4, "the original registration again: its own cache entry"
    finally:
        unregister_model(name)


def test_corrupt_cache_entry_is_recomputed(text_setup: dict[str, Any], counting: CountingFineTune) -> None:
    flat_estimate(**text_setup)
    (entry,) = Path(text_setup["cache_dir"]).iterdir()
    entry.write_text("{not json", encoding="utf-8")
    rel = flat_estimate(**text_setup)
    assert counting.calls == 4 and RelationVector.load(entry).to_dict() == rel.to_dict()


def test_use_cache_false_neither_reads_nor_writes(
    text_setup: dict[str, Any], counting: CountingFineTune
) -> None:
    flat_estimate(**text_setup, use_cache=False)
    flat_estimate(**text_setup, use_cache=False)
    assert counting.calls == 4 and not Path(text_setup["cache_dir"]).exists()


def test_default_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from fl_server.relation.cache import lookup
    from fl_server.relation.request import RelationCompute, RelationRequest

    monkeypatch.setenv("POWERFED_CACHE", str(tmp_path / "c"))
    path, _ = lookup(RelationRequest(target_accuracy=0.5, batch_sizes=[4, 8]), RelationCompute(), False)
    assert path is not None and path.parent == tmp_path / "c" / "relation"


# --------------------------------------------------------------------------- parallel


# parallel equals serial, seed by seed, on the Ray estimate_relation starts itself:
# tests/test_user_model_relation.py (a registered model: the built-in models' code path)


class RecordingFineTune(CountingFineTune):
    """The counting fake that also records the learning rate and seed of every run."""

    def __init__(self, per_seed: dict[int, dict[int, int]] | None = None) -> None:
        super().__init__()
        self.lrs: dict[int, float] = {}
        self.per_seed = per_seed

    def __call__(
        self, model: Any, train: Any, test: Any, config: FineTuneConfig, **kw: Any
    ) -> FineTuneResult:
        self.lrs[config.batch_size] = config.lr
        if self.per_seed is None:
            return super().__call__(model, train, test, config, **kw)
        self.calls += 1
        b, target = config.batch_size, config.target_accuracy
        samples = self.per_seed[config.seed][b]
        # evaluated every 16 samples on a straight line to the target: ≥ 8 evaluations, no second run
        curve = [CurvePoint(s, 0.0, target * s / samples) for s in range(0, samples + 1, 16)]
        return FineTuneResult(True, samples, 1.0, None, None, None, target, curve, b, config.lr, samples // b)


@pytest.mark.parametrize("rule", ["sqrt", "linear", "constant"])
def test_lr_rule_reaches_every_run_and_the_file(
    text_setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch, rule: str
) -> None:
    fake = RecordingFineTune()
    monkeypatch.setattr(runsmod, "fine_tune", fake)
    rel = flat_estimate(**text_setup, lr_rule=rule)
    want = {b: scaled_lr(1e-3, b, 8, rule) for b in (4, 8)}
    assert fake.lrs == pytest.approx(want)
    assert rel.extra["lr_rule"] == rule and rel.extra["lr"] == pytest.approx([want[4], want[8]])


def test_unknown_lr_rule_is_one_line(text_setup: dict[str, Any], counting: CountingFineTune) -> None:
    # the run setting's own check (strategies.settings' lr-rule), naming the call
    with pytest.raises(
        ArgumentError, match="estimate_relation: 'lr_rule' must be one of sqrt, linear, constant"
    ):
        flat_estimate(**text_setup, lr_rule="cubic")
    assert counting.calls == 0


def test_server_passes_its_lr_rule(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import fl_server.app as app
    from fl_server.run_config import ServerConfig

    seen: dict[str, Any] = {}
    monkeypatch.setattr(relmod, "estimate_relation", lambda *a, **kw: seen.update(kw) or "vector")
    cfg = ServerConfig(lr_rule="linear", relation="")
    # no shipped vector looked for: it is keyed by the weights' tensors, and this test has no weights file
    assert app.relation_vector(cfg, tmp_path / "w.safetensors", shipped=False) == "vector"
    assert seen["settings"].lr_rule == "linear"


# samples to target per seed and batch size: seed 2 swaps the order of b=4 and b=8 that seeds 0-1 agree on
_SEEDS = {
    0: {4: 160, 8: 320},
    1: {4: 192, 8: 320},
    2: {4: 480, 8: 320},
    3: {4: 160, 8: 352},
    4: {4: 176, 8: 336},
}


def test_relation_file_keeps_per_seed_samples_mean_and_spread(
    text_setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(runsmod, "fine_tune", RecordingFineTune(_SEEDS))
    rel = flat_estimate(**{**text_setup, "seeds": (0, 1)})
    assert rel.extra["samples_per_seed"] == ((160.0, 192.0), (320.0, 320.0))
    assert rel.extra["samples_mean"] == (176.0, 320.0) == rel.samples_to_target
    assert rel.extra["samples_sd"] == pytest.approx([22.627417, 0.0])
    assert rel.extra["seeds_needed"] == 2 and rel.extra["ranking_stable"] is None
    again = RelationVector.load(Path(text_setup["cache_dir"]).glob("*.json").__next__())
    assert again.per_seed_samples() == rel.per_seed_samples()


def test_seeds_are_added_until_the_ranking_is_stable(
    text_setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = RecordingFineTune(_SEEDS)
    monkeypatch.setattr(runsmod, "fine_tune", fake)
    rel = flat_estimate(**{**text_setup, "seeds": (0, 1), "max_seeds": 5})
    # seeds 0-1: b=4 (mean 176) before b=8 (320); seed 2 lifts b=4 to 277, still first → stable at 3
    assert rel.extra["seeds_needed"] == 3 and rel.extra["ranking_stable"] is True
    assert fake.calls == 6


def test_seed_budget_ends_an_unstable_ranking(
    text_setup: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    flip = {0: {4: 100, 8: 320}, 1: {4: 600, 8: 320}, 2: {4: 100, 8: 320}, 3: {4: 900, 8: 320}}
    monkeypatch.setattr(runsmod, "fine_tune", RecordingFineTune(flip))
    rel = flat_estimate(**{**text_setup, "seeds": (0,), "max_seeds": 4})
    # means of b=4: 100 → 350 (after b=8's 320) → 266 → 425: the order flips at every added seed
    assert rel.extra["seeds_needed"] == 4 and rel.extra["ranking_stable"] is False


def test_old_relation_files_load_and_new_ones_carry_the_evidence(tmp_path: Path) -> None:
    old = RelationVector.from_samples("m", "p", 0.5, {4: 100.0, 8: 200.0})
    old.save(tmp_path / "old.json")
    loaded = RelationVector.load(tmp_path / "old.json")
    assert loaded.per_seed_samples() is None and loaded.seed_scenarios() == [{4: 100.0, 8: 200.0}]
    new = RelationVector.from_seeds("m", "p", 0.5, {4: [90.0, 110.0], 8: [150.0, 250.0]}, vector="fitted")
    new.save(tmp_path / "new.json")
    again = RelationVector.load(tmp_path / "new.json")
    assert again.seed_scenarios() == [{4: 90.0, 8: 150.0}, {4: 110.0, 8: 250.0}]
    assert again.extra["vector"] == "fitted" and again.extra["relation_raw"] == (0.5, 1.0)


def test_bad_per_seed_samples_are_one_line(tmp_path: Path) -> None:
    data = RelationVector.from_seeds("m", "p", 0.5, {4: [90.0, 110.0], 8: [150.0, 250.0]}).to_dict()
    for bad, why in (
        ([[1.0]], "one non-empty list per batch size"),
        ([[1.0], [-2.0]], r"must be a number in \(0, "),
    ):
        path = tmp_path / "bad.json"
        path.write_text(json.dumps({**data, "samples_per_seed": bad}))
        with pytest.raises(FileFormatError, match=why):
            RelationVector.load(path)


def test_batch_efficiency_fit_recovers_the_critical_batch_size() -> None:
    # samples(b) = 100 · (1 + b / 50), two seeds ± 5 % around it
    bs = [4, 8, 16, 32, 64, 128]
    exact = [100 * (1 + b / 50) for b in bs]
    fit = fit_batch_efficiency(bs, [[0.95 * s, 1.05 * s] for s in exact])
    assert fit.e_min == pytest.approx(100.0) and fit.b_crit == pytest.approx(50.0)
    assert fit.samples == pytest.approx(exact) and fit.explains
    # a U-shaped vector is not what the model can say: it does not explain it
    u_shape = fit_batch_efficiency(bs, [[s * 0.99, s * 1.01] for s in (600, 560, 350, 430, 650, 1000)])
    assert not u_shape.explains
    # samples that fall with b: slope held at 0 (b_crit infinite), the level weighted by relative error
    flat = fit_batch_efficiency([4, 8], [[200.0, 200.0], [100.0, 100.0]])
    assert flat.b_crit is None and flat.samples == pytest.approx([120.0, 120.0])  # 1/mean² weights


def test_the_printed_vector_states_each_entry_interval_from_its_seeds() -> None:
    from fl_server.app import relation_line

    seeds = RelationVector.from_seeds("m", "p", 0.5, {8: [900, 1000, 1100], 16: [1250] * 3, 64: [2000] * 3})
    # 8: 2 standard errors, 2 * 100 / sqrt(3) / 1000 = 12 %; entries whose seeds agree print no interval
    assert relation_line(seeds) == (
        "relation vector r_b (p, target 0.5; ± 2 standard errors of 3 seeds): "
        "8: 0.500 ±12%, 16: 0.625, 64: 1.000"
    )
    plain = RelationVector.from_samples("m", "p", 0.5, {8: 1.0, 16: 2.0})
    assert relation_line(plain) == "relation vector r_b (p, target 0.5): 8: 0.500, 16: 1.000"
