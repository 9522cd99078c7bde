"""A held-out set of hostile inputs to the Python face (issue 36): a red-team pass at `6ce5604` tried 336
inputs the other tests do not (numpy scalars, 0-d tensors, huge seeds, links to system files, callbacks
that are not callable, ...); 49 were handled badly. Each fixed class keeps one input here, refused where
the call is made in one line of the project's own error type, nothing written or changed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.serverapp.strategy import FedAvg

import powerfed
from powerctl.errors import ArgumentError, FileFormatError, PowerctlError
from powerctl.files.jsonfile import read_json
from powerctl.records.relation import RelationVector
from powerctl.records.workload import Workload
from strategies.protocol import TrainInstructions
from tests.relation_call import flat_estimate

REL = RelationVector.from_samples("cnn-tiny", "proxy", 0.5, {8: 300.0, 16: 400.0})
PLAN = TrainInstructions.for_relation(REL, num_classes=10)


def one_line(exc: BaseException, *fragments: str) -> str:
    text = str(exc)
    assert "\n" not in text and isinstance(exc, PowerctlError), repr(exc)
    for fragment in fragments:
        assert fragment in text, text
    return text


# --- save_results: a file that is not a results file is never replaced ---------------------------------
def test_save_results_never_replaces_what_is_not_a_results_file_even_through_a_link(tmp_path: Path) -> None:
    strategy = powerfed.PowerAware(FedAvg(), PLAN)
    precious = tmp_path / "passwd"  # standing in for /etc/passwd, which a link run as root clobbered
    precious.write_text("root:x:0:0:root:/root:/bin/bash\n")
    link = tmp_path / "results.json"
    link.symlink_to(precious)
    with pytest.raises(PowerctlError) as err:
        powerfed.save_results(strategy, link)
    one_line(err.value, "is not a results file and is never replaced")
    assert precious.read_text() == "root:x:0:0:root:/root:/bin/bash\n" and link.is_symlink()
    if Path("/proc/version").exists():
        with pytest.raises(PowerctlError) as err:
            powerfed.save_results(strategy, "/proc/version")
        one_line(err.value, "/proc/version")
    ours = powerfed.save_results(strategy, tmp_path / "ours.json")
    again = powerfed.save_results(strategy, ours)  # a results file is replaced by the next one
    assert json.loads(again.read_text())["schema"] == "fl_server.results/2"
    with pytest.raises(ArgumentError) as err:
        powerfed.save_results(FedAvg(), tmp_path / "other.json")
    one_line(err.value, "'strategy' must be the PowerAware strategy that ran")
    assert not (tmp_path / "other.json").exists()


def test_a_json_file_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "relation.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(FileFormatError) as err:
        read_json(deep, "powerctl.relation/2")
    one_line(err.value, "nested too deeply")
    with pytest.raises(PowerctlError):
        RelationVector.load(deep)


# --- the relation vector: nothing infinite, NaN or empty reaches selection --------------------------
@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (
            lambda: RelationVector("m", "p", 0.5, [8, 16], [1.0, 1e-320]),
            "an entry over the last is outside [1e-9, 1e9]",
        ),
        (lambda: RelationVector.from_seeds("m", "p", 0.5, {8: [float("nan"), 1.0], 16: [2.0]}), "got nan"),
        (lambda: RelationVector.from_seeds("m", "p", 0.5, {8: [1e308, 1e308], 16: [1.0]}), "got 1e+308"),
        (lambda: RelationVector.from_seeds("m", "p", 0.5, {}), "'per_seed' must map each batch size"),
        (lambda: RelationVector.from_seeds("m", "p", 0.5, {8: 5.0}), "a list of one or more seeds"),
    ],
)
def test_a_relation_vector_that_would_select_nonsense_is_refused(make: Any, fragment: str) -> None:
    with pytest.raises(PowerctlError) as err:
        make()
    one_line(err.value, fragment)


def test_select_refuses_another_models_vector_and_a_point_without_a_time() -> None:
    from powerctl.records.profile import Profile, ProfilePoint
    from powerctl.selection.joint import select

    points = [ProfilePoint(8, 100, 2.0, 1.5, 0.1, 1.0), ProfilePoint(16, 100, 2.5, 2.0, 0.15, 0.8)]
    with pytest.raises(PowerctlError) as err:  # another model's vector ranks another task's batch sizes
        select(Profile("sim:jetson-nano", "resnet18", [3, 32, 32], 100, points), REL, 5.0)
    one_line(err.value, "the profile is of model 'resnet18', the relation vector of 'cnn-tiny'")
    for bad in (float("nan"), -5.0):  # refused where the point is made, before any selection
        with pytest.raises(ArgumentError) as err:
            ProfilePoint(16, 100, 2.5, 2.0, 0.15, bad)
        one_line(err.value, "ProfilePoint: 'seconds_for_samples' must be a number > 0")
    chosen = select(Profile("sim:jetson-nano", "cnn-tiny", [3, 32, 32], 100, points), REL, 5.0)
    assert (chosen.batch_size, chosen.frequency_hz) in {(8, 100), (16, 100)}
    other = Profile("sim:jetson-nano", "resnet18", [3, 32, 32], 100, points)
    assert select(other, REL, 5.0, allow_mismatch=True).batch_size in (8, 16)  # combined when told
    for fields, fragment in (
        ({"points": [{"batch_size": 8}]}, "'points' must be a list of ProfilePoint"),
        ({"input_shape": "abc"}, "'input_shape' must be a list of integers ≥ 1"),
        ({"samples": -1}, "'samples' must be an integer in [1, "),
    ):
        made = {
            "device": "sim:x",
            "model": "cnn-tiny",
            "input_shape": [3],
            "samples": 8,
            "points": [],
            **fields,
        }
        with pytest.raises(ArgumentError) as err:
            Profile(**made)
        one_line(err.value, fragment)


# --- the wrapper: what a round calls is checked when it is made --------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"on_round": "print"}, "'on_round' must be callable"),
        ({"on_round_end": 42}, "'on_round_end' must be callable"),
        ({"node_instructions": None}, "'node_instructions' must be callable"),
    ],
)
def test_power_aware_refuses_callbacks_that_are_not_callable(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ArgumentError) as err:
        powerfed.PowerAware(FedAvg(), PLAN, **kwargs)
    one_line(err.value, fragment)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"fraction_train": float("nan")}, "'fraction_train' must be a number in [0, 1]"),
        ({"fraction_evaluate": -1}, "'fraction_evaluate' must be a number in [0, 1]"),
        ({"min_train_nodes": "2"}, "'min_train_nodes' must be an integer ≥ 0"),
    ],
)
def test_power_aware_fedavg_refuses_what_fedavg_would_fail_on_mid_round(kwargs: dict, fragment: str) -> None:
    with pytest.raises(ArgumentError) as err:
        powerfed.PowerAwareFedAvg(instructions=PLAN, **kwargs)
    one_line(err.value, "PowerAwareFedAvg", fragment)


# --- the session, the registry, devices, the relation estimate ---------------------------------------
def _session(**changes: Any) -> powerfed.PowerSession:
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    args: dict[str, Any] = {
        "model": net,
        "make_step": lambda model: lambda x, y: None,
        "example": (torch.zeros(4, 4), torch.zeros(4, dtype=torch.long)),
        "train_examples": 64,
    }
    joined = {
        "node": powerfed.NodeSettings("sim:jetson-nano", 3.0, None, 0, 1, "n0", None),
        "instructions": TrainInstructions.for_relation(
            RelationVector.from_samples("held-out-net", "proxy", 0.5, {8: 300.0, 16: 400.0}), num_classes=2
        ),
        "profile_cache": None,
    }
    joined.update({k: changes.pop(k) for k in list(changes) if k in joined})
    return powerfed.PowerSession(**{**args, "round_context": powerfed.RoundContext(**joined), **changes})


@pytest.mark.parametrize(
    ("changes", "error", "fragment"),
    [
        ({"example": (torch.tensor(1.0), torch.tensor(1))}, PowerctlError, "'example' must be two tensors"),
        ({"instructions": {"model": "m"}}, ArgumentError, "'instructions' must be a TrainInstructions"),
        ({"node": {"device": "sim:jetson-nano"}}, ArgumentError, "'node' must be a NodeSettings"),
    ],
)
def test_a_session_refuses_held_out_arguments_where_it_is_made(
    changes: dict, error: type, fragment: str
) -> None:
    with pytest.raises(error) as err:
        _session(**changes)
    one_line(err.value, fragment)


def test_node_settings_made_in_python_hold_what_a_node_config_would() -> None:
    with pytest.raises(ArgumentError) as err:
        powerfed.NodeSettings("sim:jetson-nano", 3.0, None, 0, 1, 3, None)  # type: ignore[arg-type]
    one_line(err.value, "'key' must be a non-empty string, got 3")
    with pytest.raises(ArgumentError) as err:
        powerfed.NodeSettings("sim:jetson-nano", float("nan"), None, 0, 1, "n0", None)
    one_line(err.value, "'power_cap_w' must be a number of watts")


def test_a_step_given_a_0d_batch_is_one_line() -> None:
    session = _session()
    with pytest.raises(PowerctlError) as err, session:  # the session restores the board on the way out
        session.step(lambda x: None, torch.tensor(3.0))
    one_line(err.value, "the batch is a 0-d tensor")


def test_built_in_models_stay_registered() -> None:
    with pytest.raises(PowerctlError) as err:
        powerfed.unregister_model("cnn-tiny")
    one_line(err.value, "'cnn-tiny' is built in and stays registered")
    assert "cnn-tiny" in powerfed.model_names()


@pytest.mark.parametrize(
    ("call", "fragment"),
    [
        (lambda: powerfed.open_device(None), "'spec' must be a device spec string"),  # type: ignore[arg-type]
        (lambda: powerfed.open_device(Path("host")), "'spec' must be a device spec string"),  # type: ignore[arg-type]
        (
            lambda: powerfed.open_device("sim:jetson-nano", seed=-1),
            "'seed' must be an integer in [0, 4294967295]",
        ),
        (
            lambda: powerfed.Profiler("sim:jetson-nano", None, lambda b: None, samples=8),
            "'device' must be an open Device",
        ),  # type: ignore[arg-type]
    ],
)
def test_devices_and_the_profiler_refuse_what_is_not_one(call: Any, fragment: str) -> None:
    with pytest.raises(ArgumentError) as err:
        call()
    one_line(err.value, fragment)


# --- plans every client would refuse -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("relation", "kwargs", "fragment"),
    [
        (REL, {"num_classes": 10**9}, "would have 2,049,000,005,088 parameters"),
        (REL, {"num_classes": 10**30}, "'num_classes' must be an integer in [1, 2147483647]"),
        (REL, {"num_classes": 10, "model_overrides": {"bogus_kw": 1}}, "has no option bogus_kw"),
        (REL, {"num_classes": 10, "model_overrides": {1: 2}}, "'model_overrides' must be a dict of JSON"),
        (None, {"num_classes": 10}, "'relation' must be a RelationVector"),
    ],
)
def test_a_plan_every_client_would_refuse_is_refused_where_it_is_made(
    relation: Any, kwargs: dict, fragment: str
) -> None:
    with pytest.raises(ArgumentError) as err:
        TrainInstructions.for_relation(relation, **kwargs)
    one_line(err.value, fragment)
    assert TrainInstructions.for_relation(REL, num_classes=10, model_overrides={"width": 8}).model_overrides


# --- measuring a workload by hand --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("net", torch.zeros(2, 4), torch.zeros(2, dtype=torch.long)), "'model' must be a torch nn.Module"),
        ((None, torch.tensor(1.0), torch.tensor(1)), "'inputs' must be a batch tensor"),
        ((None, torch.zeros(0, 4), torch.zeros(0, dtype=torch.long)), "'inputs' must be a batch tensor"),
        ((None, torch.zeros(2, 5), torch.zeros(2, dtype=torch.long)), "cannot take the batch (inputs (2, 5)"),
    ],
)
def test_measure_workload_refuses_a_model_or_batch_it_cannot_count(args: tuple, fragment: str) -> None:
    net = torch.nn.Linear(4, 2)
    model, inputs, targets = args
    with pytest.raises(ArgumentError) as err:
        powerfed.measure_workload(
            net if model is None else model, inputs, targets, torch.nn.functional.cross_entropy, "x"
        )
    one_line(err.value, fragment)


def test_a_workload_made_by_hand_holds_what_a_counted_one_does() -> None:
    from powerctl.records.workload import Workload

    for bad in (
        {"flops_per_sample": float("nan")},
        {"activation_bytes_per_sample": -1e12},
        {"optimizer_states": -5},
    ):
        values = {"flops_per_sample": 1e6, "activation_bytes_per_sample": 1e3, "parameter_bytes": 1e4, **bad}
        with pytest.raises(ArgumentError) as err:
            Workload("m", (3, 32, 32), **values)
        one_line(err.value, f"'{next(iter(bad))}' must be")


# --- numpy scalars: taken where a number is, kept as plain Python numbers (issue 36, left over) -------
def test_numpy_scalars_are_numbers_and_what_is_kept_and_sent_is_plain(tmp_path: Path) -> None:
    """`np.int64(10)` and `np.float32(0.5)` are what numpy arithmetic gives a user: taken where an int or
    a float is, kept as int and float (a ConfigRecord refuses numpy's); numpy's bool is still no number."""
    plan = TrainInstructions.for_relation(
        REL, num_classes=np.int64(10), lr_max=np.float32(0.05), budget_samples=np.int64(500)
    )
    assert (type(plan.num_classes), type(plan.lr_max), type(plan.budget_samples)) == (int, float, int)
    assert plan.lr_max == float(np.float32(0.05))
    assert TrainInstructions.from_config(plan.to_config()) == plan  # a ConfigRecord took it
    with pytest.raises(ArgumentError) as err:
        TrainInstructions.for_relation(REL, num_classes=np.bool_(True))
    one_line(err.value, "'num_classes' must be an integer in [1, 2147483647], got np.True_")

    session = _session(train_examples=np.int64(64), lr=np.float32(0.01), profile_cache=tmp_path)
    with session:
        session.step(lambda x, y: None, torch.zeros(4, 4), torch.zeros(4, dtype=torch.long))
    assert session.report is not None and type(session.report.train_examples) is int
    assert session.report.training.lr == float(np.float32(0.01))
    session.report.to_config()

    profiler = powerfed.Profiler(
        powerfed.open_device("sim:jetson-nano", seed=np.uint32(3)),
        _linear_workload(),
        lambda b: lambda: None,
        samples=np.int64(256),
        measure_steps=np.int32(2),
        rate_hz=np.float32(50.0),
    )
    assert (type(profiler.samples), type(profiler.measure_steps), type(profiler.rate_hz)) == (int, int, float)
    hz = int(max(profiler.device.frequencies()))
    profile = profiler.run(
        [np.int64(8)], frequencies=[np.int64(hz)], power_cap_w=np.float32(50.0), progress=False
    )
    assert [(type(p.batch_size), type(p.frequency_hz)) for p in profile.points] == [(int, int)]
    json.dumps(profile.to_dict())  # a profile file holds it

    seen: list[tuple[Any, ...]] = []

    def train_to_target(batch_size: int, lr: float, seed: int) -> float:
        seen.append((type(batch_size), type(lr), type(seed)))
        return 100.0 * batch_size**0.5

    rel = flat_estimate(
        "held-out-loop",
        target_accuracy=np.float32(0.5),
        batch_sizes=[np.int64(8), np.int64(16)],
        seeds=[np.int64(0)],
        lr_max=np.float32(0.01),
        train_to_target=train_to_target,
        use_cache=False,
        progress=False,
    )
    assert set(seen) == {(int, float, int)}
    assert type(rel.target_accuracy) is float and [type(b) for b in rel.batch_sizes] == [int, int]
    json.dumps(rel.to_dict())


# --- a model on the meta device, a relation that is not one, a built-in name, an empty cache path -----
def test_a_model_on_the_meta_device_is_refused_where_it_is_given() -> None:
    with torch.device("meta"):
        net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    x, y = torch.zeros(4, 4), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ArgumentError) as err:
        powerfed.measure_workload(net, x, y, torch.nn.functional.cross_entropy, "x")  # what Profiler takes
    one_line(
        err.value, "measure_workload: 'model' has parameters on the meta device (not materialized): 1.weight"
    )
    with pytest.raises(ArgumentError) as err:
        _session(model=net)
    one_line(err.value, "PowerSession: 'model' has parameters on the meta device (not materialized)")


def test_the_fitted_order_takes_a_relation_vector_and_refuses_what_is_not_one() -> None:
    profiler = powerfed.Profiler(
        powerfed.open_device("sim:jetson-nano"),
        _linear_workload(),
        lambda b: lambda: None,
        samples=256,
        measure_steps=1,
        warmup_steps=0,
    )
    for bad in ("x", {8: "fast"}, [0.5, 1.0]):
        with pytest.raises(ArgumentError) as err:
            profiler.run([8, 16], order="fitted", relation=bad, progress=False)
        one_line(err.value, "Profiler.run: 'relation' must be a RelationVector")
    assert profiler.run([8, 16], order="fitted", relation=REL, progress=False).points


def test_a_built_in_model_is_never_registered_again() -> None:
    from powerfed.training.models import get_model_spec

    before = get_model_spec("cnn-tiny")
    for replace in (True, False):
        with pytest.raises(PowerctlError) as err:
            powerfed.register_model(
                "cnn-tiny", torch.nn.Linear, input_shape=(4,), replace=replace, in_features=4
            )
        one_line(
            err.value,
            "model 'cnn-tiny' is built in and stays as it is",
            "register yours under a name of its own",
        )
    assert get_model_spec("cnn-tiny") is before


def test_an_empty_profile_cache_is_not_a_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # Path('') is here: nothing may be cached in it
    with pytest.raises(ArgumentError) as err:
        _session(profile_cache="")
    one_line(err.value, "RoundContext: 'profile_cache' must be a folder path", "got ''")
    assert not list(tmp_path.iterdir())


# --- left-overs: an empty cache folder, the profiler's order, margin and cap, a numpy input shape ------
def _linear_workload() -> Workload:
    """A one-layer model's workload: what a Profiler needs besides its device."""
    return powerfed.measure_workload(
        torch.nn.Linear(4, 2),
        torch.zeros(2, 4),
        torch.zeros(2, dtype=torch.long),
        torch.nn.functional.cross_entropy,
        "x",
    )


def _profiler() -> powerfed.Profiler:
    return powerfed.Profiler(
        powerfed.open_device("sim:jetson-nano"),
        _linear_workload(),
        lambda b: lambda: None,
        samples=256,
        measure_steps=1,
    )


def test_an_empty_relation_cache_dir_is_not_the_default_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # Path('') is here: nothing may be cached in it
    monkeypatch.setenv("POWERFED_CACHE", str(tmp_path / "default"))
    args: dict[str, Any] = {
        "target_accuracy": 0.5,
        "batch_sizes": [8, 16],
        "seeds": [0],
        "train_to_target": lambda batch_size, lr, seed: 100.0 * batch_size**0.5,
        "cache_key": "held-out-loop/1",
        "progress": False,
    }
    for bad in ("", 3):
        with pytest.raises(ArgumentError) as err:
            flat_estimate("held-out-loop", cache_dir=bad, **args)
        one_line(err.value, "estimate_relation: 'cache_dir' must be a folder path", f"got {bad!r}")
    assert not list(tmp_path.iterdir())
    rel = flat_estimate("held-out-loop", cache_dir=None, **args)  # None: the default cache
    assert rel.batch_sizes == (8, 16) and list((tmp_path / "default").rglob("relation-*.json"))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"order": "fast"}, "Profiler.run: 'order' must be one of grid, efficient, fitted, got 'fast'"),
        ({"margin": float("nan")}, "Profiler.run: 'margin' must be a number ≥ 0, got nan"),
        ({"margin": -0.1}, "Profiler.run: 'margin' must be a number ≥ 0, got -0.1"),
        ({"margin": "10%"}, "Profiler.run: 'margin' must be a number ≥ 0, got '10%'"),
        ({"order": "efficient"}, "Profiler.run: 'power_cap_w' must be a number of watts for the efficient"),
        ({"power_cap_w": "none"}, "Profiler.run: 'power_cap_w' must be a number of watts > 0"),
        ({"power_cap_w": "5"}, "or None, got '5'"),
        ({"power_cap_w": ""}, "Profiler.run: 'power_cap_w' must be a number of watts > 0"),
    ],
)
def test_profiler_run_names_itself_the_argument_and_what_is_allowed(kwargs: dict, fragment: str) -> None:
    profiler = _profiler()
    with pytest.raises(ArgumentError) as err:
        profiler.run([8], progress=False, **kwargs)
    one_line(err.value, fragment)
    assert isinstance(err.value, ValueError)  # `except ValueError` still catches it


