"""The method travels in the train instructions; the client picks (b, f) with what powerctl says for it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fl_client.local_data import data_plan, load_local_data
from fl_client.node import resolve_node
from fl_client.round import RoundWork, run_round
from powerctl.devices.boards import board_model
from powerctl.devices.simulated import predicted_profile, replay_cost
from powerctl.records.relation import RelationVector
from powerctl.selection.baselines import oracle, proxy_batch, state_of_practice
from powerctl.selection.joint import best_frequency_per_batch, select
from powerctl.selection.methods import ORACLE, method_named
from powerfed.training.models import build_model, model_workload
from simulations import bench_steps
from simulations.bench_report import measured
from strategies.power_aware import for_method, trains_real_model
from strategies.protocol import METHODS, TrainInstructions
from strategies.rounds import NodeInfo
from tests.fl_helpers import RUN_CONFIG, initial_state, instructions

CAP_W = 3.0


def _predicted(batch_sizes: list[int]):
    net = build_model("cnn-tiny", 10, seed=0)
    return predicted_profile("jetson-nano", model_workload("cnn-tiny", net, 10), batch_sizes, 512)


def _round(instr: TrainInstructions, tmp_path: Path):
    settings = resolve_node({"partition-id": 0, "num-partitions": 3}, RUN_CONFIG)  # sim:jetson-nano @ 3 W
    data = load_local_data(data_plan(settings, RUN_CONFIG, 64))
    state = initial_state()
    outcome = run_round(RoundWork(settings, instr, state, data, 1, tmp_path), bench_steps.round_steps(instr))
    return state, outcome.trained.state, outcome.report, measured(outcome)  # as the fleet's ClientApp runs it


def test_the_method_round_trips_through_the_message_config() -> None:
    for method in METHODS:
        instr = instructions(method=method, profile_source="predicted", stand_in=True)
        back = TrainInstructions.from_config(instr.to_config())
        assert (back.method, back.profile_source, back.stand_in) == (method, "predicted", True)
    with pytest.raises(Exception, match="'method' must be one of"):
        TrainInstructions.from_config({**dict(instructions().to_config()), "method": "fastest"})


@pytest.mark.parametrize("method", ["ours", "state-of-practice", "proxy-batch"])
def test_each_method_picks_what_powerctl_says_for_that_profile_and_cap(method: str, tmp_path: Path) -> None:
    instr = instructions(method=method, profile_source="predicted", relation_samples=[300.0, 600.0])
    _, _, report, _ = _round(instr, tmp_path)
    profile, relation = _predicted([8, 16]), instr.relation_vector
    expected = {
        "ours": lambda: select(profile, relation, CAP_W),
        "state-of-practice": lambda: state_of_practice(profile, CAP_W),
        "proxy-batch": lambda: proxy_batch(profile, relation, CAP_W),
    }[method]()
    assert (report.batch_size, report.frequency_hz) == (expected.batch_size, expected.frequency_hz)
    assert report.method == method and report.power_cap_w == CAP_W and report.training.samples > 0
    assert report.profiling.profiling_s == 0.0  # predicted profiles cost no device time
    # the methods really differ here: SoP takes the largest b (16), proxy-batch the fewest proxy samples
    # (8), both at the fixed frequency; ours b=8 at a higher frequency than that
    assert {"ours": 8, "state-of-practice": 16, "proxy-batch": 8}[method] == report.batch_size
    fixed = state_of_practice(profile, CAP_W).frequency_hz
    assert (report.frequency_hz > fixed) if method == "ours" else (report.frequency_hz == fixed)


@pytest.mark.parametrize("method", ["state-of-practice", "proxy-batch"])
def test_a_baseline_on_a_simulated_board_reads_its_model_and_measures_nothing(
    method: str, tmp_path: Path
) -> None:
    """The baselines are charged no profiling and pick by batch size and fixed frequency: on a simulated
    board they take the board's model as their profile (no profile measured, none cached) and pick what
    they pick from it; ours, under the same instructions, still profiles."""
    instr = instructions(method=method, relation_samples=[300.0, 600.0])  # profile-source: measured
    assert instr.profile_source == "measured"
    _, _, report, _ = _round(instr, tmp_path)
    profile, relation = _predicted([8, 16]), instr.relation_vector
    expected = (
        state_of_practice(profile, CAP_W)
        if method == "state-of-practice"
        else proxy_batch(profile, relation, CAP_W)
    )
    assert (report.batch_size, report.frequency_hz) == (expected.batch_size, expected.frequency_hz)
    assert report.profiling.profiling_choice == "model" and report.profiling.profiling_s == 0.0
    assert report.profiling.profile_points == len(profile.points) and not list(tmp_path.rglob("*.json"))
    _, _, ours, _ = _round(instructions(method="ours"), tmp_path / "ours")
    assert ours.profiling.profiling_choice != "model" and list((tmp_path / "ours").rglob("*.json"))


def test_the_oracle_measures_samples_to_target_on_its_own_data_then_asks_powerctl(tmp_path: Path) -> None:
    instr = instructions(
        method="oracle",
        profile_source="predicted",
        target_accuracy=0.3,
        budget_samples=640,
        eval_every_samples=32,
    )
    _, _, report, bench = _round(instr, tmp_path)  # the bench's own record, beside the report
    measured = {int(b): s for b, s in bench.oracle_samples_to_target.items()}
    assert set(measured) == {8, 16} and bench.oracle_search_device_s > 0 and not bench.stand_in
    target = RelationVector.from_samples("cnn-tiny", "own", 0.3, measured)
    expected = oracle(_predicted([8, 16]), target, CAP_W)
    assert (report.batch_size, report.frequency_hz) == (expected.batch_size, expected.frequency_hz)
    # samples to target are the interpolated crossing, within the evaluation interval before the run stops
    crossing = measured[report.batch_size]
    assert (
        report.training.reached_target
        and report.training.samples - instr.eval_every_samples < crossing <= report.training.samples
    )


def test_the_fleets_oracle_stops_a_batch_size_that_can_no_longer_win_and_chooses_as_the_full_search(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real fine-tunes of cnn-tiny at b = 4, 8, 16: the pruned search (the fleet's) and the full one (the
    demo's) choose the same pair; what the pruned one stopped it stopped short of where the full run
    crossed, past the samples that would tie the fastest, and it trained fewer samples in all."""
    sizes = [4, 8, 16]
    instr = instructions(
        method="oracle",
        profile_source="predicted",
        target_accuracy=0.3,
        budget_samples=2048,
        eval_every_samples=32,
        relation_batch_sizes=sizes,
        relation_samples=[300.0, 300.0, 300.0],
    )
    _, _, pruned, pruned_bench = _round(instr, tmp_path / "pruned")
    monkeypatch.setattr(bench_steps, "oracle_search", bench_steps.full_oracle_search)
    _, _, full, full_bench = _round(instr, tmp_path / "full")
    assert (pruned.batch_size, pruned.frequency_hz) == (full.batch_size, full.frequency_hz)
    assert (
        pruned.training.samples == full.training.samples
        and pruned.training.device_s == full.training.device_s
    )  # the same run
    crossed = {int(b): s for b, s in full_bench.oracle_samples_to_target.items()}
    kept = {int(b): s for b, s in pruned_bench.oracle_samples_to_target.items()}
    stopped = {int(b): s for b, s in (pruned_bench.oracle_stopped_at_samples or {}).items()}
    assert stopped and full_bench.oracle_stopped_at_samples is None and set(crossed) == set(sizes)
    assert set(kept) | set(stopped) == set(sizes) and not set(kept) & set(stopped)
    assert all(kept[b] == crossed[b] for b in kept)  # a run that reached is the unpruned run
    profile = _predicted(sizes)
    points = best_frequency_per_batch(profile, CAP_W)
    per_sample = {b: points[b].seconds_per_batch / b for b in sizes}
    fastest_s = min(kept[b] * per_sample[b] for b in kept)
    for b, trained in stopped.items():
        assert trained < crossed[b]  # stopped before its full run crossed ...
        assert trained * per_sample[b] > fastest_s * (1 + bench_steps.PRUNE_MARGIN)  # ... where it had lost
    assert pruned_bench.oracle_search_device_s < full_bench.oracle_search_device_s


