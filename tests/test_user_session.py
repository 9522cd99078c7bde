"""A user's own model, data, loop and ClientApp, power-aware through the public face (issue 27): the
relation vector estimated on the server for the user's model, the user's own step profiled, a pair
selected under each node's cap, the user's loop trained through `PowerSession`, the report back through
`power_aware_mod` into `PowerAware`'s round and `results.json`; the board restored on every way out."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import powerfed
from fl_client.node import NodeSettings
from powerctl.records.relation import RelationVector
from strategies.protocol import TrainInstructions
from tests.fake_boards import NANO_DEVFREQ, make_nano_tree, tree_snapshot
from tests.fake_grid import FakeGrid
from tests.relation_call import flat_estimate
from tests.test_user_model_relation import SETTINGS, UserCNN, user_data

NAME = "session-user-cnn"
FLEET = "sim:jetson-nano@3.0, sim:jetson-tx2nx@3.5"


def make_step(net: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """The user's own training step: SGD with momentum, their choice, not the project's."""
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()

    return step


def accuracy(net: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((net(x).argmax(1) == y).float().mean())


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    powerfed.register_model(NAME, UserCNN, input_shape=(1, 16, 16))
    try:
        yield
    finally:
        powerfed.unregister_model(NAME)
        torch.set_num_threads(threads)


def plan(relation: RelationVector | None = None, **changes: Any) -> TrainInstructions:
    rel = relation or RelationVector.from_samples(NAME, "tensors", 0.75, {8: 400.0, 16: 480.0, 32: 640.0})
    base = {
        "model": NAME,
        "num_classes": 4,
        "model_overrides": {},
        "target_accuracy": rel.target_accuracy,
        "relation_vector": rel,
        "lr_max": 0.05,
        "budget_samples": 2000,
        "profile_samples": 256,
        "profile_warmup": 0,
        "profile_steps": 1,
    }
    return TrainInstructions(**{**base, **changes})


def user_train(msg: Message, context: Context) -> Message:
    """The user's train function: their model, their data, their loop, in one PowerSession."""
    net = UserCNN()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    pid = int(context.node_config["partition-id"])
    x, y = user_data(n=320, seed=10 + pid)
    test_x, test_y = user_data(n=128, seed=20 + pid)
    trainset = TensorDataset(x, y)
    with powerfed.PowerSession(
        model=net, make_step=make_step, example=(x[:8], y[:8]), train_examples=len(trainset)
    ) as session:
        loader = DataLoader(trainset, batch_size=session.batch_size, shuffle=True, drop_last=True)
        step = make_step(net)
        while not session.done:
            for xb, yb in loader:
                session.step(step, xb, yb)
                if session.samples % 64 < session.batch_size and session.evaluated(
                    accuracy(net, test_x, test_y)
                ):
                    break
        session.evaluated(accuracy(net, test_x, test_y))
    content = RecordDict(
        {
            "arrays": ArrayRecord.from_torch_state_dict(net.state_dict()),
            "metrics": MetricRecord({"num-examples": len(trainset)}),
        }
    )
    return Message(content, reply_to=msg)


def user_app(train: Callable[[Message, Context], Message] = user_train) -> ClientApp:
    app = ClientApp(mods=[powerfed.power_aware_mod])
    app.train()(train)
    app.query()(powerfed.describe_node)
    return app


def _nodes(n: int) -> dict[int, dict[str, Any]]:
    return {100 + i: {"partition-id": i, "num-partitions": n} for i in range(n)}