def test_profiler_run_takes_a_cap_as_a_number_and_the_command_line_still_reads_none() -> None:
    from powerctl.cli.util import power_cap

    hz = max(_profiler().device.frequencies())
    for cap, kept in ((None, None), (np.float32(50.0), 50.0), (5, 5.0)):
        profile = _profiler().run(
            [8], frequencies=[hz], power_cap_w=cap, margin=np.float64(0.2), progress=False
        )
        assert profile.extra["power_cap_w"] == kept and type(profile.extra["power_cap_w"]) is type(kept)
    assert power_cap("none") is None and power_cap("3.5") == 3.5  # `--power-cap none`: no cap


def test_a_numpy_input_shape_is_taken_and_kept_as_plain_ints() -> None:
    from powerctl.records.profile import Profile
    from powerfed.training.models import get_model_spec

    profile = Profile("sim:x", "cnn-tiny", [np.int64(3), np.int32(32), np.uint16(32)], 8, [])
    assert profile.input_shape == (3, 32, 32) and {type(d) for d in profile.input_shape} == {int}
    json.dumps(profile.to_dict())
    with pytest.raises(ArgumentError) as err:
        Profile("sim:x", "cnn-tiny", [np.True_, 4], 8, [])
    one_line(err.value, "Profile: 'input_shape' must be a list of integers ≥ 1")
    spec = powerfed.register_model(
        "held-out-numpy-shape", torch.nn.Linear, input_shape=(np.int64(4),), in_features=4, out_features=2
    )
    try:
        assert spec.input_shape == (4,) and type(spec.input_shape[0]) is int
        assert get_model_spec("held-out-numpy-shape").input_shape == (4,)
        with pytest.raises(PowerctlError) as err:
            powerfed.register_model("held-out-bool-shape", torch.nn.Linear, input_shape=(np.True_,))
        one_line(err.value, "input_shape must be one sample's shape in positive integers")
    finally:
        powerfed.unregister_model("held-out-numpy-shape")


