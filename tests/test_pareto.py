"""The time–energy front (issue 8): non-dominated pairs, the two optima, the CLI and its files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from powerctl.cli.commands import main as powerctl
from powerctl.cli.plot import write_front
from powerctl.errors import InfeasibleCapError
from powerctl.records.pick import Pick
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.selection.pareto import PARETO_SCHEMA, pareto_front
from tests.test_selection import MHZ, energy_point, make_profile, make_relation, profiles


def dominates(a: Pick, b: Pick) -> bool:
    """`a` is at least as fast and as frugal as `b`, and strictly better in one (the definition)."""
    return (
        a.predicted_s <= b.predicted_s
        and a.predicted_energy_j <= b.predicted_energy_j
        and (a.predicted_s < b.predicted_s or a.predicted_energy_j < b.predicted_energy_j)
    )


def hand_profile() -> Profile:
    # r = 1000 samples for both sizes. time s / energy J (mean W × s):
    #   b16 @900: 40 s, 6 W → 240 J     fastest
    #   b16 @600: 50 s, 4 W → 200 J     on the front
    #   b32 @600: 50 s, 4.4 W → 220 J   same time, more energy: dominated by b16 @600
    #   b32 @300: 90 s, 2 W → 180 J     most frugal
    #   b16 @300: 95 s, 2 W → 190 J     slower and dearer than b32 @300: dominated
    return make_profile(
        [
            energy_point(16, 900, 7.0, 6.0, 40.0),
            energy_point(16, 600, 5.0, 4.0, 50.0),
            energy_point(32, 600, 5.5, 4.4, 50.0),
            energy_point(32, 300, 2.5, 2.0, 90.0),
            energy_point(16, 300, 2.4, 2.0, 95.0),
        ]
    )


def test_a_hand_worked_front() -> None:
    front = pareto_front(hand_profile(), make_relation({16: 1000.0, 32: 1000.0}), None)
    assert [(s.batch_size, s.frequency_hz // MHZ) for s in front.front] == [(16, 900), (16, 600), (32, 300)]
    assert (front.fastest.batch_size, front.fastest.frequency_hz) == (16, 900 * MHZ)
    assert (front.most_frugal.batch_size, front.most_frugal.predicted_energy_j) == (32, 180.0)
    capped = pareto_front(hand_profile(), make_relation({16: 1000.0, 32: 1000.0}), 5.0)
    assert [(s.batch_size, s.frequency_hz // MHZ) for s in capped.front] == [(16, 600), (32, 300)]
    with pytest.raises(InfeasibleCapError, match=r"no \(batch size, frequency\) pair stays under 1.00 W"):
        pareto_front(hand_profile(), make_relation({16: 1000.0, 32: 1000.0}), 1.0)


def test_of_pairs_tied_at_the_least_energy_the_most_frugal_end_is_the_fastest() -> None:
    """Two pairs predict the same joules, one in half the time: the slower is dominated, so the front
    ends at the faster, and so does `most_frugal` (the energy ranking's tie rule, the larger batch,
    had named the slower one: a hypothesis example)."""
    #   b32 @300: 40 s, 0.8 W → 32 J;   b16 @600: 20 s, 1.6 W → 32 J (faster, as frugal)
    profile = make_profile([energy_point(32, 300, 1.0, 0.8, 40.0), energy_point(16, 600, 2.0, 1.6, 20.0)])
    front = pareto_front(profile, make_relation({16: 1000.0, 32: 1000.0}), None)
    assert [(s.batch_size, s.frequency_hz // MHZ) for s in front.front] == [(16, 600)]
    assert front.fastest == front.most_frugal == front.front[0]


@settings(max_examples=100, deadline=None)
@given(profiles(), st.one_of(st.none(), st.floats(1.0, 20.0)))
def test_the_front_is_exactly_the_non_dominated_pairs(profile: Profile, cap: float | None) -> None:
    relation = make_relation({b: 500.0 * b**0.4 for b in profile.batch_sizes()})
    try:
        front = pareto_front(profile, relation, cap)
    except InfeasibleCapError:
        return
    for s in front.front:
        assert not any(dominates(o, s) for o in front.pairs)
    for s in front.pairs:  # the rest are dominated by (or equal to) a front pair
        key = (s.predicted_s, s.predicted_energy_j)
        assert s in front.front or any(
            dominates(f, s) or (f.predicted_s, f.predicted_energy_j) == key for f in front.front
        )
    assert front.fastest in front.front and front.most_frugal in front.front
    assert [s.predicted_s for s in front.front] == sorted(s.predicted_s for s in front.front)


def test_powerctl_pareto_and_select_objective(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    hand_profile().save(tmp_path / "p.json")
    make_relation({16: 1000.0, 32: 1000.0}).save(tmp_path / "r.json")
    files = ["--profile", str(tmp_path / "p.json"), "--relation", str(tmp_path / "r.json")]
    assert powerctl(["pareto", *files, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "5 feasible pairs, 3 on the time–energy front (no cap)" in out
    doc = json.loads((tmp_path / "out" / "pareto.json").read_text())
    assert doc["schema"] == PARETO_SCHEMA and len(doc["front"]) == 3
    assert doc["energy_optimal"]["predicted_energy_j"] == 180.0 and doc["time_optimal"]["batch_size"] == 16
    assert (tmp_path / "out" / "pareto.png").stat().st_size > 0
    assert powerctl(["select", *files, "--objective", "energy", "--json"]) == 0
    sel = json.loads(capsys.readouterr().out)
    assert (sel["batch_size"], sel["frequency_hz"], sel["predicted_energy_j"]) == (32, 300 * MHZ, 180.0)
    assert powerctl(["select", *files, "--objective", "energy"]) == 0
    assert "and 180.0 J to 80% accuracy" in capsys.readouterr().out
    assert powerctl(["pareto", *files, "--out", str(tmp_path / "o2"), "--power-cap", "1"]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("powerctl: error:")]
    assert len(errors) == 1 and "no (batch size, frequency) pair stays under 1.00 W" in errors[0]
    assert powerctl(["select", *files, "--objective", "joules"]) == 2
    assert "invalid choice: 'joules'" in capsys.readouterr().err


def test_pareto_json_holds_the_front_and_the_png_is_written(tmp_path: Path) -> None:
    profile, relation = hand_profile(), make_relation({16: 1000.0, 32: 1000.0})
    front = pareto_front(profile, relation, 5.0)
    paths = write_front(front, profile, relation, tmp_path / "f")
    assert [p.name for p in paths] == ["pareto.json", "pareto.png"]
    doc = json.loads(paths[0].read_text())
    front_back = [Pick(**d) for d in doc["front"]]
    assert (front_back, Pick(**doc["time_optimal"]), Pick(**doc["energy_optimal"])) == (
        front.front,
        front.fastest,
        front.most_frugal,
    )
    assert (doc["power_cap_w"], doc["feasible_pairs"], doc["model"]) == (5.0, 3, "resnet18")
    assert paths[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_powerctl_pareto_bad_inputs_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    hand_profile().save(tmp_path / "p.json")
    make_relation({16: 1000.0, 32: 1000.0}).save(tmp_path / "r.json")
    RelationVector.from_samples("mobilenetv2", "cifar10", 0.8, {16: 1.0, 32: 1.0}).save(tmp_path / "m.json")
    (tmp_path / "a-file").write_text("x")
    files = ["--profile", str(tmp_path / "p.json")]
    cases = [
        ([*files, "--relation", str(tmp_path / "m.json"), "--out", str(tmp_path / "o")], "do not belong"),
        ([*files, "--relation", str(tmp_path / "r.json"), "--out", str(tmp_path / "a-file")], "not a folder"),
        ([*files, "--relation", str(tmp_path / "nope.json"), "--out", str(tmp_path / "o")], "no such file"),
        (
            [
                *files,
                "--relation",
                str(tmp_path / "r.json"),
                "--out",
                str(tmp_path / "o"),
                "--power-cap",
                "-3",
            ],
            "-3",
        ),
    ]
    for argv, expected in cases:
        assert powerctl(["pareto", *argv]) == 2
        assert expected in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()  # nothing written for an input refused
