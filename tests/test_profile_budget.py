"""Profiling that pays for itself (`powerctl.profiling.budget`): a client predicts its training from the
board's predicted profile and profiles only as thoroughly as that training pays for (the least way: the
prediction's choice, confirmed by the training's first steps); the round reports its choice."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from fl_client.round import RoundWork, run_round
from fl_server.run_config import RunConfigError, parse_server_config
from powerctl.devices.simulated import SimulatedBoard, predicted_profile
from powerctl.profiling.budget import (
    FITTED,
    PREDICTED,
    ProfilingRequest,
    confirmed_in_training,
    over_budget,
    profile_within_budget,
)
from powerctl.records.relation import RelationVector
from powerctl.selection.joint import select
from powerfed.training.models import build_model, model_workload
from strategies.report import ClientReport
from strategies.settings import SETTINGS
from tests.fl_helpers import initial_state, instructions
from tests.test_fl_client import _data

SIZES = [8, 16, 32, 64]


def _noop(batch_size: int) -> Callable[[], None]:
    return lambda: None


DEFAULT_SHARE = float(SETTINGS["profiling-budget"].default)


def _budgeted(samples_to_target: float, share: float, cap: float | None = 3.0, seed: int = 0):
    """ResNet18-small on a simulated Nano: the board charges the model's step, the step itself is a no-op."""
    workload = model_workload("resnet18-small", build_model("resnet18-small", seed=0))
    relation = RelationVector.from_samples(
        "resnet18-small", "synthetic-image", 0.7, {b: samples_to_target * (1 + b / 128) for b in SIZES}
    )
    n = round(relation.samples_to_target[-1])
    prediction = predicted_profile("jetson-nano", workload, SIZES, n)
    board = SimulatedBoard.open("jetson-nano", seed=seed)
    request = ProfilingRequest(
        order="efficient",
        order_cap_w=cap,
        batch_sizes=SIZES,
        samples=n,
        power_cap_w=cap,
        relation=relation,
        share=share,
        warmup_steps=1,
        measure_steps=2,
    )
    profile, plan = profile_within_budget(
        board, workload, _noop, request, prediction=prediction, predicted_from="the board model"
    )
    return profile, plan, relation


def test_a_short_task_profiles_less_and_a_long_one_the_whole_efficient_order() -> None:
    short, short_plan, rel = _budgeted(2_000, DEFAULT_SHARE)
    long, long_plan, long_rel = _budgeted(500_000, DEFAULT_SHARE)
    assert short_plan.choice == PREDICTED and long_plan.choice == "efficient"
    # the choice is the most thorough way within the budget, by the costs it predicted
    assert long_plan.costs_s["efficient"] <= long_plan.budget_s
    assert short_plan.costs_s["efficient"] > short_plan.costs_s[FITTED] > short_plan.budget_s
    assert short_plan.budget_s == pytest.approx(DEFAULT_SHARE * short_plan.predicted_training_s)
    # ... and what it spent is what it predicted for that way (the board is the model's, up to 1 % noise)
    assert long_plan.spent_s == pytest.approx(long_plan.costs_s["efficient"], rel=0.05)
    assert long.profiling_s == long_plan.spent_s and short.extra["budget"]["choice"] == PREDICTED
    # the predicted way measures nothing before training: its choice is confirmed by the first steps
    assert short_plan.spent_s == short.profiling_s == short_plan.costs_s[PREDICTED] == 0.0
    assert short_plan.points == 0 and confirmed_in_training(short) and not confirmed_in_training(long)
    sel = select(short, rel, 3.0)
    assert (sel.batch_size, sel.frequency_hz) == short_plan.reference  # the choice it predicted by
    # the efficient order ends at a pair measured under the cap
    sel = select(long, long_rel, 3.0)
    assert long.point(sel.batch_size, sel.frequency_hz).peak_power_w <= 3.0


def test_a_middle_task_takes_the_fitted_order_and_a_larger_budget_buys_more() -> None:
    _, plan, _ = _budgeted(50_000, 0.03)
    assert plan.choice == FITTED and plan.costs_s[FITTED] <= plan.budget_s < plan.costs_s["efficient"]
    _, generous, _ = _budgeted(50_000, 0.1)
    assert generous.choice == "efficient"


