"""The fleet runner's steps live with the fleet runner: the production round has none of them and
refuses instructions that ask for them in one line; the fleet's own ClientApp
(`simulations.fleet_client`, what the simulations launcher runs) passes them in."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest

import fl_client.round as client_round
from fl_client.round import ClientWorkError, RoundSteps, fine_tune_step, measured_profile_step, method_step
from simulations import bench_steps
from strategies.protocol import ORACLE, STATE_OF_PRACTICE
from tests.fl_helpers import instructions

ROOT = Path(__file__).resolve().parents[1]


def test_the_production_round_holds_no_bench_step() -> None:
    for name in ("oracle_search", "stand_in_step", "predicted_profile_step", "PinnedRule"):
        assert not hasattr(client_round, name), name
    for steps in (RoundSteps.for_instructions(instructions()), bench_steps.round_steps(instructions())):
        assert (steps.profile, steps.choose, steps.train) == (
            measured_profile_step,
            method_step,
            fine_tune_step,
        )


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"stand_in": True, "profile_source": "predicted"},
            ("predicted_profile_step", "method_step", "stand_in_step"),
        ),
        ({"method": ORACLE}, ("measured_profile_step", "oracle_search", "fine_tune_step")),
        (
            {"method": STATE_OF_PRACTICE, "stand_in": True},
            ("measured_profile_step", "method_step", "stand_in_step"),
        ),
    ],
)
def test_what_only_the_benches_ask_for_the_fleet_passes_in_and_the_product_refuses(
    changes: dict, expected: tuple
) -> None:
    instr = dataclasses.replace(instructions(), **changes)
    steps = bench_steps.round_steps(instr)
    assert tuple(f.__name__ for f in (steps.profile, steps.choose, steps.train)) == expected
    with pytest.raises(ClientWorkError, match="only its ClientApp has") as caught:
        RoundSteps.for_instructions(instr)
    assert "\n" not in str(caught.value)


def test_the_product_looks_no_steps_up_by_entry_point() -> None:
    assert "entry-points" not in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert "entry_points" not in Path(client_round.__file__).read_text(encoding="utf-8")


def test_the_launcher_runs_the_fleets_apps_and_leaves_the_app_folder_as_it_is(tmp_path: Path) -> None:
    import tomllib

    from fl_server.fab import staged_app
    from simulations.launcher import APP_DIR, with_fleet_apps

    def components(app: Path) -> dict[str, str]:
        config = tomllib.loads((app / "pyproject.toml").read_text(encoding="utf-8"))
        return dict(config["tool"]["flwr"]["app"]["components"])

    built_in = {"serverapp": "fl_server.app:app", "clientapp": "fl_client.app:app"}  # a deployed board's
    staged = with_fleet_apps(staged_app(APP_DIR, tmp_path / "app"), APP_DIR)
    assert components(staged) == {
        "serverapp": "simulations.fleet_server:app",
        "clientapp": "simulations.fleet_client:app",
    }
    assert components(APP_DIR) == built_in
    assert with_fleet_apps(APP_DIR, APP_DIR) == APP_DIR and components(APP_DIR) == built_in
    other = tmp_path / "other"
    other.mkdir()
    (other / "pyproject.toml").write_text('clientapp = "fl_client.app:app"\n', encoding="utf-8")
    with_fleet_apps(other, tmp_path / "their-app")  # another app's folder: not ours to change
    assert "fl_client.app:app" in (other / "pyproject.toml").read_text(encoding="utf-8")


def _train_reply(fleet: bool = True, **changes: object):
    """One TRAIN message through the fleet's ClientApp (or the built-in one), a fleet's partition 0:
    sim:jetson-nano @ 3 W."""
    from flwr.app import ArrayRecord, Message, MessageType, RecordDict

    from fl_client.app import app as built_in
    from simulations.fleet_client import app as fleet_app
    from strategies.protocol import ARRAYS_KEY, CONFIG_KEY
    from tests.fake_grid import FakeGrid
    from tests.fl_helpers import RUN_CONFIG, initial_state

    grid = FakeGrid(
        fleet_app if fleet else built_in, {1: {"partition-id": 0, "num-partitions": 3}}, RUN_CONFIG
    )
    instr = dataclasses.replace(instructions(), **changes)
    arrays = ArrayRecord.from_torch_state_dict(initial_state())
    content = RecordDict({ARRAYS_KEY: arrays, CONFIG_KEY: instr.to_config()})
    (reply,) = grid.send_and_receive([Message(content, dst_node_id=1, message_type=MessageType.TRAIN)])
    return reply


def test_only_a_bench_round_sends_the_bench_record_and_the_fleets_rows_keep_one_shape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bench's fields travel in the fleet's own record, filled only by its steps; the fleet's server
    side reads it into the row at its places (a production row holds its defaults), so rows keep one
    shape; the protocol defines no such record."""
    import strategies.protocol as protocol
    import strategies.report as report_module
    from fl_server.results import ordered
    from simulations.bench_report import BenchReport
    from strategies.protocol import REPORT_KEY
    from strategies.report import take_report
    from strategies.rounds import NodeInfo, report_row, summarise

    assert not hasattr(protocol, "BenchReport") and not hasattr(report_module, "BENCH_REPORT_KEY")
    monkeypatch.setattr(report_module, "BESIDE_REPORT", {})
    import simulations.fleet_server

    importlib.reload(simulations.fleet_server)  # registers again, here: imported once per process
    assert {BenchReport.KEY: BenchReport} == report_module.BESIDE_REPORT
    production, bench = _train_reply(), _train_reply(stand_in=True, profile_source="predicted")
    assert BenchReport.KEY not in production.content.config_records
    assert BenchReport.KEY not in _train_reply(fleet=False).content.config_records
    assert BenchReport.KEY in bench.content.config_records
    plain, stood_in = take_report(production.content), take_report(bench.content)
    assert plain is not None and stood_in is not None
    assert plain.beside == {} and stood_in.beside == {BenchReport.KEY: BenchReport(stand_in=True)}
    assert not {REPORT_KEY, BenchReport.KEY} & set(bench.content.config_records)  # taken out of the reply
    info = NodeInfo(1, "partition-0", "sim:jetson-nano", partition_id=0)
    rows = [ordered(report_row(r, info)) for r in (plain, stood_in)]  # in the results writer's order
    assert list(rows[0]) == list(rows[1])
    keys = list(rows[0])
    assert keys[keys.index("method") + 1] == "stand_in"
    after = keys.index("meets_deadline_predicted")
    assert keys[after + 1 : after + 3] == ["oracle_samples_to_target", "oracle_search_device_s"]
    assert [(r["stand_in"], r["oracle_samples_to_target"]) for r in rows] == [(False, None), (True, None)]
    assert summarise([plain, stood_in], [], 2)["stand_ins"] == 1