def test_a_users_model_goes_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POWERFED_CACHE", str(tmp_path / "cache"))
    relation = flat_estimate(NAME, None, user_data(), **SETTINGS, cache_dir=tmp_path / "rel")
    assert relation.model == NAME and relation.batch_sizes == (8, 16, 32)
    assert relation.extra["model_fingerprint"]["class"].endswith(".UserCNN")  # what the session checks
    strategy = powerfed.PowerAware(
        FedAvg(min_train_nodes=2, min_evaluate_nodes=0, min_available_nodes=2, fraction_evaluate=0.0),
        plan(relation),
    )
    grid = FakeGrid(user_app(), _nodes(2), {"fleet": FLEET})
    start = ArrayRecord.from_torch_state_dict(UserCNN().state_dict())
    strategy.start(grid, start, 1, 60)
    clients = {c["node_key"]: c for c in strategy.rounds[1].clients}
    assert sorted(clients) == ["partition-0", "partition-1"]
    for key, board in (("partition-0", "jetson-nano"), ("partition-1", "jetson-tx2nx")):
        c = clients[key]
        assert c["board"] == board and c["method"] == "ours"
        assert c["batch_size"] in relation.batch_sizes and c["frequency_hz"] > 0
        assert c["device_s"] > 0 and c["energy_j"] > 0 and c["samples"] > 0
        # the cap held: what the profile predicted for the pair, and what the board drew
        assert (
            0 < c["profiled_peak_power_w"] <= c["power_cap_w"]
            and c["peak_power_w"] <= 1.05 * c["power_cap_w"]
        )
        # a task this short: the predicted way, its pair confirmed by the loop's own first steps
        assert c["profiling_choice"] == "predicted" and c["profiling_s"] == 0.0 and not c["profile_cached"]
        assert c["train_examples"] == 320  # the session's train_examples, not 0 (issue 37)
    out = powerfed.save_results(strategy, tmp_path / "results.json")
    written = json.loads(out.read_text())
    assert written["run"]["relation"]["model"] == NAME  # the plan sent is in the file
    rows = written["rounds"][0]["clients"]
    assert {r["node_key"]: (r["batch_size"], r["frequency_hz"]) for r in rows} == {
        k: (c["batch_size"], c["frequency_hz"]) for k, c in clients.items()
    }
    # round 2 of the same step finds its profile cached: no profiling charged
    strategy.start(FakeGrid(user_app(), _nodes(2), {"fleet": FLEET}), start, 1, 60)
    assert all(c["profile_cached"] and c["profiling_s"] == 0 for c in strategy.rounds[1].clients)


def _node(device: str = "sim:jetson-nano", cap: float | None = 3.0) -> NodeSettings:
    return NodeSettings(device, cap, None, 0, 1, "n0", None)


def _session(**kw: Any) -> powerfed.PowerSession:
    x, y = user_data(n=64)
    args: dict[str, Any] = {
        "model": UserCNN(),
        "make_step": make_step,
        "example": (x[:8], y[:8]),
        "train_examples": 64,
    }
    joined = powerfed.RoundContext(
        kw.pop("node", _node()), kw.pop("instructions", plan()), kw.pop("profile_cache", None)
    )
    return powerfed.PowerSession(**{**args, "round_context": joined, **kw})


def test_the_profile_is_of_the_users_step_and_changes_with_it(tmp_path: Path) -> None:
    with _session(profile_cache=tmp_path) as first:
        first.step(lambda: None)
    with _session(profile_cache=tmp_path) as again:
        again.step(lambda: None)

    def adam_step(net: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], None]:
        opt = torch.optim.Adam(net.parameters())

        def step(x: torch.Tensor, y: torch.Tensor) -> None:
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()

        return step

    with _session(profile_cache=tmp_path, make_step=adam_step) as other:
        other.step(lambda: None)
    assert first.profiled is not None and not first.profiled.cached
    assert again.profiled is not None and again.profiled.cached  # the same step: cached
    assert other.profiled is not None and not other.profiled.cached  # another step: profiled again
    assert tuple(first.profiled.profile.input_shape) == (1, 16, 16)


def test_a_loop_that_runs_no_step_through_it_on_a_simulated_board_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(powerfed.SessionError, match="ran no training step"), _session(profile_cache=tmp_path):
        pass


def _handlers() -> list[Any]:
    return [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)]


def test_a_session_enters_once_and_leaves_the_signal_handlers_as_found(tmp_path: Path) -> None:
    before = _handlers()
    session = _session(profile_cache=tmp_path)
    with session:
        session.step(lambda: None)
    report = session.report
    assert report is not None and report.training.steps == 1 and _handlers() == before
    with pytest.raises(powerfed.SessionError) as err, session:  # a second block would add to the first
        session.step(lambda: None)
    assert "\n" not in str(err.value) and "entered a second time" in str(err.value)
    assert session.report is report and session.steps == 1 and _handlers() == before

    inside = _session(profile_cache=tmp_path)
    with pytest.raises(powerfed.SessionError) as err, inside:
        inside.step(lambda: None)
        with inside:
            inside.step(lambda: None)
    assert "\n" not in str(err.value) and "inside its own `with` block" in str(err.value)
    assert inside.steps == 1 and inside.report is None and _handlers() == before