def test_a_round_reports_its_choice_prediction_budget_and_cost(tmp_path: Path) -> None:
    settings, data = _data(0)  # sim:jetson-nano at 3 W, 64 samples of cnn-tiny's task
    # short: the round's 64-sample budget is all the training predicted; long: no sample budget, the
    # relation's 5000 samples within DEFAULT_MAX_EPOCHS of its data (a target it does not reach)
    short_instr = instructions(profiling_budget=0.3)
    short = run_round(
        RoundWork(settings, short_instr, initial_state(), data, device_seed=1, profile_cache=tmp_path / "a")
    ).report
    assert short.profiling.profiling_choice == PREDICTED and short.profiling.profiling_predicted_from
    assert short.profiling.predicted_training_s and short.profiling.predicted_training_s > 0
    assert short.profiling.profiling_budget_s == pytest.approx(0.3 * short.profiling.predicted_training_s)
    assert set(short.profiling.profiling_costs_predicted) == {"efficient", FITTED, PREDICTED}
    assert short.profiling.profiling_s == short.profiling.profiling_costs_predicted[PREDICTED] == 0.0
    assert (
        short.profiling.profile_points == 0 and short.training.peak_power_w <= 3.0
    )  # its pair confirmed under the cap

    long_instr = instructions(
        profiling_budget=0.3,
        relation_samples=[5000.0, 6000.0],
        budget_samples=0,
        eval_every_samples=640,  # two evaluations: the choice, not the curve, is under test
    )
    long = run_round(
        RoundWork(settings, long_instr, initial_state(), data, device_seed=1, profile_cache=tmp_path / "b")
    ).report
    assert long.profiling.profiling_choice == "efficient"
    assert long.profiling.predicted_training_s > 10 * short.profiling.predicted_training_s
    assert long.profiling.profiling_s > 0 and long.profiling.profile_points > 1
    # the report travels (the message's config record) and reads back with every budget field
    back = ClientReport.from_config(long.to_config())
    assert back.profiling.profiling_choice == "efficient"
    assert back.profiling.profiling_costs_predicted == long.profiling.profiling_costs_predicted
    assert back.profiling.profiling_budget_s == long.profiling.profiling_budget_s
    assert (
        json.loads(json.dumps(long.profiling.profiling_costs_predicted))
        == long.profiling.profiling_costs_predicted
    )


@pytest.mark.parametrize("value", ["-0.1", "1.5", "lots"])
def test_a_bad_profiling_budget_is_one_line(value: str) -> None:
    with pytest.raises(RunConfigError) as err:
        parse_server_config({"profiling-budget": value})
    line = str(err.value)
    assert "profiling-budget" in line and "\n" not in line


def test_over_budget_says_why_or_nothing() -> None:
    costs = {"efficient": 0.4, FITTED: 0.15, PREDICTED: 0.02}
    assert over_budget(PREDICTED, costs, 0.05, 0.03, 5.0) is None  # within
    why = over_budget(PREDICTED, costs, 0.005, 0.024, 0.5)
    assert why is not None and "\n" not in why
    assert "over its 0.005 s budget" in why and "even the cheapest way, predicted (0.02 s predicted)" in why
    late = over_budget(FITTED, costs, 0.2, 0.3, 20.0)  # predicted to fit, measured more
    assert late is not None and "fitted was predicted to cost 0.15 s and cost more" in late
    blind = over_budget(FITTED, {"efficient": 1.2}, 0.001, 0.2, 0.1)  # a board with no prediction
    assert blind is not None and "no predicted profile of this kind of board" in blind and "fitted" in blind


def test_a_user_session_too_short_for_a_measured_profile_confirms_its_pair_in_its_own_steps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A user's loop (issue 37): 400 samples to the target at 1 % make a budget of a few milliseconds
    that no measured way of profiling fits; the predicted way costs nothing beside the loop's own steps,
    which confirm its pair under the cap: no profiling seconds, no over-budget line."""
    import types

    import powerfed
    from fl_client.node import NodeSettings
    from fl_server.results import over_budget_lines
    from tests.test_user_session import NAME, UserCNN, make_step, plan, user_data

    powerfed.register_model(NAME, UserCNN, input_shape=(1, 16, 16))
    try:
        node = NodeSettings("sim:jetson-nano", 3.0, None, 0, 1, "n0", None)
        net = UserCNN()
        x, y = user_data(n=64, seed=10)
        with caplog.at_level("WARNING", logger="fl_client.round"), powerfed.PowerSession(
            model=net, make_step=make_step, example=(x[:8], y[:8]), train_examples=64,
            round_context=powerfed.RoundContext(node, plan(budget_samples=64), tmp_path),
        ) as session:  # fmt: skip
            step = make_step(net)
            while not session.done:
                session.step(step, x[: session.batch_size], y[: session.batch_size])
    finally:
        powerfed.unregister_model(NAME)
    report = session.report
    assert report is not None and report.profiling.profiling_choice == PREDICTED
    assert report.profiling.profiling_s == 0.0 < report.profiling.profiling_budget_s
    assert min(report.profiling.profiling_costs_predicted.values()) == 0.0
    assert (
        report.training.steps >= 1 and report.training.peak_power_w <= 3.0
    )  # the pair predicted under the cap, read under it
    assert not [r for r in caplog.records if "over its" in r.getMessage()]
    assert over_budget_lines(types.SimpleNamespace(clients=[report.columns()])) == []