def test_a_server_that_registered_no_record_reads_the_report_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in ServerApp: the report's own fields in the row, the fleet's record left in the reply."""
    import strategies.report as report_module
    from simulations.bench_report import BenchReport
    from strategies.report import take_report

    monkeypatch.setattr(report_module, "BESIDE_REPORT", {})
    reply = _train_reply(stand_in=True, profile_source="predicted")
    report = take_report(reply.content)
    assert report is not None and report.beside == {} and "stand_in" not in report.columns()
    assert report.training.stop_reason == "stand-in" and BenchReport.KEY in reply.content.config_records


def test_the_bench_record_round_trips_and_is_checked() -> None:
    from powerctl.files.mapping import Integer
    from powerctl.files.mapping import kind_field as kind
    from simulations.bench_report import BenchReport
    from strategies.protocol import ProtocolError
    from strategies.report import BesideReport, register_beside_report

    record = BenchReport(oracle_samples_to_target={"8": 120.5}, oracle_search_device_s=3.0)
    assert BenchReport.from_config(record.to_config()) == record
    with pytest.raises(ProtocolError, match="oracle-samples-to-target"):
        BenchReport.from_config({"oracle-samples-to-target": '{"x": 1}'})

    @dataclasses.dataclass
    class Misplaced(BesideReport):  # a column the report has: the row could not hold both
        KEY = "misplaced"
        device_s: int = kind(Integer(0), 0)

    with pytest.raises(TypeError, match="Misplaced"):
        register_beside_report(Misplaced)


def test_the_built_in_clientapp_answers_a_bench_round_with_one_line() -> None:
    """A deployed board's ClientApp has no fleet steps: an error reply whose reason is one line."""
    reply = _train_reply(fleet=False, stand_in=True, profile_source="predicted")
    assert reply.has_error()
    reason = reply.error.reason
    assert "only its ClientApp has" in reason and "simulations.fleet_client:app" in reason
    assert "\n" not in reason