def test_a_session_whose_entering_failed_may_be_entered_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entering that fails before the block runs (here its profiling) trains nothing and leaves the
    device as found: the same session enters when tried again, not "entered a second time"."""
    import fl_client.session as session_module

    real = session_module.measured_profile_step
    calls: list[int] = []

    def fails_once(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("the profile cache's disk went away")
        return real(*args, **kwargs)

    monkeypatch.setattr(session_module, "measured_profile_step", fails_once)
    before = _handlers()
    session = _session(profile_cache=tmp_path)
    with pytest.raises(OSError, match="went away"), session:
        session.step(lambda: None)
    assert session.steps == 0 and _handlers() == before
    with session:
        session.step(lambda: None)
    assert session.report is not None and session.report.training.steps == 1 and _handlers() == before


@pytest.mark.parametrize("fail", [False, True])
def test_a_jetson_is_pinned_while_the_loop_trains_and_left_as_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail: bool
) -> None:
    root = make_nano_tree(tmp_path / "nano")
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(root))
    before = tree_snapshot(root)
    devfreq = root / NANO_DEVFREQ
    seen: list[tuple[str, str]] = []
    x, y = user_data(n=64)
    net = UserCNN()
    with (
        pytest.raises(KeyboardInterrupt) if fail else _nothing(),
        _session(
            model=net,
            node=_node("jetson", 10.0),
            profile_cache=tmp_path,
            instructions=plan(budget_samples=32),
        ) as s,
    ):
        step = make_step(net)
        s.step(step, x[: s.batch_size], y[: s.batch_size])
        seen.append(((devfreq / "min_freq").read_text().strip(), (devfreq / "max_freq").read_text().strip()))
        if fail:
            raise KeyboardInterrupt  # Ctrl-C in the user's loop
    assert seen and seen[0][0] == seen[0][1]  # pinned while the loop ran
    assert tree_snapshot(root) == before
    if not fail:
        assert (
            s.report is not None
            and s.report.frequency_hz == int(seen[0][0])
            and s.report.training.samples > 0
        )


class _nothing:
    def __enter__(self) -> None: ...
    def __exit__(self, *_: Any) -> None: ...


def test_a_train_function_that_opens_no_session_is_an_error_reply_of_one_line() -> None:
    def forgot(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}), reply_to=msg)

    grid = FakeGrid(user_app(forgot), _nodes(1), {"fleet": FLEET})
    strategy = powerfed.PowerAware(
        FedAvg(min_train_nodes=1, min_available_nodes=1, fraction_evaluate=0.0), plan()
    )
    with pytest.raises(powerfed.NoClientReported) as err:  # the only client failed: no result
        strategy.start(grid, ArrayRecord.from_torch_state_dict(UserCNN().state_dict()), 1, 60)
    (failure,) = strategy.rounds[1].failed
    assert "opened no PowerSession" in failure.reason and "\n" not in failure.reason
    assert str(err.value).startswith(
        "every client failed in every round (1 round): partition-0 (error) failed"
    )
    assert "opened no PowerSession" in str(err.value)


def test_without_a_round_to_join_the_session_says_how_to_get_one() -> None:
    x, y = user_data(n=16)
    with pytest.raises(powerfed.SessionError, match="power_aware_mod"):
        powerfed.PowerSession(model=UserCNN(), make_step=make_step, example=(x, y), train_examples=16)


def test_the_config_it_joins_is_the_plan_the_wrapper_sent() -> None:
    sent = plan().to_config()
    assert TrainInstructions.from_config(ConfigRecord(dict(sent))).model == NAME


def test_a_cap_that_changes_is_followed_in_the_users_loop(tmp_path: Path) -> None:
    from powerctl.selection.capsource import ScheduleCap

    caps = ScheduleCap.from_pairs([[0, None], [0.05, 2.2]])  # uncapped, then 2.2 W after 0.05 device s
    x, y = user_data(n=512)
    net = UserCNN()
    node = NodeSettings("sim:jetson-nano", None, None, 0, 1, "n0", caps)
    with _session(
        model=net,
        node=node,
        profile_cache=tmp_path,
        instructions=plan(budget_samples=1500),
        train_examples=512,
    ) as s:
        step, first = make_step(net), 0
        while not s.done:
            b = s.batch_size  # read again every step: the follower may change it
            first = 0 if first + b > len(x) else first
            s.step(step, x[first : first + b], y[first : first + b])
            first += b
    r = s.report
    assert r is not None and [e["kind"] for e in r.cap.cap_events][:2] == ["start", "switch"]
    assert r.cap.final_pair is not None and r.cap.final_pair[1] < r.frequency_hz  # stepped down under 2.2 W
    assert r.cap.over_cap_s == 0.0 and r.training.samples >= 1500


@pytest.mark.parametrize("own_loop", [False, True])
def test_a_node_that_may_not_pin_trains_at_the_clock_in_force_and_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, own_loop: bool
) -> None:
    from fl_client.node import resolve_node
    from fl_client.round import RoundWork, run_round
    from tests.fl_helpers import RUN_CONFIG, initial_state, instructions
    from tests.test_fl_client import _data

    root = make_nano_tree(tmp_path / "nano")
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(root))
    before = tree_snapshot(root)
    in_force = int(before[f"{NANO_DEVFREQ}/max_freq"])  # the governor's ceiling: the clock under load
    config = {"device": "jetson", "power-cap-w": 10.0, "pin": False, "partition-id": 0, "num-partitions": 3}
    node = resolve_node(config, RUN_CONFIG)
    if own_loop:
        x, y = user_data(n=64)
        net = UserCNN()
        with _session(
            model=net, node=node, profile_cache=tmp_path, instructions=plan(budget_samples=32)
        ) as s:
            step = make_step(net)
            s.step(step, x[: s.batch_size], y[: s.batch_size])
        report = s.report
    else:
        instr = instructions(relation_batch_sizes=[8], relation_samples=[300.0], budget_samples=16)
        report = run_round(
            RoundWork(node, instr, initial_state(), _data(0)[1], profile_cache=tmp_path)
        ).report
    assert report is not None and not report.pinned and report.frequency_hz == in_force
    assert tree_snapshot(root) == before  # nothing written, not even a pin at the same clock


def test_a_plan_whose_model_is_not_its_vectors_is_refused_on_the_server() -> None:
    rel = RelationVector.from_samples("other-model", "tensors", 0.75, {8: 400.0, 16: 480.0})
    with pytest.raises(ValueError, match="for_relation"):
        powerfed.PowerAware(FedAvg(), plan(rel))
    assert powerfed.TrainInstructions.for_relation(rel, num_classes=4).model == "other-model"


def test_a_plan_from_a_vector_trains_by_the_vectors_learning_rate_rule() -> None:
    rel = RelationVector.from_samples(
        "cnn-tiny", "tensors", 0.75, {8: 400.0, 16: 480.0}, lr_max=0.05, lr_rule="constant"
    )
    plan = powerfed.TrainInstructions.for_relation(rel, num_classes=4)
    assert (plan.lr_max, plan.lr_rule, plan.lr_for(8)) == (0.05, "constant", 0.05)  # not 0.002 and sqrt
    given = powerfed.TrainInstructions.for_relation(rel, num_classes=4, lr_max=0.01, lr_rule="sqrt")
    assert (given.lr_max, given.lr_rule) == (0.01, "sqrt")  # what the caller says wins
    bare = RelationVector.from_samples("cnn-tiny", "tensors", 0.75, {8: 400.0, 16: 480.0})
    assert powerfed.TrainInstructions.for_relation(bare, num_classes=4).lr_rule == "sqrt"  # the default


def test_an_nvml_gpu_is_locked_while_the_loop_trains_and_reset_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from powerctl.devices.nvml import NvmlGpu
    from tests.fake_boards import FakeGpu, fake_pynvml

    mod = fake_pynvml([FakeGpu()])
    monkeypatch.setitem(sys.modules, "pynvml", mod)
    monkeypatch.setattr(NvmlGpu, "torch_device", lambda self: "cpu")  # no CUDA here: the loop on the CPU
    x, y = user_data(n=64)
    net = UserCNN()
    locked_during: list[int] = []
    with _session(
        model=net, node=_node("nvml:0", 300.0), profile_cache=tmp_path, instructions=plan(budget_samples=32)
    ) as s:
        step = make_step(net)
        s.step(step, x[: s.batch_size], y[: s.batch_size])
        locked_during.extend(c[2] for c in mod.calls if c[0] == "nvmlDeviceSetGpuLockedClocks")
    r = s.report
    assert r is not None and r.board and r.pinned and r.frequency_hz // 1_000_000 == locked_during[-1]
    calls = [c[0] for c in mod.calls]
    assert calls.index("nvmlDeviceResetGpuLockedClocks", calls.index("nvmlDeviceSetGpuLockedClocks")) > 0
    assert calls[-1] != "nvmlDeviceSetGpuLockedClocks"  # reset after the last lock
    last_lock = max(i for i, c in enumerate(calls) if c == "nvmlDeviceSetGpuLockedClocks")
    assert "nvmlDeviceResetGpuLockedClocks" in calls[last_lock:]


def test_a_plan_whose_vector_is_of_another_model_is_refused_in_one_line(tmp_path: Path) -> None:
    """Issue 37, item 4: the vector records the model it was estimated for (class, parameter shapes)."""
    from powerfed.training.models import model_fingerprint

    def vector_for(net: nn.Module) -> RelationVector:
        samples = {8: 400.0, 16: 480.0, 32: 640.0}
        return RelationVector.from_samples(
            NAME, "tensors", 0.75, samples, model_fingerprint=model_fingerprint(net)
        )

    class UserGRU(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gru, self.head = nn.GRU(16, 8, batch_first=True), nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.gru(x.flatten(1, 2))[0][:, -1])

    with pytest.raises(powerfed.SessionError) as err:
        _session(model=UserGRU(), instructions=plan(vector_for(UserCNN())), profile_cache=tmp_path)
    text = str(err.value)
    assert "\n" not in text and "the plan is for another model" in text and ".UserCNN with" in text, text
    assert ".UserGRU with" in text
    with _session(instructions=plan(vector_for(UserCNN())), profile_cache=tmp_path) as same:  # its own model
        same.step(lambda: None)
    assert same.profiled is not None


def test_a_step_behind_a_lambda_is_profiled_again_when_the_step_it_calls_changes(tmp_path: Path) -> None:
    """A FedProx loop passes lr and mu in: `make_step=lambda m: build(m, lr, mu)`. Editing `build` (here:
    another optimizer) is another step, though the lambda's line is the same (issue 37, item 2)."""
    from tests.test_step_identity import user_module

    def session(module: dict) -> powerfed.PowerSession:
        return _session(make_step=lambda m: module["make_step"](m, 0.05, 0.01), profile_cache=tmp_path)

    with session(user_module()) as first:
        first.step(lambda: None)
    with session(user_module()) as again:
        again.step(lambda: None)
    with session(user_module(optimizer="Adam")) as edited:
        edited.step(lambda: None)
    assert first.profiled is not None and not first.profiled.cached
    assert again.profiled is not None and again.profiled.cached
    assert edited.profiled is not None and not edited.profiled.cached


