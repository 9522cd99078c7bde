"""Cap sources: constants, schedules, CSV traces and live files, and every way of writing one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_client.node import resolve_node
from powerctl.selection.capsource import (
    CapSourceError,
    ConstantCap,
    LiveFileCap,
    ScheduleCap,
    TraceCap,
    parse_cap_source,
)
from strategies.fleet import NodeConfigError, load_fleet_file

SOLAR = Path(__file__).resolve().parents[1] / "simulations" / "caps" / "solar-jetson-nano.csv"


def test_the_shipped_solar_trace_rises_dips_under_a_cloud_and_repeats() -> None:
    trace = parse_cap_source(f"trace:{SOLAR}", "test")
    assert isinstance(trace, TraceCap) and trace.period_s == 600.0
    caps = [trace.cap_at(t) for t in range(0, 600, 10)]
    assert caps[0] == trace.lowest_w() == 2.4 and max(caps) == 5.0
    noon, cloud = caps.index(5.0), 30 + caps[30:40].index(min(caps[30:40]))
    assert noon < cloud and min(caps[30:40]) < 3.0  # the cloud takes the cap down after noon
    assert trace.cap_at(600 + 123) == trace.cap_at(123)  # repeats
    clipped = parse_cap_source(f"trace:{SOLAR}?end=clip&timescale=0.5&scale=2", "test")
    assert clipped.cap_at(10_000) == 2 * trace.cap_at(599)
    assert clipped.cap_at(5) == 2 * trace.cap_at(10)


def test_a_trace_holds_each_row_until_the_next(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("seconds,watts\n0,5\n10,3  # a comment\n\n20,4\n")
    trace = TraceCap.load(path)
    assert [trace.cap_at(t) for t in (0, 9.99, 10, 19.9, 20, 29.9, 30, 41)] == [5, 5, 3, 3, 4, 4, 5, 3]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "no 'seconds,watts' rows"),
        ("0,5\n0,3\n", ":2: times must increase"),
        ("0,5\n10,3\n5,4\n", ":3: times must increase"),
        ("1,5\n", ":1: times start at 0 s"),
        ("0,5\n10,-3\n", ":2: a cap must be a number of watts > 0 and ≤ 100000, got -3"),
        ("0,5\n10,nan\n", "a cap must be a number of watts > 0"),
        ("0,5\n10,abc\n", ":2: expected 'seconds,watts'"),
        ("0,5,6\n", ":1: expected 'seconds,watts'"),
    ],
)
def test_bad_traces_are_one_line_naming_the_row(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(CapSourceError) as err:
        TraceCap.load(path)
    assert fragment in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_scaled_trace_checks_its_times_scaled(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("0,5\n10,3\n15,4\n")
    assert TraceCap.load(path, time_scale=2.0).times_s == (0.0, 20.0, 30.0)
    path.write_text("0,5\n10,3\n8,4\n")
    with pytest.raises(CapSourceError, match=r":3: times must increase, got 8 × timescale 0\.5 after 5"):
        TraceCap.load(path, time_scale=0.5)


def test_a_live_file_is_read_at_its_poll_period_and_keeps_the_last_good_cap(tmp_path: Path) -> None:
    path = tmp_path / "cap"
    path.write_text("5\n")
    live = LiveFileCap(path, poll_s=2.0)
    assert live.cap_at(0.0) == 5.0
    path.write_text("3.5")
    assert live.cap_at(1.9) == 5.0  # not read before its period
    assert live.cap_at(2.0) == 3.5
    path.write_text("garbage")
    assert live.cap_at(4.5) == 3.5 and "keeping 3.5 W" in live.warnings[-1]  # never a higher cap by accident
    path.unlink()
    assert live.cap_at(7.0) == 3.5 and "cannot read" in live.warnings[-1]
    path.write_text("none")
    assert live.cap_at(9.5) is None
    assert live.lowest_w() is None and not live.is_constant


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("abc", "must be a number of watts, none, a schedule"),
        ("-3", "must be a number of watts > 0 and ≤ 100000, or none, got -3.0"),
        (True, "must be a number of watts > 0 and ≤ 100000, or none, got True"),
        ("[[0, 5], [0, 3]]", "[1]: times must increase"),
        ("[[1, 5]]", "[0]: times start at 0 s"),
        ("[[0, 5], [10]]", "[1]: expected a step [t_s, W]"),
        ("[0, 5", "a schedule must be JSON"),
        ("trace:", "needs a file path"),
        ("trace:/no/such.csv", "cannot read the cap trace"),
        ("live:/no/such", "cannot read the live cap file"),
        (f"trace:{SOLAR}?end=wrap", "end must be one of repeat, clip"),
        (f"trace:{SOLAR}?speed=2", "unknown option 'speed=2'"),
        (f"trace:{SOLAR}?scale=-1", "scale must be a positive number"),
        ("live:/tmp?poll=x", "poll must be a number"),
    ],
)
def test_bad_sources_are_one_line(value: object, fragment: str) -> None:
    with pytest.raises(CapSourceError) as err:
        parse_cap_source(value, "node config 'power-cap-w'")
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_every_form_parses() -> None:
    assert parse_cap_source(4, "x") == ConstantCap(4.0) and parse_cap_source("none", "x") == ConstantCap(None)
    assert parse_cap_source(" 3.5 ", "x").cap_at(100) == 3.5
    schedule = parse_cap_source("[[0, 5], [60, 3], [120, null]]", "x")
    assert [schedule.cap_at(t) for t in (0, 59, 60, 200)] == [5.0, 5.0, 3.0, None]
    assert parse_cap_source([[0, 5], [60, 3]], "x") == ScheduleCap(((0.0, 5.0), (60.0, 3.0)))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.5, 30.0), min_size=1, max_size=8),
    st.lists(st.floats(0.1, 100.0), min_size=8, max_size=8),
    st.floats(0.0, 1e4),
)
def test_a_repeating_trace_only_gives_its_own_values_and_is_periodic(
    watts: list[float], gaps: list[float], t: float
) -> None:
    times = [0.0]
    for g in gaps[: len(watts) - 1]:
        times.append(times[-1] + g)
    trace = TraceCap(tuple(times), tuple(watts))
    assert trace.cap_at(t) in watts
    if math.isfinite(trace.period_s):
        # t + period is rounded: within that rounding of a change (or of the period end), either side holds
        phase = t % trace.period_s
        eps = 1e-9 * max(1.0, t + trace.period_s)
        at_a_change = any(abs(phase - c) <= eps for c in (*times, trace.period_s))
        assert trace.cap_at(t + trace.period_s) == pytest.approx(trace.cap_at(t)) or at_a_change


def test_node_config_and_fleet_files_take_every_source(tmp_path: Path) -> None:
    node = resolve_node(
        {"device": "sim:jetson-nano", "data": "npz:/d.npz", "power-cap-w": f"trace:{SOLAR}"}, {}
    )
    assert node.power_cap_w == 2.4 and isinstance(node.caps(), TraceCap)
    steady = resolve_node({"device": "sim:jetson-nano", "data": "npz:/d.npz", "power-cap-w": 3}, {})
    assert steady.caps() == ConstantCap(3.0)
    (tmp_path / "caps").mkdir()
    (tmp_path / "caps" / "day.csv").write_text("0,4\n30,2.5\n")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "boards:\n"
        "  - {device: sim:jetson-nano, power-cap-w: 'trace:caps/day.csv?end=clip'}\n"
        "  - {device: sim:jetson-tx2nx, power-cap-w: [[0, 4.5], [60, 6]]}\n"
        "  - {device: sim:jetson-nano, power-cap-w: 3}\n"
    )
    traced, scheduled, constant = load_fleet_file(fleet)
    assert traced.power_cap_w == 4.0 and traced.cap_source.cap_at(100) == 2.5  # relative to the fleet file
    assert "trace" in traced.cap_label() and scheduled.cap_source.cap_at(61) == 6.0
    assert constant.cap_source is None
    fleet.write_text("boards:\n  - {device: sim:jetson-nano, power-cap-w: 'trace:caps/none.csv'}\n")
    with pytest.raises(NodeConfigError, match=r"boards\[0\]\.power-cap-w|cannot read the cap trace"):
        load_fleet_file(fleet)
    with pytest.raises(NodeConfigError, match="cannot read the cap trace"):
        resolve_node({"device": "sim:jetson-nano", "data": "npz:/d", "power-cap-w": "trace:/nope.csv"}, {})


def test_powerctl_cap_source_shows_checks_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from powerctl.cli.commands import main as powerctl

    def main(argv: list[str]) -> int:
        return powerctl(["cap-source", *argv])

    assert main([f"trace:{SOLAR}?timescale=0.5", "--json", "--plot", str(tmp_path / "cap.png")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lowest_w"] == 2.4 and len(out["points"]) == 61 and out["points"][-1][0] == 300.0
    assert (tmp_path / "cap.png").stat().st_size > 0
    assert main(["[[0, 5], [60, 3]]", "--every", "30", "--until", "90"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("schedule [0s:5W, 60s:3W]") and lines[-1].split() == ["90.0", "s", "3.00", "W"]
    assert main(["trace:/no/such.csv"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "powerctl: error: /no/such.csv: cannot read the cap trace (No such file or directory)"
