"""Caps that change while training (issue 7): the follower re-selects, pauses, and reports every change."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fl_client.local_data import data_plan, load_local_data
from fl_client.node import resolve_node
from fl_client.round import RoundWork, run_round
from powerctl.devices import open_device
from powerctl.devices.simulated import SimulatedBoard
from powerctl.errors import InfeasibleCapError
from powerctl.records.pick import Pick
from powerctl.selection.capsource import ConstantCap, ScheduleCap
from powerctl.selection.follow import CapFollower, CapPauseTimeout
from powerfed.training.data import Dataset
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import FineTuneCallbacks, FineTuneConfig
from powerfed.training.models import build_model
from strategies.protocol import ProtocolError
from strategies.report import CAP_EVENT, ClientReport
from tests.fake_boards import NANO_DEVFREQ, make_nano_tree, tree_snapshot
from tests.fl_helpers import RUN_CONFIG, initial_state, instructions

# cnn-tiny on the synthetic task reaches 50 % in a few hundred samples: a run long enough for 4 changes
INSTR = instructions(budget_samples=4096, cap_poll_s=0.02, target_accuracy=0.5, eval_every_samples=64)


@pytest.fixture(scope="module")
def uncapped_nano() -> tuple:
    settings = resolve_node({"partition-id": 2, "num-partitions": 3}, RUN_CONFIG)  # sim:jetson-nano, no cap
    return settings, load_local_data(data_plan(settings, RUN_CONFIG, 512))


def _static_run(uncapped_nano: tuple) -> ClientReport:
    settings, data = uncapped_nano
    return run_round(
        RoundWork(dataclasses.replace(settings, power_cap_w=4.0), INSTR, initial_state(), data, device_seed=1)
    ).report


def test_a_falling_and_rising_cap_is_followed_to_the_target(uncapped_nano: tuple) -> None:
    settings, data = uncapped_nano
    static = _static_run(uncapped_nano)
    length_s, step_s = static.training.device_s, static.training.device_s / static.training.steps
    changes = [0.25 * length_s, 0.45 * length_s, 0.6 * length_s]
    caps = ScheduleCap.from_pairs([[0, 4.0], [changes[0], 2.3], [changes[1], 1.0], [changes[2], 5.0]])
    report = run_round(
        RoundWork(dataclasses.replace(settings, cap_source=caps), INSTR, initial_state(), data, device_seed=1)
    ).report
    assert report.training.reached_target and report.training.stop_reason == "target"
    kinds = [e["kind"] for e in report.cap.cap_events]
    assert kinds == ["start", "switch", "pause", "resume"]
    start, switch, pause, resume = report.cap.cap_events
    # every event names the cap in force and happens within one step of the change that caused it
    for event, change in zip((switch, pause), changes[:2], strict=True):
        assert event["power_cap_w"] == caps.cap_at(event["t_s"])
        assert change <= event["t_s"] <= change + 1.5 * step_s
    assert resume["t_s"] >= changes[2] and resume["power_cap_w"] == 5.0
    # the drop to 2.3 W lowers the frequency; the dip to 1 W (below anything) pauses at the lowest one
    assert switch["old_frequency_hz"] == start["new_frequency_hz"] > switch["new_frequency_hz"]
    assert pause["new_frequency_hz"] == min(SimulatedBoard.open("jetson-nano").frequencies())
    assert report.cap.paused_s >= changes[2] - pause["t_s"] - 1e-9
    # never over the cap for more than the step in progress when it drops; the new pair stays under
    # it (× the guard's noise tolerance); a cap below the board's idle power is over it while paused,
    # and the report says so
    assert all(e["in_step_over_cap_s"] <= 1.5 * step_s for e in report.cap.cap_events)
    assert pause["in_step_over_cap_s"] > 0 and switch["over_cap_s"] == resume["over_cap_s"] == 0
    assert pause["over_cap_s"] == pytest.approx(report.cap.paused_s)
    assert report.cap.over_cap_s == pytest.approx(
        sum(e["in_step_over_cap_s"] + e["over_cap_s"] for e in report.cap.cap_events)
    )
    assert 0 < switch["fraction_done"] < pause["fraction_done"] <= resume["fraction_done"] < 1
    assert (report.batch_size, report.frequency_hz) == (start["new_batch_size"], start["new_frequency_hz"])
    # the report survives the wire
    assert ClientReport.from_config(report.to_config()).cap == report.cap


def test_a_seeded_run_under_a_schedule_repeats_exactly(uncapped_nano: tuple) -> None:
    settings, data = uncapped_nano
    caps = ScheduleCap.from_pairs([[0, 4.0], [0.05, 2.3], [0.1, 4.5]])
    runs = [
        run_round(
            RoundWork(
                dataclasses.replace(settings, cap_source=caps), INSTR, initial_state(), data, device_seed=3
            )
        )
        for _ in range(2)
    ]
    (s1, r1), (s2, r2) = [(run.trained.state, run.report) for run in runs]
    assert r1.cap.cap_events == r2.cap.cap_events and len(r1.cap.cap_events) >= 2
    assert (r1.training.device_s, r1.training.energy_j, r1.training.samples) == (
        r2.training.device_s,
        r2.training.energy_j,
        r2.training.samples,
    )
    assert all(torch.equal(s1[k], s2[k]) for k in s1)


def test_a_cap_that_never_rises_again_times_out_in_one_line(uncapped_nano: tuple) -> None:
    settings, data = uncapped_nano
    caps = ScheduleCap.from_pairs([[0, 4.0], [0.02, 0.5]])
    instr = dataclasses.replace(INSTR, cap_pause_timeout_s=0.1)
    with pytest.raises(CapPauseTimeout) as err:
        run_round(RoundWork(dataclasses.replace(settings, cap_source=caps), instr, initial_state(), data))
    assert "no (batch size, frequency) pair fits under the cap (0.5 W)" in str(err.value)
    assert "\n" not in str(err.value)


def _small_task() -> tuple[Dataset, Dataset]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (256,), generator=g)
    return Dataset("rand", "image", x, y, 10), Dataset("rand-test", "image", x[:64], y[:64], 10)


def test_a_batch_size_switch_keeps_the_optimizer_state_and_rescales_the_rate() -> None:
    train, test = _small_task()
    model = build_model("cnn-tiny", 10, seed=0)
    made: list[torch.optim.Optimizer] = []

    def adam(params, lr):  # type: ignore[no-untyped-def]
        made.append(torch.optim.Adam(params, lr=lr))
        return made[-1]

    dev = SimulatedBoard.open("jetson-nano", noise=False)
    step_s = dev.predict(_workload(model), 8).seconds
    caps = ScheduleCap.from_pairs([[0, None], [3.5 * step_s, 3.0]])
    lr_for = {8: 1e-3 * (8 / 16) ** 0.5, 16: 1e-3}.__getitem__
    # a made-up rule: batch size 16 without a cap, 8 under one (at the top frequency either way)
    top = dev.frequencies()[-1]
    follower = CapFollower(dev, caps, lambda cap: Pick(16 if cap is None else 8, top))
    with dev.pinned(top):
        first = follower.start()
        config = FineTuneConfig(
            batch_size=first.batch_size,
            lr=lr_for,
            target_accuracy=None,
            max_samples=16 * 4 + 8 * 4,
            eval_every_samples=None,
            optimizer=adam,
        )
        result = fine_tune(
            model,
            train,
            test,
            config,
            device=dev,
            callbacks=FineTuneCallbacks(progress=False, hooks=[follower]),
        )
    opt = made[0]
    assert [e["kind"] for e in (dataclasses.asdict(e) for e in follower.events)] == ["start", "switch"]
    assert opt.param_groups[0]["lr"] == pytest.approx(lr_for(8))
    # Adam's moments went on: one optimizer, its step count = every step of both batch sizes
    steps = {int(s["step"]) for s in opt.state.values()}
    assert steps == {result.steps} and result.steps == 4 + 4
    assert result.samples == 16 * 4 + 8 * 4 and result.batch_size == 16


def test_a_cap_lifted_and_back_pins_the_capped_pick_again() -> None:
    """Under the cap the pick is 460 MHz (the guard made for that cap stays at it); lifted, the top
    frequency; back, 460 MHz again, pinned at once: the guard of an earlier cap, no longer in force,
    must not make the follower believe the board is still at 460 MHz."""
    train, test = _small_task()
    model = build_model("cnn-tiny", 10, seed=0)
    dev = SimulatedBoard.open("jetson-nano", noise=False)
    top, capped = dev.frequencies()[-1], dev.frequencies()[5]
    step_s = dev.predict(_workload(model), 8).seconds
    caps = ScheduleCap.from_pairs([[0, 3.0], [2.5 * step_s, None], [5.5 * step_s, 3.0]])
    follower = CapFollower(dev, caps, lambda cap: Pick(8, top if cap is None else capped))
    pinned: list[int] = []
    with dev.pinned(dev.frequencies()[0]):
        follower.start()
        config = FineTuneConfig(
            batch_size=8, lr=1e-3, target_accuracy=None, max_samples=8 * 9, eval_every_samples=None
        )
        callbacks = FineTuneCallbacks(
            progress=False,
            hooks=[follower],
            on_step=lambda steps, samples: pinned.append(dev.current_frequency()),
        )
        fine_tune(model, train, test, config, device=dev, callbacks=callbacks)
    assert [e.kind for e in follower.events] == ["start", "switch", "switch"]
    assert pinned == [capped] * 3 + [top] * 3 + [capped] * 3
    assert follower.step_downs == []


def _workload(model: torch.nn.Module):  # type: ignore[no-untyped-def]
    from powerfed.training.models import model_workload

    return model_workload("cnn-tiny", model, 10)


def test_a_real_board_is_put_back_when_a_pause_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(tmp_path))
    make_nano_tree(tmp_path)
    before = tree_snapshot(tmp_path)

    def choose(cap: float | None) -> Pick:
        if cap is not None and cap < 2:
            raise InfeasibleCapError("nothing fits")
        return Pick(16, 614_400_000)

    with open_device("jetson") as dev:  # wall time: the cap drops 10 ms in
        follower = CapFollower(
            dev,
            ScheduleCap.from_pairs([[0, 5.0], [0.01, 1.0]]),
            choose,
            poll_s=0.01,
            pause_timeout_s=0.05,
        )
        with pytest.raises(CapPauseTimeout), dev.pinned(dev.frequencies()[0]):
            follower.start()
            pinned = tmp_path / NANO_DEVFREQ
            assert (pinned / "min_freq").read_text().strip() == (pinned / "max_freq").read_text().strip()
            assert (pinned / "max_freq").read_text().strip() == "614400000"
            while True:
                follower.before_step(0)
    assert tree_snapshot(tmp_path) == before


def test_a_constant_cap_never_switches() -> None:
    dev = SimulatedBoard.open("jetson-nano")
    follower = CapFollower(dev, ConstantCap(3.0), lambda cap: Pick(8, dev.frequencies()[3]))
    with dev.pinned(dev.frequencies()[0]):
        follower.start()
        dev.idle(100.0)
        assert follower.before_step(0) is None
    assert [e.kind for e in follower.events] == ["start"]


@pytest.mark.parametrize(
    ("events", "fragment"),
    [
        ("not json", "must be a JSON list"),
        ('{"kind": "switch"}', "must be a JSON list"),
        ('[{"kind": "switch"}]', "entries must have the keys t_s, "),
        ({"kind": "teleport"}, "kind must be one of start, switch"),
        ({"t_s": -1}, r"t_s must be a number ≥ 0"),
    ],
)
def test_bad_cap_events_in_a_reply_are_one_line(events: Any, fragment: str, uncapped_nano: tuple) -> None:
    report = _static_run(uncapped_nano).to_config()
    event = dict.fromkeys(CAP_EVENT, 0) | {"kind": "switch"}  # each of its fields, good
    report["cap-events"] = events if isinstance(events, str) else json.dumps([event | events])
    with pytest.raises(ProtocolError, match=fragment) as err:
        ClientReport.from_config(report)
    assert "\n" not in str(err.value)


class Killed(Exception):
    pass


def test_a_killed_round_under_a_changing_cap_resumes_to_the_uninterrupted_result(
    uncapped_nano: tuple,
) -> None:
    settings, data = uncapped_nano
    node = dataclasses.replace(
        settings, cap_source=ScheduleCap.from_pairs([[0, 4.0], [0.05, 2.3], [0.12, 4.5]])
    )
    instr = dataclasses.replace(INSTR, checkpoint_every_samples=32, eval_every_samples=32)
    # uncheckpointed: a finished checkpointed run's end state would answer the same work
    whole_instr = dataclasses.replace(instr, checkpoint_every_samples=0)
    outcome = run_round(RoundWork(node, whole_instr, initial_state(), data, device_seed=2))
    state, whole = outcome.trained.state, outcome.report

    def kill(steps: int, samples: int) -> None:
        if steps == 9:  # after the first switch, before the rise
            raise Killed

    with pytest.raises(Killed):
        run_round(RoundWork(node, instr, initial_state(), data, device_seed=2, on_step=kill))
    outcome = run_round(RoundWork(node, instr, initial_state(), data, device_seed=2))
    again_state, resumed = outcome.trained.state, outcome.report
    assert (resumed.training.resumed_at_samples or 0) > 0
    assert [e["kind"] for e in whole.cap.cap_events] == ["start", "switch", "switch"]
    assert resumed.cap.cap_events == whole.cap.cap_events
    same = ("device_s", "energy_j", "samples", "accuracy", "over_cap_s")
    assert [resumed.columns()[k] for k in same] == [whole.columns()[k] for k in same]
    assert all(torch.equal(state[k], again_state[k]) for k in state)
    # sent once more after it finished: answered from its end state, the follower's events included
    replayed = run_round(RoundWork(node, instr, initial_state(), data, device_seed=2, on_step=kill)).report
    assert (
        replayed.training.resumed_at_samples == replayed.training.samples
        and replayed.cap.cap_events == whole.cap.cap_events
    )
    assert [replayed.columns()[k] for k in same] == [whole.columns()[k] for k in same]
