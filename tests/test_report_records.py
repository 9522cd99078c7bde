"""The client report as its producers' records (`strategies.report`): each record checks its fields
where it is made, travels in the one ConfigRecord under the keys a deployed board has always sent, and
the results writer puts a row's columns in the file's order (`fl_server.results.CLIENT_COLUMNS`)."""

from __future__ import annotations

import json

import pytest

from fl_server.results import CLIENT_COLUMNS, ordered
from powerctl.errors import ArgumentError
from strategies.protocol import ProtocolError
from strategies.report import CapFollowed, ClientReport, Profiling, Training
from strategies.rounds import NodeInfo, report_row

OLD_COLUMNS = (
    "device power_cap_w batch_size frequency_hz device_s energy_j peak_power_w samples accuracy "
    "reached_target profiling_s board node_key predicted_s profiled_peak_power_w profile_cached "
    "profile_points lr stop_reason steps train_examples wall_s startup_s method resumed_at_samples "
    "deadline_s meets_deadline_predicted step_downs cap_source cap_events final_pair paused_s "
    "over_cap_s pinned restored profiling_choice profiling_predicted_from predicted_training_s "
    "profiling_budget_s profiling_costs_predicted partition_id"
)
OLD_ROW = OLD_COLUMNS.split()
"""A production row's columns, in order, as results.json has held them (`fl_server.results/2`)."""


def _report(**round_fields: object) -> ClientReport:
    costs = {"efficient": 2.0, "predicted": 0.0}
    return ClientReport(
        "sim:jetson-nano",
        3.0,
        16,
        921_600_000,
        Training(12.5, 30.0, 2.9, 640, 0.71, True, 0.01, "target", 40),
        Profiling(1.5, False, 6, "predicted", "the board model", 20.0, 6.0, costs),
        CapFollowed("schedule", [], [8, 614_400_000], 2.0, 0.25),
        [
            {
                "device_s": 1.0,
                "old_hz": 921_600_000,
                "new_hz": 825_600_000,
                "measured_w": 3.2,
                "power_cap_w": 3.0,
            }
        ],
        **round_fields,  # type: ignore[arg-type]
    )


def test_a_report_travels_under_the_keys_a_board_sends_and_comes_back_equal() -> None:
    report = _report(node_key="nano", startup_s=6.5)
    sent = report.to_config()
    for key in (
        "device-s",
        "profiling-s",
        "paused-s",
        "profiling-costs-predicted",
        "step-downs",
    ):
        assert key in sent  # one ConfigRecord, each record's fields under their kebab-case keys
    assert "energy-j" in sent and "resumed-at-samples" not in sent  # None is left out
    assert ClientReport.from_config(sent) == report
    assert json.loads(sent["final-pair"]) == [8, 614_400_000]


def test_a_row_has_the_files_columns_in_the_files_order() -> None:
    row = ordered(report_row(_report(), NodeInfo(1, "nano", "sim:jetson-nano", partition_id=0)))
    assert list(row) == OLD_ROW and set(OLD_ROW) <= set(CLIENT_COLUMNS)
    assert row["device_s"] == 12.5 and row["paused_s"] == 2.0 and row["profile_points"] == 6


@pytest.mark.parametrize(
    ("make", "fragment"),
    [
        (
            lambda: Training(-1.0, None, None, 0, 0.5, False),
            "Training: 'device_s' must be a number ≥ 0",
        ),
        (lambda: Profiling(0.0, profiling_costs_predicted={"guess": 1.0}), "must be a JSON object of device"),
        (lambda: CapFollowed(final_pair=[8]), "'final_pair' must be a JSON list \\[batch size, Hz\\]"),
        (lambda: _report(method="fastest"), "ClientReport: 'method' must be one of"),
    ],
)
def test_a_record_is_checked_where_it_is_made(make, fragment: str) -> None:
    with pytest.raises(ArgumentError, match=fragment) as err:
        make()
    assert "\n" not in str(err.value)


def test_a_reply_missing_a_training_field_or_holding_a_bad_step_down_is_one_line() -> None:
    sent = dict(_report().to_config())
    for key in ("samples", "profiling-s"):  # every report has them
        with pytest.raises(ProtocolError, match=f"missing key '{key}'"):
            ClientReport.from_config({k: v for k, v in sent.items() if k != key})
    bad = json.dumps([{"device_s": 1.0, "old_hz": 5, "new_hz": 4, "measured_w": -1, "power_cap_w": 3}])
    with pytest.raises(ProtocolError, match="'step-downs' measured_w must be a number ≥ 0"):
        ClientReport.from_config({**sent, "step-downs": bad})
    # absent where there is no sensor or no cap: None, as before
    back = ClientReport.from_config({k: v for k, v in sent.items() if k not in ("energy-j", "power-cap-w")})
    assert back.training.energy_j is None and back.power_cap_w is None
