"""A run's denser re-evaluation read from its weights after every step (`powerfed.training.trace`) is the
run trained again: the same crossing, samples, steps, accuracies and device seconds."""

from __future__ import annotations

import pytest

from fl_server.relation import ProxyRuns, run_to_target
from powerctl.devices.host import HostDevice
from powerfed.training.data import load_dataset, train_test_split
from powerfed.training.evaluation import eval_subset
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import FineTuneCallbacks, FineTuneConfig
from powerfed.training.models import build_model, get_model_spec
from powerfed.training.trace import StepTrace


@pytest.fixture(scope="module")
def runs() -> ProxyRuns:
    train, test = train_test_split(load_dataset("synthetic-image", split="all", limit=600, seed=3), seed=0)
    state = build_model("cnn-tiny", 10, seed=0).state_dict()
    return ProxyRuns(spec=get_model_spec("cnn-tiny"), num_classes=10, state=state, train=train, test=test)


def _config(batch_size: int, seed: int) -> FineTuneConfig:
    # a coarse interval: the target is crossed after fewer than 8 evaluations, so run_dense goes denser
    return FineTuneConfig(
        batch_size=batch_size, lr=2e-3, target_accuracy=0.6, max_samples=6000, eval_every_samples=256,
        eval_max_samples=128, seed=seed,
    )  # fmt: skip


def _trained_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(StepTrace, "replay", lambda *_a, **_k: None)


@pytest.mark.parametrize(
    ("batch_size", "seed", "read"),
    [(8, 0, True), (8, 1, False), (8, 2, True), (16, 1, True), (16, 3, True), (32, 2, True)],
)
def test_a_denser_run_read_from_the_trace_is_the_run_trained_again(
    runs: ProxyRuns, batch_size: int, seed: int, read: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a denser point at or before the first run's end reaches the target the denser run is read
    from the trace (no second training); where the denser run trains past it (b=8 seed 1), it trains.
    Either way it is what training again gives, to the float."""
    config = _config(batch_size, seed)
    result, crossing, every = run_to_target(runs, config)
    assert bool(result.extra.get("replayed")) is read
    _trained_again(monkeypatch)
    trained, crossing_again, every_again = run_to_target(runs, config)
    assert trained.extra.get("replayed") is None
    assert (crossing, every) == (crossing_again, every_again) and every < 256  # it went denser
    assert (result.samples, result.steps, result.reached, result.final_accuracy) == (
        trained.samples, trained.steps, trained.reached, trained.final_accuracy
    )  # fmt: skip
    assert [(p.samples, p.accuracy) for p in result.curve] == [(p.samples, p.accuracy) for p in trained.curve]
    assert result.stop_reason == trained.stop_reason == "target"


def test_a_trace_that_outgrew_its_memory_or_a_budget_in_the_way_replays_nothing(runs: ProxyRuns) -> None:
    config = _config(8, 0)
    x, y = eval_subset(runs.test, config.eval_max_samples)
    for max_bytes, budget in [(1, 4000), (1 << 29, 8)]:
        model = build_model("cnn-tiny", 10, seed=0)
        model.load_state_dict(runs.state)
        trace = StepTrace(model, max_bytes=max_bytes)
        first = fine_tune(
            model, runs.train, runs.test, config, device=HostDevice("cpu"),
            callbacks=FineTuneCallbacks(progress=False, hooks=(trace,)),
        )  # fmt: skip
        assert first.reached
        again = trace.replay(first, 8, eval_x=x, eval_y=y, task=runs.train.task, max_samples=budget)
        assert again is None
        assert trace.overflowed == (max_bytes == 1)