@pytest.mark.parametrize("cap", ["none", "5", ""])
def test_a_plans_cap_is_a_number_of_watts_not_text(cap: str) -> None:
    """A file or a command line may write no cap as "none"; a Python caller writes None."""
    with pytest.raises(ArgumentError) as err:
        dataclasses.replace(PLAN, power_cap_w=cap)
    one_line(err.value, "'power_cap_w'")
    assert dataclasses.replace(PLAN, power_cap_w=np.float32(4.5)).to_config()["power-cap-w"] == 4.5


# --- records a user builds by hand: every field checked where it is made (one input per class) --------
def _node(**fields: Any) -> Any:
    base = {"device": "sim:jetson-nano", "power_cap_w": 3.0, "data": None, "partition_id": 0}
    return powerfed.NodeSettings(**{**base, "num_partitions": 1, "key": "n0", **fields})


def _point(**fields: Any) -> Any:
    from powerctl.records.profile import ProfilePoint

    base = {"batch_size": 8, "frequency_hz": 76_800_000, "peak_power_w": 4.0, "mean_power_w": 3.0}
    return ProfilePoint(**{**base, "seconds_per_batch": 0.1, "seconds_for_samples": 2.0, **fields})


@pytest.mark.parametrize(
    ("make", "fragment"),
    [  # a flag that is not a bool was read as true: the board pinned when told not to
        (
            lambda: powerfed.open_device("sim:jetson-nano", pin="false"),
            "open_device: 'pin' must be true or false",
        ),
        (lambda: _node(pin=np.False_), "NodeSettings: 'pin' must be true or false"),
        # a point that selection would pick: a negative peak
        (lambda: _point(peak_power_w=-10.0), "ProfilePoint: 'peak_power_w' must be a number in (0, 100000]"),
        # a relation file's batch size of 10**400: the plan's lr at b=8 was 0.0
        (
            lambda: RelationVector.from_samples("m", "p", 0.5, {8: 1.0, 10**400: 2.0}),
            "'batch_sizes' must be an integer in [1, 65536]",
        ),
        (
            lambda: RelationVector.from_samples("m", "p", 0.5, {8: 1.0}, samples_per_seed=[[1e13]]),
            "'samples_per_seed' must be a number in (0, 1000000000000]",
        ),
        # an extra key named like a field replaced it in to_dict: the client trained at other sizes
        (
            lambda: RelationVector("m", "p", 0.5, [8], [1.0], {"batch_sizes": [4096]}),
            "'extra' key 'batch_sizes'",
        ),
        # the empty path by another spelling: cached in the working folder
        (lambda: powerfed.RoundContext(_node(), PLAN, Path("")), "'profile_cache' must be a folder path"),
        # hangs: ten to the ninth warm-up steps, a pause that polls every 1e-300 s
        (lambda: _profiler_with(warmup_steps=10**9), "'warmup_steps' must be an integer in [0, 1000]"),
        (lambda: dataclasses.replace(PLAN, cap_poll_s=1e-300), "'cap_poll_s' must be a number of seconds in"),
        # text no file or message can hold
        (lambda: _node(key="\ud800"), "NodeSettings: 'key' must be a non-empty string that UTF-8 can write"),
    ],
)
def test_a_record_made_by_hand_is_checked_field_by_field(
    make: Any, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # Path('') is here: nothing may be written in it
    with pytest.raises(ArgumentError) as err:
        make()
    one_line(err.value, fragment)
    assert not list(tmp_path.iterdir())


def _profiler_with(**changes: Any) -> powerfed.Profiler:
    return powerfed.Profiler(
        powerfed.open_device("sim:jetson-nano"),
        _linear_workload(),
        lambda b: lambda: None,
        **{"samples": 256, "measure_steps": 1, **changes},
    )


def test_a_relation_vector_holds_plain_values_and_cannot_change_behind_a_plan(tmp_path: Path) -> None:
    rel = RelationVector.from_samples("cnn-tiny", "proxy", np.float32(0.5), {8: np.float32(300.0), 16: 400.0})
    plan = TrainInstructions.for_relation(rel, num_classes=10)
    rel.save(tmp_path / "rel.json")  # np.float32 broke to_dict, save and save_results
    with pytest.raises(TypeError):
        rel.samples_to_target[0] = -1  # type: ignore[index]
    assert plan.relation_vector.relation == [0.75, 1.0]


# --- sessions, the batch-size-only mode, callbacks, deep errors (issue 55, part B; one input per class) --
def test_a_session_entered_a_second_time_is_one_line_and_adds_nothing() -> None:
    session = _session()
    with session:
        session.step(lambda x, y: None, torch.zeros(session.batch_size, 4), None)
    with pytest.raises(powerfed.SessionError) as err, session:
        session.step(lambda x, y: None, torch.zeros(8, 4), None)
    one_line(err.value, "PowerSession: entered a second time")
    assert session.steps == 1 and session.report is not None and session.report.training.steps == 1


def test_pin_false_with_the_default_plan_trains_at_the_clock_in_force(tmp_path: Path) -> None:
    plan = TrainInstructions.for_relation(
        RelationVector.from_samples("held-out-net", "proxy", 0.5, {8: 300.0, 16: 400.0}),
        num_classes=2,
        method="state-of-practice",
    )
    session = _session(node=_node(pin=False), instructions=plan, profile_cache=tmp_path)
    with session:  # was: "not pinned (the operator's pin = false) ... not 307.2 MHz"
        while session.samples < 64:
            session.step(lambda x, y: None, torch.zeros(session.batch_size, 4), None)
    assert session.report is not None and session.report.pinned is False
    assert session.report.frequency_hz == 921_600_000  # the simulated Nano's clock in force


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (
            lambda: powerfed.PowerAware(FedAvg(), PLAN, node_instructions=lambda node, plan: plan),
            "PowerAware: 'node_instructions' must take (node, server_round, instructions)",
        ),
        (
            lambda: powerfed.PowerAware(
                FedAvg(), PLAN, node_instructions=lambda n, r, p: None
            ).instructions_for(0, 1),
            "PowerAware: node_instructions(node, server_round, instructions) returned None",
        ),
        (lambda: _session(make_step=lambda: None), "PowerSession: 'make_step' must take (model)"),
    ],
)
def test_a_callback_is_checked_where_it_is_given_and_its_result_where_it_returns(
    make: Any, fragment: str
) -> None:
    with pytest.raises(ArgumentError) as err:
        make()
    one_line(err.value, fragment)


@pytest.mark.parametrize(
    ("make", "fragment"),
    [  # each failed deep: in Flower's serialisation, AttributeError at `with`, RecursionError in the Mod
        (
            lambda: dataclasses.replace(PLAN, server_round=10**30),
            "'server_round' must be an integer in [1, 100000]",
        ),
        (lambda: _session(train_examples=10**30), "'train_examples' must be an integer in [1, 1000000000]"),
        (lambda: _node(cap_source=5), "NodeSettings: 'cap_source' must be a CapSource"),
        (
            lambda: TrainInstructions.from_config(
                {**PLAN.to_config(), "relation-vector": "[" * 100_000 + "]" * 100_000}
            ),
            "'relation-vector' must be a JSON object nested less deeply",
        ),
    ],
)
def test_values_that_failed_deep_are_one_line_at_the_call(make: Any, fragment: str) -> None:
    with pytest.raises(PowerctlError) as err:
        make()
    one_line(err.value, fragment)


def test_a_method_name_is_kept_as_the_client_reads_it() -> None:
    plan = dataclasses.replace(PLAN, method="state-of-practice ")  # was refused only at `with`
    assert plan.method == "state-of-practice" and plan.to_config()["method"] == "state-of-practice"
