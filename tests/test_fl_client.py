"""The client side of the Flower app: node settings, fleet mapping, profile cache, one round on a device."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from fl_client import round as client_round
from fl_client.local_data import data_plan, load_local_data
from fl_client.node import resolve_node
from fl_client.profile_step import ProfileKey, cached_profile
from fl_client.round import ClientWorkError, RoundWork, run_round
from powerctl.devices.simulated import POWER_NOISE
from powerctl.errors import DeviceError, InfeasibleCapError
from powerctl.records.profile import Profile, ProfilePoint
from strategies.fleet import NodeConfigError, fleet_entry, load_fleet
from tests.fake_boards import NANO_DEVFREQ, make_nano_tree, tree_snapshot
from tests.fl_helpers import FLEET, RUN_CONFIG, initial_state, instructions

# --- node settings and the fleet table ---------------------------------------------------------


def test_partition_ids_map_onto_the_fleet_table_cyclically() -> None:
    fleet = load_fleet(FLEET)
    assert [e.label() for e in fleet] == ["sim:jetson-nano@3", "sim:jetson-tx2nx@4.5", "sim:jetson-nano@none"]
    assert [fleet_entry(fleet, i).device for i in range(5)] == [
        "sim:jetson-nano",
        "sim:jetson-tx2nx",
        "sim:jetson-nano",
        "sim:jetson-nano",
        "sim:jetson-tx2nx",
    ]
    s = resolve_node({"partition-id": 4, "num-partitions": 6}, RUN_CONFIG)
    assert (s.device, s.power_cap_w, s.key, s.data) == ("sim:jetson-tx2nx", 4.5, "partition-4", None)


def test_node_config_wins_over_the_fleet_and_names_the_node() -> None:
    cfg = {"device": "sim:jetson-tx2nx", "power-cap-w": 6, "data": "text:/x.txt", "name": "tx2-lab"}
    s = resolve_node(cfg, RUN_CONFIG)
    assert (s.device, s.power_cap_w, s.data, s.key) == ("sim:jetson-tx2nx", 6.0, "text:/x.txt", "tx2-lab")
    uncapped = resolve_node({"device": "jetson", "data": "npz:/d.npz"}, {})
    assert uncapped.power_cap_w is None and uncapped.key.startswith("jetson@")


@pytest.mark.parametrize(
    ("node_config", "run_config", "fragment"),
    [
        ({"device": "sim:jetson-nano", "power-cap-w": -3, "partition-id": 0}, {}, "power-cap-w"),
        ({"device": "sim:jetson-nano", "power-cap-w": "abc", "partition-id": 0}, {}, "'abc'"),
        ({"device": "sim:jetson-nano", "power-cap-w": float("nan"), "partition-id": 0}, {}, "nan"),
        ({"device": "", "partition-id": 0}, {}, "'device'"),
        ({"partition-id": 0}, {}, "no 'device'"),
        ({"device": "sim:jetson-nano"}, {}, "no 'data'"),
        ({"partition-id": 3, "num-partitions": 2}, RUN_CONFIG, "partition-id"),
        ({"partition-id": 0}, {"fleet": "sim:jetson-nano@cheap"}, "'cheap'"),
        ({"partition-id": 0}, {"fleet": " , "}, "empty"),
        ({"partition-id": 0}, {"fleet": "/nonexistent/fleet.yaml"}, "no such fleet file"),
        # a cap below the least power of the simulated board: nothing could ever run (issue 18)
        ({"partition-id": 0}, {"fleet": "sim:jetson-nano@0.5"}, "a cap of 0.5 W is below anything"),
        (
            {"device": "sim:jetson-tx2nx", "power-cap-w": 2.0, "partition-id": 0},
            {},
            "node config 'power-cap-w': a cap of 2 W is below anything sim:jetson-tx2nx can run",
        ),
        ({"device": "sim:jetson-nano", "partition-id": "0"}, {}, "'partition-id' must be an integer ≥ 0"),
        # a misspelt cap is refused, not ignored (the node would run uncapped)
        ({"device": "sim:jetson-nano", "power-cap": 3, "data": "npz:/d.npz"}, {}, "power-cap-w"),
    ],
)
def test_bad_node_settings_are_one_line_naming_key_and_value(
    node_config: dict, run_config: dict, fragment: str
) -> None:
    with pytest.raises(NodeConfigError) as err:
        resolve_node(node_config, run_config)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_fleet_yaml_expands_counts_and_refuses_unknown_keys(tmp_path: Path) -> None:
    good = tmp_path / "fleet.yaml"
    good.write_text(
        "boards:\n  - {device: sim:jetson-nano, power-cap-w: 3.5, count: 2}\n  - {device: sim:jetson-tx2nx}\n"
    )
    assert [e.label() for e in load_fleet(str(good))] == [
        "sim:jetson-nano@3.5",
        "sim:jetson-nano@3.5",
        "sim:jetson-tx2nx@none",
    ]
    bad = tmp_path / "bad.yaml"
    bad.write_text("boards:\n  - {device: sim:jetson-nano, cap: 3}\n")
    with pytest.raises(NodeConfigError, match=r"boards\[0\]: unknown key 'cap'"):
        load_fleet(str(bad))
    broken = tmp_path / "broken.yaml"
    broken.write_text("boards: [unclosed\n")
    with pytest.raises(NodeConfigError, match="not valid YAML"):
        load_fleet(str(broken))


def test_partitions_are_disjoint_shares_of_the_run_data() -> None:
    run = dict(RUN_CONFIG)
    parts = [
        load_local_data(data_plan(resolve_node({"partition-id": i, "num-partitions": 3}, run), run, 64))
        for i in range(3)
    ]
    sizes = [len(tr) + len(te) for tr, te in parts]
    assert sum(sizes) == 5000 and max(sizes) - min(sizes) <= 1
    first = {tuple(x.flatten()[:8].tolist()) for x in parts[0][0].x[:50]}
    second = {tuple(x.flatten()[:8].tolist()) for x in parts[1][0].x[:50]}
    assert not first & second


# --- profile cache -----------------------------------------------------------------------------


def _key(**changes: object) -> ProfileKey:
    base = dict(
        device_kind="SimulatedBoard/jetson-nano",
        model="cnn-tiny",
        overrides="{}",
        num_classes=10,
        input_shape=(3, 32, 32),
        batch_sizes=(8, 16),
        order="grid",
        power_cap_w=None,
        samples=512,
        warmup_steps=0,
        measure_steps=1,
    )
    base.update(changes)
    return ProfileKey(**base)  # type: ignore[arg-type]


def _profile(peak: float = 2.5) -> Profile:
    point = ProfilePoint(8, 76800000, peak, peak, 0.1, 6.4)
    return Profile("jetson-nano", "cnn-tiny", [3, 32, 32], 512, [point], profiling_s=1.0)


def test_profile_cache_reuses_a_good_entry_and_reprofiles_a_corrupt_or_mismatched_one(tmp_path: Path) -> None:
    calls: list[float] = []

    def measure(peak: float) -> Profile:
        calls.append(peak)
        return _profile(peak)

    p, cached = cached_profile(_key(), lambda: measure(2.5), tmp_path)
    assert not cached and calls == [2.5]
    p2, cached = cached_profile(_key(), lambda: measure(9.9), tmp_path)
    assert cached and p2.points == p.points and calls == [2.5]

    entry = next(tmp_path.glob("profile-*.json"))
    entry.write_text(entry.read_text()[:-40])  # truncated: not trusted
    _, cached = cached_profile(_key(), lambda: measure(2.6), tmp_path)
    assert not cached and calls[-1] == 2.6

    data = json.loads(entry.read_text())
    data["model"] = "resnet18"  # valid file, wrong content for this key: not trusted
    entry.write_text(json.dumps(data))
    p4, cached = cached_profile(_key(), lambda: measure(2.7), tmp_path)
    assert not cached and p4.points[0].peak_power_w == 2.7

    _, cached = cached_profile(_key(batch_sizes=(8, 16, 32)), lambda: measure(2.8), tmp_path)
    assert not cached  # another key: another entry


# --- one round on a device ---------------------------------------------------------------------


def _data(partition: int = 0) -> tuple:
    s = resolve_node({"partition-id": partition, "num-partitions": 3}, RUN_CONFIG)
    return s, load_local_data(data_plan(s, RUN_CONFIG, 64))


def test_a_round_on_a_simulated_board_selects_under_its_cap_and_reports(tmp_path: Path) -> None:
    settings, data = _data(0)  # sim:jetson-nano at 3 W
    outcome = run_round(RoundWork(settings, instructions(), initial_state(), data, device_seed=1))
    state, report = outcome.trained.state, outcome.report
    assert report.device == "sim:jetson-nano" and report.power_cap_w == 3.0
    assert report.batch_size in (8, 16) and report.frequency_hz > 0
    assert report.profiled_peak_power_w <= 3.0  # the method's check; the run's own peak adds sensor noise
    assert report.training.peak_power_w is not None and report.training.peak_power_w <= 3.0 * (
        1 + 5 * POWER_NOISE
    )
    assert (
        report.training.samples == 64
        and report.training.stop_reason == "max_samples"
        and not report.training.reached_target
    )
    # a task this short takes the predicted way: its pair confirmed by the first steps, no profiling seconds
    assert report.profiling.profiling_choice == "predicted" and not report.profiling.profile_cached
    assert report.profiling.profiling_s == 0.0 and report.profiling.profile_points == 0
    assert report.training.energy_j and report.training.energy_j > 0 and report.training.device_s > 0
    assert set(state) == set(initial_state()) and not torch.equal(
        state["fc.weight"], initial_state()["fc.weight"]
    )
    outcome = run_round(RoundWork(settings, instructions(), initial_state(), data, device_seed=1))
    again_state, again = outcome.trained.state, outcome.report
    assert again.profiling.profile_cached and again.profiling.profiling_s == 0.0
    # a cached profile changes nothing of the training that follows: same seed, same numbers
    same = ("batch_size", "frequency_hz", "device_s", "energy_j", "peak_power_w", "accuracy", "samples")
    assert [again.columns()[k] for k in same] == [report.columns()[k] for k in same]
    assert all(torch.equal(state[k], again_state[k]) for k in state)


def test_a_server_cap_for_this_round_overrides_the_node_cap() -> None:
    settings, data = _data(2)  # the uncapped Nano
    free = run_round(RoundWork(settings, instructions(), initial_state(), data)).report
    capped = run_round(RoundWork(settings, instructions(power_cap_w=2.3), initial_state(), data)).report
    assert free.power_cap_w is None and capped.power_cap_w == 2.3
    assert capped.profiled_peak_power_w <= 2.3
    assert capped.frequency_hz < free.frequency_hz


def test_an_infeasible_cap_and_too_little_data_are_clear_errors() -> None:
    settings, data = _data(0)
    with pytest.raises(InfeasibleCapError, match=r"stays under 0\.50 W"):
        run_round(RoundWork(settings, instructions(power_cap_w=0.5), initial_state(), data))
    big = instructions(relation_batch_sizes=[4096, 8192], relation_samples=[1.0, 2.0])
    with pytest.raises(ClientWorkError, match="fewer than the smallest batch size 4096"):
        run_round(RoundWork(settings, big, initial_state(), data))


def test_host_has_no_knob_and_is_refused_with_one_line() -> None:
    settings, data = _data(0)
    host = type(settings)("host", None, None, 0, 3, "partition-0")
    with pytest.raises(DeviceError, match="no GPU frequency knob"):
        run_round(RoundWork(host, instructions(), initial_state(), data))


@pytest.mark.parametrize("fail_in_training", [False, True])
def test_a_round_on_a_jetson_leaves_the_board_exactly_as_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fail_in_training: bool
) -> None:
    root = make_nano_tree(tmp_path / "nano")
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(root))
    before = tree_snapshot(root)
    settings = resolve_node(
        {"device": "jetson", "power-cap-w": 10.0, "partition-id": 0, "num-partitions": 3}, RUN_CONFIG
    )
    _, data = _data(0)
    pinned_during: list[tuple[str, str]] = []  # (min_freq, max_freq) while fine-tuning
    real_fine_tune = client_round.fine_tune

    def spy(*args: object, **kwargs: object) -> object:
        devfreq = root / NANO_DEVFREQ
        pinned_during.append(
            ((devfreq / "min_freq").read_text().strip(), (devfreq / "max_freq").read_text().strip())
        )
        if fail_in_training:
            raise KeyboardInterrupt  # Ctrl-C in the middle of fine-tuning
        return real_fine_tune(*args, **kwargs)

    monkeypatch.setattr(client_round, "fine_tune", spy)
    instr = instructions(relation_batch_sizes=[8], relation_samples=[300.0], budget_samples=16)
    if fail_in_training:
        with pytest.raises(KeyboardInterrupt):
            run_round(RoundWork(settings, instr, initial_state(), data))
    else:
        report = run_round(RoundWork(settings, instr, initial_state(), data)).report
        assert report.board == "jetson-nano" and report.frequency_hz == int(pinned_during[0][0])
    # Pinned while training: min == max (the fake board's frequency does not change the host's
    # timing, so which frequency wins is noise; that it is pinned is not).
    assert before[f"{NANO_DEVFREQ}/min_freq"] != before[f"{NANO_DEVFREQ}/max_freq"]
    assert pinned_during and pinned_during[0][0] == pinned_during[0][1]
    assert tree_snapshot(root) == before


# --- a round killed mid-way and run again ------------------------------------------------------


class Killed(Exception):
    pass


def _kill_after(samples_at_least: int):
    def on_step(steps: int, samples: int) -> None:
        if samples >= samples_at_least:
            raise Killed(f"after {samples} samples")

    return on_step


def _said(caplog: pytest.LogCaptureFixture) -> str:
    """What the library logged (INFO and up) since the last call, its lines; forgotten after."""
    text = "\n".join(caplog.messages)
    caplog.clear()
    return text


def test_a_round_killed_mid_way_resumes_its_checkpoint_to_the_same_result(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)  # the lines the ClientApp shows on stderr
    settings, data = _data(0)
    instr = instructions(checkpoint_every_samples=32)
    # uncheckpointed: a finished checkpointed run would leave its end state for the same work
    outcome = run_round(
        RoundWork(settings, instructions(checkpoint_every_samples=0), initial_state(), data, device_seed=1)
    )
    plain_state, plain = outcome.trained.state, outcome.report
    assert plain.training.resumed_at_samples is None
    with pytest.raises(Killed):
        run_round(RoundWork(settings, instr, initial_state(), data, device_seed=1, on_step=_kill_after(40)))
    outcome = run_round(RoundWork(settings, instr, initial_state(), data, device_seed=1))
    state, report = outcome.trained.state, outcome.report
    assert report.training.resumed_at_samples == 32 and "checkpoint: resuming" in _said(caplog)
    same = ("batch_size", "frequency_hz", "device_s", "energy_j", "peak_power_w", "accuracy", "samples")
    assert [report.columns()[k] for k in same] == [plain.columns()[k] for k in same]
    assert all(torch.equal(state[k], plain_state[k]) for k in state)


def test_a_round_sent_again_after_it_finished_is_answered_without_training(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A restarted ServerApp re-sends a round this node finished (its reply never recorded): the node
    answers from the round's end state, the same report, and runs no training step."""
    caplog.set_level(logging.INFO)  # the lines the ClientApp shows on stderr
    settings, data = _data(0)
    instr = instructions(checkpoint_every_samples=32)
    outcome = run_round(RoundWork(settings, instr, initial_state(), data, device_seed=1))
    first_state, first = outcome.trained.state, outcome.report
    caplog.clear()
    outcome = run_round(
        RoundWork(settings, instr, initial_state(), data, device_seed=1, on_step=_kill_after(0))
    )
    state, again = outcome.trained.state, outcome.report
    assert again.training.resumed_at_samples == again.training.samples == first.training.samples
    assert "without training" in _said(caplog)
    same = ("batch_size", "frequency_hz", "device_s", "energy_j", "peak_power_w", "accuracy", "samples")
    assert [again.columns()[k] for k in same] == [first.columns()[k] for k in same]
    assert all(torch.equal(state[k], first_state[k]) for k in state)
    # the next round's work replaces it, silently
    next_round = run_round(
        RoundWork(settings, instructions(checkpoint_every_samples=32, server_round=2), initial_state(), data)
    ).report
    assert next_round.training.resumed_at_samples is None and "checkpoint" not in _said(caplog)