def test_a_stand_in_selects_for_real_but_charges_the_board_model_and_returns_the_weights(
    tmp_path: Path,
) -> None:
    instr = instructions(method="ours", profile_source="predicted", stand_in=True, budget_samples=200)
    state, new_state, report, bench = _round(instr, tmp_path)
    assert bench is not None and bench.stand_in and report.training.stop_reason == "stand-in"
    assert all(torch.equal(state[k], new_state[k]) for k in state)
    profile = _predicted([8, 16])
    chosen = select(profile, instr.relation_vector, CAP_W)
    assert (report.batch_size, report.frequency_hz) == (chosen.batch_size, chosen.frequency_hz)
    steps = math.ceil(200 / chosen.batch_size)  # proxy needs 300/400 samples: the budget of 200 stops it
    seconds, joules = replay_cost(
        board_model("jetson-nano"),
        _workload(),
        chosen.batch_size,
        steps,
        chosen.frequency_hz,
    )
    assert report.training.samples == steps * chosen.batch_size and not report.training.reached_target
    assert report.training.device_s == pytest.approx(seconds) and report.training.energy_j == pytest.approx(
        joules
    )


def _workload():
    return model_workload("cnn-tiny", build_model("cnn-tiny", 10, seed=0), 10)


def test_the_oracle_refuses_to_choose_without_its_measurements() -> None:
    with pytest.raises(Exception, match="own data"):
        method_named(ORACLE).choose(_predicted([8, 16]), instructions().relation_vector, CAP_W)