def _double_step(net: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """Two forward/backward passes a step (e.g. a sharpness-aware update): twice one pass's work."""
    opt = torch.optim.SGD(net.parameters(), lr=0.05)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        F.cross_entropy(net(x), y).backward()
        opt.step()

    return step


def test_the_profile_charges_the_steps_own_work_and_the_first_step_is_checked_against_it(
    tmp_path: Path,
) -> None:
    """Issue 37, item 3: the workload is the step's (two passes: twice the FLOPs), and a loop that runs
    another step than the one make_step returned is one line at its first step, not a wrong charge."""
    x, y = user_data(n=64)
    with _session(make_step=_double_step, profile_cache=tmp_path) as double:
        double.step(_double_step(UserCNN()), x[:8], y[:8])
    with _session(profile_cache=tmp_path / "single") as single:
        single.step(make_step(UserCNN()), x[:8], y[:8])
    assert double._workload is not None and single._workload is not None
    ratio = double._workload.flops_per_sample / single._workload.flops_per_sample
    assert 1.9 < ratio < 2.1, ratio
    with pytest.raises(powerfed.SessionError) as err, _session(profile_cache=tmp_path / "single") as other:
        other.step(_double_step(UserCNN()), x[:8], y[:8])  # profiled: one pass; runs: two
    text = str(err.value)
    assert "\n" not in text and "make_step(model) must return the step the loop runs" in text, text


def test_a_loop_that_steps_outside_the_session_is_told_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    x, y = user_data(n=64)
    net = UserCNN()
    step = make_step(net)
    with (
        caplog.at_level("WARNING", logger="fl_client.session"),
        _session(model=net, profile_cache=tmp_path) as session,
    ):
        for i in range(0, 64, 8):
            if i < 32:
                session.step(step, x[i : i + 8], y[i : i + 8])
            else:
                step(x[i : i + 8], y[i : i + 8])  # outside the session: not charged
    warnings = [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING" and r.name == "fl_client.session"
    ]
    assert len(warnings) == 1 and "after 32 samples through session.step" in warnings[0], warnings
    assert "fewer than one pass over its 64 training examples" in warnings[0]
    assert session.report is not None and session.report.training.samples == 32


def test_the_workload_counts_the_optimizers_real_state(tmp_path: Path) -> None:
    """Issue 37, item 5: the memory a simulated board charges holds the step's optimizer's state, not
    Adam's always: SGD with momentum keeps one copy of the parameters, plain SGD none, Adam two."""

    def with_optimizer(make_opt: Callable[[Any], torch.optim.Optimizer]) -> Callable[[nn.Module], Any]:
        def build(net: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], None]:
            opt = make_opt(net.parameters())

            def step(x: torch.Tensor, y: torch.Tensor) -> None:
                opt.zero_grad()
                F.cross_entropy(net(x), y).backward()
                opt.step()

            return step

        return build

    states = {}
    for name, make_opt in {
        "momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
        "plain": lambda p: torch.optim.SGD(p, lr=0.05),
        "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    }.items():
        with _session(make_step=with_optimizer(make_opt), profile_cache=tmp_path / name) as session:
            session.step(lambda: None)
        assert session._workload is not None
        states[name] = session._workload.optimizer_states
    assert states == {"momentum": 1, "plain": 0, "adam": 2}


@pytest.mark.parametrize("extra_s", [0.0, 0.25])
def test_on_a_real_board_the_loops_step_time_is_checked_against_the_profiled_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra_s: float
) -> None:
    """Issue 37, item 3, on a board (a fake Jetson's sysfs; the step runs on this CPU): steps 2-4 are
    timed against the profile at the pair in force. The step profiled, run as is, trains on; the same
    step with 250 ms of other work (its FLOPs unchanged, so the first-step check cannot see it: some 50
    times the step) is one line at the fourth step, and the board is left as found. The tolerance is
    20x here, not the default 2x: this CPU is shared with the suite's other worker and its end-to-end
    runs (a step measured 4x its profile under that load), a board's GPU is not."""
    monkeypatch.setattr("fl_client.session.STEP_TIME_TOLERANCE", 20.0)
    # this small CNN's step can be under the floor below which a board's step is not timed (on a fast
    # CPU it is): time it whatever its length, as a board's longer step is
    monkeypatch.setattr("fl_client.session.MIN_TIMED_STEP_S", 0.0)
    root = make_nano_tree(tmp_path / "nano")
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(root))
    before = tree_snapshot(root)
    net = UserCNN()
    x, y = user_data(n=64)
    step = make_step(net)

    def loop_step(xb: torch.Tensor, yb: torch.Tensor) -> None:
        step(xb, yb)
        time.sleep(extra_s)  # e.g. a copy to the host and back inside the step

    steady = plan(budget_samples=0, profile_warmup=1, profile_steps=3)  # a profile of warm steps
    session = _session(model=net, node=_node("jetson", 10.0), profile_cache=tmp_path, instructions=steady)
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(pytest.raises(powerfed.SessionError)) if extra_s else None
        s = stack.enter_context(session)
        for _ in range(6):
            s.step(loop_step, x[: s.batch_size], y[: s.batch_size])
    assert tree_snapshot(root) == before
    if err is not None:
        text = str(err.value)
        assert "\n" not in text and "make_step(model) must return the step the loop runs" in text, text
        assert session.steps == 3 and session.report is None  # the fourth step's time decided
    else:
        assert session.report is not None and session.report.training.steps == 6