def test_a_checkpoint_of_another_round_or_other_weights_is_ignored_with_a_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)  # the lines the ClientApp shows on stderr
    settings, data = _data(0)
    instr = instructions(checkpoint_every_samples=32)
    with pytest.raises(Killed):
        run_round(RoundWork(settings, instr, initial_state(), data, device_seed=1, on_step=_kill_after(40)))
    caplog.clear()
    next_round = run_round(
        RoundWork(settings, instructions(checkpoint_every_samples=32, server_round=2), initial_state(), data)
    ).report
    assert next_round.training.resumed_at_samples is None
    assert "belongs to other work" in _said(caplog)
    with pytest.raises(Killed):
        run_round(RoundWork(settings, instr, initial_state(), data, device_seed=1, on_step=_kill_after(40)))
    other_weights = run_round(RoundWork(settings, instr, initial_state(seed=1), data, device_seed=1)).report
    assert other_weights.training.resumed_at_samples is None


def test_the_runs_relation_rule_reaches_the_clients_choice() -> None:
    """`relation-rule` travels in the train instructions, with the seeds' samples, to the client's rule;
    a node that drops a batch size it cannot fill keeps the seeds' samples of the others."""
    from fl_client.round import MethodRule, usable_relation
    from strategies.protocol import TrainInstructions
    from tests.test_selection import _two_seed_case

    profile, relation = _two_seed_case()
    for rule, b in (("mean", 32), ("robust", 16)):  # the hand-worked case of test_selection
        instr = instructions(relation_vector=relation, relation_rule=rule, model=relation.model)
        back = TrainInstructions.from_config(instr.to_config())
        assert back.relation_rule == rule
        assert back.relation_vector.per_seed_samples() == relation.per_seed_samples()
        chosen = MethodRule("ours", profile, back.relation_vector, relation_rule=back.relation_rule)(None)
        assert chosen.batch_size == b
    narrow = usable_relation(instr, 20)  # 20 training samples: b=32 cannot be filled
    assert narrow.batch_sizes == (16,)
    assert narrow.per_seed_samples() == [relation.per_seed_samples()[0]]