def test_a_share_of_partitions_trains_the_real_model_spread_evenly() -> None:
    assert [i for i in range(12) if trains_real_model(i, 0.25)] == [3, 7, 11]
    assert sum(trains_real_model(i, 0.1) for i in range(1000)) == 100
    assert all(trains_real_model(i, 1.0) for i in range(5)) and not any(
        trains_real_model(i, 0.0) for i in range(5)
    )
    assert trains_real_model(None, 0.0)  # a deployed node (no partition id) always trains
    node = NodeInfo(node_id=7, key="partition-2", device="sim:jetson-nano", partition_id=2)
    instr = for_method("proxy-batch", 0.25)(node, 3, instructions())
    assert (instr.method, instr.stand_in, instr.server_round, instr.node_key) == (
        "proxy-batch",
        True,
        3,
        "partition-2",
    )


def test_progress_lines_name_method_round_and_clients_and_polls_scale_with_the_fleet() -> None:
    from flwr.app import ConfigRecord, Message, MessageType, RecordDict

    from fl_client.app import app as client_app
    from fl_server.progress import ProgressGrid
    from tests.fake_grid import FakeGrid

    grid = FakeGrid(
        client_app, {1: {"partition-id": 0, "num-partitions": 2}, 2: {}}, RUN_CONFIG, {2: "query-silent"}
    )
    lines: list[str] = []
    progress = ProgressGrid(grid, lines.append, every_s=0.0, poll_s=0.01)
    progress.label = "oracle"
    config = ConfigRecord({"server-round": 3})
    msgs = [
        Message(RecordDict({"config": config}), dst_node_id=n, message_type=MessageType.QUERY) for n in (1, 2)
    ]
    replies = progress.send_and_receive(msgs, timeout=0.2)
    assert len(replies) == 1  # the silent node never answers: the timeout ends the wait
    assert lines[0].startswith("  [oracle] query: 1/2 clients done")
    assert progress.round == 3
    assert (
        progress.interval_s(2) == 0.01
        and progress.interval_s(1000) == 2.0
        and progress.interval_s(10**5) == 3.0
    )
