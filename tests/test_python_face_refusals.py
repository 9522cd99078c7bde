"""The Python face refuses at the call, in one line, what a receiver would refuse later (issue 36's
classes 1, 3 and 4): a plan every client would refuse, a relation vector selection cannot use, a
session argument or an evaluation the server would drop. Each is an ArgumentError, a ValueError."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.serverapp.strategy import FedAvg
from hypothesis import given, settings
from hypothesis import strategies as st

import powerfed
from fl_client.node import NodeSettings
from powerctl.errors import ArgumentError, PowerctlError
from powerctl.records.profile import Profile, ProfilePoint
from powerctl.records.relation import RelationVector
from powerctl.selection.joint import select
from strategies.protocol import TrainInstructions
from strategies.settings import BOTH, settings_of
from tests.relation_call import flat_estimate

REL = RelationVector.from_samples("cnn-tiny", "proxy", 0.5, {8: 300.0, 16: 400.0})
HOSTILE_NUMBERS = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, -1, 0, -0.5, 1e300, 10**18, True]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**12), 10**12),
)
NUMERIC_SETTINGS = sorted(s.attr for s in settings_of([BOTH]) if s.kind.python_type in (int, float))


def one_line(exc: BaseException, *fragments: str) -> None:
    text = str(exc)
    assert isinstance(exc, ValueError) and isinstance(exc, PowerctlError), type(exc)
    assert "\n" not in text and all(f in text for f in fragments), text


@settings(max_examples=300, deadline=None)
@given(attr=st.sampled_from(NUMERIC_SETTINGS), value=HOSTILE_NUMBERS)
def test_a_plan_that_is_made_is_a_plan_every_client_reads_back(attr: str, value: Any) -> None:
    try:
        plan = TrainInstructions.for_relation(REL, num_classes=10, **{attr: value})
    except ArgumentError as exc:
        one_line(exc, "TrainInstructions", repr(attr))
        return
    assert TrainInstructions.from_config(plan.to_config()) == plan  # the client's reader accepts it


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"num_classes": 0}, "'num_classes' must be an integer in [1, 2147483647], got 0"),
        ({"lr_max": math.nan}, "'lr_max' must be a number"),
        ({"method": "bogus"}, "'method' must be one of ours"),
        ({"lr_rule": "cubic"}, "'lr_rule' must be one of sqrt, linear, constant"),
        ({"profile_order": "random"}, "'profile_order' must be one of"),
        ({"budget_samples": -1}, "'budget_samples' must be an integer"),
        ({"power_cap_w": -3.0}, "'power_cap_w' must be a number of watts"),
        ({"model_overrides": {"width": math.nan}}, "'model_overrides' must be a dict of JSON option values"),
        ({"model_overrides": "width=8"}, "'model_overrides' must be a dict"),
        ({"server_round": 0}, "'server_round' must be an integer in [1, 100000]"),
    ],
)
def test_the_server_refuses_the_plans_its_clients_would_refuse(changes: dict, fragment: str) -> None:
    with pytest.raises(ArgumentError) as err:
        powerfed.PowerAware(FedAvg(), TrainInstructions.for_relation(REL, **{"num_classes": 10, **changes}))
    one_line(err.value, fragment)


def test_changing_a_made_plan_is_checked_the_same_way() -> None:
    plan = TrainInstructions.for_relation(REL, num_classes=10)
    with pytest.raises(ArgumentError, match="'deadline_s' must be a number of seconds ≥ 0"):
        dataclasses.replace(plan, deadline_s=-1.0)
    other = RelationVector.from_samples("resnet18", "proxy", 0.5, {8: 300.0, 16: 400.0})
    with pytest.raises(ArgumentError, match="is for model 'resnet18', the instructions for 'cnn-tiny'"):
        dataclasses.replace(plan, relation_vector=other)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"round_objective": "speed"}, "'round_objective' must be one of time"),
        ({"first_round": 0}, "'first_round' must be an integer ≥ 1"),
        ({"waits": 30.0}, "'waits' must be a NodeWaits, got float"),
    ],
)
def test_power_aware_refuses_its_own_arguments_in_one_line(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ArgumentError) as err:
        powerfed.PowerAware(FedAvg(), TrainInstructions.for_relation(REL, num_classes=10), **kwargs)
    one_line(err.value, "PowerAware", fragment)
    with pytest.raises(ArgumentError, match="'instructions' must be a TrainInstructions"):
        powerfed.PowerAware(FedAvg(), {"model": "cnn-tiny"})  # type: ignore[arg-type]
    with pytest.raises(ArgumentError) as err:
        powerfed.EnergyUnderDeadline(deadline_s=math.nan)
    one_line(err.value, "EnergyUnderDeadline", "'deadline_s' must be a number of seconds ≥ 0")


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"query_timeout_s": 0.0}, "'query_timeout_s' must be a number of seconds > 0"),
        ({"rejoin_wait_s": math.inf}, "'rejoin_wait_s' must be a number of seconds ≥ 0"),
        ({"min_available_nodes": -2}, "'min_available_nodes' must be an integer ≥ 0"),
        ({"min_available_nodes": 1.5}, "'min_available_nodes' must be an integer ≥ 0"),
    ],
)
def test_node_waits_refuse_their_bounds_in_one_line(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ArgumentError) as err:
        powerfed.NodeWaits(**kwargs)
    one_line(err.value, "NodeWaits", fragment)


def test_node_waits_keep_plain_numbers() -> None:
    waits = powerfed.NodeWaits(min_available_nodes=np.int64(3), rejoin_wait_s=np.float32(2.5))
    assert waits == powerfed.NodeWaits(min_available_nodes=3, rejoin_wait_s=2.5)
    assert type(waits.min_available_nodes) is int and type(waits.rejoin_wait_s) is float


@settings(max_examples=200, deadline=None)
@given(
    samples=st.lists(
        st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -1.0, math.nan])),
        min_size=2,
        max_size=2,
    ),
    target=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, 1.5, 0.0])),
)
def test_a_relation_vector_that_exists_is_one_selection_can_use(samples: list, target: float) -> None:
    try:
        rel = RelationVector("cnn-tiny", "proxy", target, [8, 16], samples)
    except ArgumentError as exc:
        one_line(exc, "RelationVector")
        return
    points = [
        ProfilePoint(b, f, 2.0 + f / 1e9, 1.5, 0.01 * b * 1e9 / f, 0.64e9 / f)
        for b in (8, 16)
        for f in (500_000_000, 900_000_000)
    ]
    chosen = select(Profile("sim:x", "cnn-tiny", [3, 32, 32], 64, points), rel, 10.0)
    assert math.isfinite(chosen.predicted_s) and chosen.predicted_s > 0


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: RelationVector("m", "p", 0.5, [16, 8], [1.0, 2.0]), "strictly increasing"),
        (lambda: RelationVector("m", "p", 0.5, [8, 16], [1.0]), "differ in length"),
        (lambda: RelationVector("m", "p", 0.5, [0, 8], [1.0, 2.0]), "'batch_sizes' must be an integer"),
        (lambda: RelationVector("m", "p", 0.5, [8], [1.0], extra=[]), "'extra' must be a dict"),
        (lambda: RelationVector.from_samples("m", "p", 0.5, {8: 1.0, 16: 0.0}), "'samples_to_target'"),
    ],
)
def test_a_relation_vector_is_checked_as_its_file_is(build: Any, fragment: str) -> None:
    with pytest.raises(ArgumentError) as err:
        build()
    one_line(err.value, "RelationVector", fragment)


def test_select_names_an_argument_of_the_wrong_type() -> None:
    with pytest.raises(ArgumentError, match="'relation' must be a RelationVector, got dict"):
        select(Profile("sim:x", "m", [1], 8, []), {8: 1.0}, None)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="'objective' must be one of time, energy, got 'fast'"):
        select(Profile("sim:x", "cnn-tiny", [1], 8, []), REL, None, objective="fast")


def _session(**changes: Any) -> powerfed.PowerSession:
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))

    def make_step(model: torch.nn.Module) -> Any:
        return lambda x, y: None

    args: dict[str, Any] = {
        "model": net,
        "make_step": make_step,
        "example": (torch.zeros(4, 4), torch.zeros(4, dtype=torch.long)),
        "train_examples": 64,
    }
    joined = {
        "node": NodeSettings("sim:jetson-nano", 3.0, None, 0, 1, "n0", None),
        "instructions": TrainInstructions.for_relation(REL, num_classes=2),
        "profile_cache": None,
    }
    joined.update({k: changes.pop(k) for k in list(changes) if k in joined})
    return powerfed.PowerSession(**{**args, "round_context": powerfed.RoundContext(**joined), **changes})


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"lr": math.nan}, "'lr' must be a number > 0"),
        ({"lr": -0.1}, "'lr' must be a number > 0"),
        ({"train_examples": 0}, "'train_examples' must be an integer in [1, 1000000000]"),
        ({"train_examples": 12.5}, "'train_examples' must be an integer in [1, 1000000000]"),
        ({"round_context": {"node": "n0"}}, "'round_context' must be a RoundContext, got dict"),
        ({"make_step": "step"}, "'make_step' must be callable"),
        ({"model": "cnn-tiny"}, "'model' must be a torch nn.Module"),
        ({"key": 3}, "'key' must be a string"),
    ],
)
def test_a_session_refuses_its_arguments_where_it_is_made(changes: dict, fragment: str) -> None:
    with pytest.raises(ArgumentError) as err:
        _session(**changes)
    one_line(err.value, "PowerSession", fragment)


def test_a_round_context_refuses_a_profile_cache_that_is_not_a_folder() -> None:
    with pytest.raises(ArgumentError) as err:
        _session(profile_cache=3)
    one_line(err.value, "RoundContext", "'profile_cache' must be a folder path")


def test_a_session_refuses_an_example_that_is_not_one_batch() -> None:
    with pytest.raises(powerfed.SessionError, match=r"'example' must be one batch \(inputs, targets\)"):
        _session(example=torch.zeros(4, 4))


@pytest.mark.parametrize(
    ("example", "fragment"),
    [
        ((torch.zeros(8, 3, 32, 32), torch.zeros(8, dtype=torch.long)), "inputs (3, 32, 32) a sample"),
        ((torch.zeros(8, 1, 16, 16), torch.zeros(8, 5, 7)), "targets (5, 7)"),
    ],
)
def test_a_session_refuses_an_example_its_model_cannot_take_where_it_is_made(
    tmp_path: Path, example: tuple, fragment: str
) -> None:
    """Issue 36, class 6: inputs of another shape (or targets the loss cannot take) are one line at
    construction, not a torch error from inside profiling — also when the profile is already cached
    (nothing is profiled then)."""
    good = _session(profile_cache=tmp_path)
    with good:
        good.step(lambda: None)  # profiled and cached
    with pytest.raises(powerfed.SessionError) as err:
        _session(profile_cache=tmp_path, example=example)
    text = str(err.value)
    assert "\n" not in text and text.startswith("PowerSession: the model and loss cannot take the example")
    assert fragment in text and text.endswith("give one batch of the loop's own data"), text


@pytest.mark.parametrize("accuracy", [math.nan, -1.0, math.inf, 1.5, 75.0, "abc", None])
def test_an_evaluation_the_server_would_drop_is_refused_when_it_is_recorded(accuracy: Any) -> None:
    session = _session()
    with pytest.raises(ArgumentError) as err:
        session.evaluated(accuracy)
    one_line(err.value, "PowerSession.evaluated", "'accuracy' must be a number in [0, 1]")
    assert session.accuracy is None and not session.reached
    assert session.evaluated(0.6) and session.accuracy == 0.6  # a real one still counts


def _profiler(**changes: Any) -> Any:
    from powerctl.devices import open_device
    from powerctl.records.workload import Workload

    args: dict[str, Any] = {
        "device": open_device("sim:jetson-nano"),
        "workload": Workload("toy", [3, 8, 8], 1e9, 1e4, 1e5),
        "make_step": lambda b: lambda: None,
        "samples": 256,
    }
    return powerfed.Profiler(**{**args, **changes})


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"samples": math.nan}, "'samples' must be an integer in [1, "),
        ({"samples": 0}, "'samples' must be an integer in [1, "),
        ({"measure_steps": 0}, "'measure_steps' must be an integer in [1, 1000]"),
        ({"warmup_steps": -1}, "'warmup_steps' must be an integer in [0, 1000]"),
        ({"rate_hz": math.inf}, "'rate_hz' must be a number of Hz"),
        ({"make_step": None}, "'make_step' must be callable"),
    ],
)
def test_the_profiler_refuses_its_arguments_where_it_is_made(changes: dict, fragment: str) -> None:
    with pytest.raises(ArgumentError) as err:
        _profiler(**changes)
    one_line(err.value, "Profiler", fragment)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"batch_sizes": [-8]}, "'batch_sizes' must be an integer ≥ 1, got -8"),
        ({"batch_sizes": [0, 8]}, "'batch_sizes' must be an integer ≥ 1, got 0"),
        ({"batch_sizes": []}, "'batch_sizes' must be a non-empty list"),
        ({"batch_sizes": [8], "frequencies": []}, "'frequencies' must be a non-empty list"),
        ({"batch_sizes": [8], "power_cap_w": math.nan}, "'power_cap_w'"),
    ],
)
def test_profiling_refuses_nonsense_before_it_measures_anything(kwargs: dict, fragment: str) -> None:
    profiler = _profiler()
    with pytest.raises(ArgumentError) as err:
        profiler.run(**kwargs, progress=False)
    one_line(err.value, "Profiler.run", fragment)


def test_a_step_builder_that_returns_no_step_is_named_not_profiled_as_empty() -> None:
    profiler = _profiler(make_step=lambda b: None)
    with pytest.raises(ArgumentError) as err:
        profiler.run([8], progress=False)
    one_line(err.value, "make_step(8) returned None")


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"limit": -1}, "'limit' must be an integer ≥ 1 or None, got -1"),
        ({"max_samples": math.nan}, "'max_samples' must be an integer in [1, 1000000000], got nan"),
        ({"seeds": "01"}, "'seeds' must be a list of integers ≥ 0 and ≤ 4294967295, got '01'"),
        ({"seeds": ["a"]}, "'seeds' must be an integer in [0, 4294967295], got 'a'"),
        ({"seeds": [2**64]}, "'seeds' must be an integer in [0, 4294967295]"),
        ({"data_seed": 2**70}, "'data_seed' must be an integer in [0, 4294967295]"),
        ({"overrides": "width=8"}, "'overrides' must be a dict of the model's options"),
        ({"target_accuracy": "0.5"}, "'target_accuracy' must be a number in (0, 1], got '0.5'"),
        ({"eval_every_samples": 0}, "'eval_every_samples' must be an integer in [1, 1000000000]"),
        ({"lr_max": math.inf}, "'lr_max' must be a number in (0, 10]"),
    ],
)
def test_estimate_relation_refuses_its_numbers_before_reading_data(changes: dict, fragment: str) -> None:
    args = {"target_accuracy": 0.2, "batch_sizes": [8, 16], "compute": False}
    with pytest.raises(ArgumentError) as err:
        flat_estimate("cnn-tiny", None, "synthetic-image", **{**args, **changes})
    one_line(err.value, "estimate_relation", fragment)


def test_a_metric_that_returns_no_accuracy_is_named_in_one_line(tmp_path: Any) -> None:
    def percent(outputs: torch.Tensor, targets: torch.Tensor) -> str:
        return "97%"

    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    with pytest.raises(ArgumentError) as err:
        flat_estimate(
            "cnn-tiny",
            None,
            (x, y),
            target_accuracy=0.5,
            batch_sizes=[8, 16],
            seeds=[0],
            metric=percent,
            max_samples=64,
            eval_every_samples=32,
            use_cache=False,
            progress=False,
        )
    one_line(err.value, "metric percent(outputs, targets) returned '97%'", "an accuracy in [0, 1]")


@pytest.mark.parametrize("name", ["a/b", "a\x00b", "line\nbreak", "", " padded", "x" * 101])
def test_a_model_name_that_cannot_name_a_file_is_refused(name: str) -> None:
    from powerfed.training.errors import ModelError

    with pytest.raises(ModelError, match="a model name must be 1-100 letters, digits and"):
        powerfed.register_model(name, torch.nn.Linear, input_shape=(4,), in_features=4, out_features=2)
    assert name not in powerfed.model_names()


def test_a_model_instance_is_not_a_factory() -> None:
    from powerfed.training.errors import ModelError

    with pytest.raises(ModelError, match=r"give the factory that builds the model .*the class Linear"):
        powerfed.register_model("an-instance", torch.nn.Linear(4, 2), input_shape=(4,))
    assert "an-instance" not in powerfed.model_names()
