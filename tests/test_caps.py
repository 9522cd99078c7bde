"""`powerctl caps`, predicted profiles, and the state-of-practice table stored in boards.yaml."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from powerctl.devices.boards import board_model, board_names
from powerctl.devices.simulated import SimulatedBoard, predicted_profile
from powerctl.errors import FileFormatError, InfeasibleCapError
from powerctl.profiling.profiler import Profiler
from powerctl.records.profile import Profile
from powerctl.records.workload import Workload
from powerctl.selection.caps import derive_peak_training_power, frequency_cap, peak_power_by_frequency
from powerfed.training.powerctl_cli import main
from tests.test_selection import make_profile, point

NANO = board_model("jetson-nano")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- the rule ----------------------------------------------------------------------------------------------


def test_frequency_cap_is_the_highest_frequency_where_every_point_of_every_profile_fits() -> None:
    a = make_profile([point(8, 384, 3.0, 10.0), point(8, 614.4, 4.0, 8.0), point(64, 384, 3.5, 9.0)])
    a = make_profile([*a.points, point(64, 614.4, 4.6, 7.0)])
    b = make_profile([point(16, 384, 3.2, 10.0), point(16, 614.4, 4.2, 8.0)])
    assert frequency_cap([a, b], 4.5) == 384_000_000  # (64, 614.4) of profile a draws 4.6 W
    assert frequency_cap([a, b], 4.6) == 614_400_000  # equal is feasible
    assert frequency_cap([b], 4.5) == 614_400_000
    with pytest.raises(InfeasibleCapError, match=r"even 384\.0 MHz reaches 3\.50 W"):
        frequency_cap([a, b], 3.1)


def test_a_frequency_some_batch_size_was_not_profiled_at_is_not_known_safe() -> None:
    # efficient order: batch 64 stopped before 614.4 MHz; that frequency is unverified for batch 64
    a = make_profile([point(8, 384, 3.0, 10.0), point(8, 614.4, 3.1, 8.0), point(64, 384, 3.5, 9.0)])
    assert peak_power_by_frequency([a]) == {384_000_000: 3.5}
    assert frequency_cap([a], 10.0) == 384_000_000


def test_profiles_of_different_devices_are_refused() -> None:
    a = make_profile([point(8, 384, 3.0, 10.0)], "jetson-nano")
    b = make_profile([point(8, 384, 3.0, 10.0)], "jetson-tx2nx")
    with pytest.raises(FileFormatError, match="different devices"):
        frequency_cap([a, b], 5.0)


# --- predicted profiles ---------------------------------------------------------------------------------


def test_predicted_profile_equals_a_noise_free_simulated_profile(small_workload: Workload) -> None:
    freqs = list(NANO.frequencies_hz[::4])
    predicted = predicted_profile(NANO, small_workload, [4, 32], samples=1000, frequencies=freqs)
    assert predicted.extra["predicted"] is True
    dev = SimulatedBoard(NANO, noise=False)
    measured = Profiler(
        dev, small_workload, lambda b: lambda: None, samples=1000, warmup_steps=1, measure_steps=3
    ).run([4, 32], frequencies=freqs, progress=False)
    assert len(predicted.points) == len(measured.points) == 2 * len(freqs)
    for p, m in zip(predicted.points, measured.points, strict=True):
        assert (p.batch_size, p.frequency_hz) == (m.batch_size, m.frequency_hz)
        assert p.peak_power_w == pytest.approx(m.peak_power_w)
        assert p.seconds_for_samples == pytest.approx(m.seconds_for_samples)
        assert p.mean_power_w == pytest.approx(m.mean_power_w, rel=0.02)  # the monitor's end readings


def test_predicted_profile_skips_batch_sizes_that_do_not_fit(small_workload: Workload) -> None:
    fat = Workload("fat", (3, 32, 32), 1e9, NANO.training_memory_bytes / 100, 1e6, kernels_per_step=50)
    profile = predicted_profile("jetson-nano", fat, [64, 128], samples=1000)
    assert profile.batch_sizes() == [64]
    assert [s["batch_size"] for s in profile.skipped] == [128]
    assert "out of memory" in profile.skipped[0]["reason"]


def test_predicted_profile_round_trips_through_the_file(tmp_path: Path, small_workload: Workload) -> None:
    p = predicted_profile("jetson-tx2nx", small_workload, [8], samples=500)
    p.save(tmp_path / "p.json")
    again = Profile.load(tmp_path / "p.json")
    assert again.extra["predicted"] is True and again.to_dict() == p.to_dict()


# --- the stored table -------------------------------------------------------------------------------------


def test_stored_state_of_practice_table_equals_its_derivation(paper_workloads: dict[str, Workload]) -> None:
    for name in board_names():
        board = board_model(name)
        table = board.state_of_practice
        assert table is not None, name
        assert set(table.models) == set(paper_workloads) and table.batch_sizes == (4, 8, 16, 32, 64, 128)
        derived = derive_peak_training_power(
            board, [paper_workloads[m] for m in table.models], table.batch_sizes
        )
        assert list(table.peak_training_power_w) == pytest.approx(derived, abs=1e-3), (
            f"{name}: boards.yaml's state_of_practice table is stale; run python bench/derive_caps.py --write"
        )


def test_the_table_is_less_strict_than_full_load_sgemm() -> None:
    # the paper's rule gives higher fixed frequencies than SGEMM (the old proxy), never lower
    for name in board_names():
        b = board_model(name)
        assert b.state_of_practice is not None
        for sop, sgemm in zip(b.state_of_practice.peak_training_power_w, b.full_load_power_w, strict=True):
            assert sop <= sgemm
    assert NANO.fixed_frequency_cap(5.0) == 768_000_000  # SGEMM: 614.4 MHz
    assert board_model("jetson-tx2nx").fixed_frequency_cap(3.0) is not None  # the demo's 3 W cap works


# --- the commands -----------------------------------------------------------------------------------------


def test_profile_predicted_then_caps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    paths = []
    for model in ("cnn-tiny", "chartransformer-small"):
        out = tmp_path / f"{model}.json"
        code, text, err = run(
            capsys, "profile", "--device", "sim:jetson-nano", "--model", model, "--out", str(out),
            "--batch-sizes", "4,16,64", "--predicted",
        )  # fmt: skip
        assert code == 0, err
        assert "predicted" in text
        data = json.loads(out.read_text())
        assert data["predicted"] is True and len(data["points"]) == 3 * len(NANO.frequencies_hz)
        paths.append(out)
    profiles = [Profile.load(p) for p in paths]
    code, text, err = run(
        capsys, "caps", "--profile", str(paths[0]), "--profile", str(paths[1]), "--power-cap", "3.5", "--json"
    )
    assert code == 0, err
    got = json.loads(text)
    assert got["power_cap_w"] == 3.5 and got["frequency_hz"] == frequency_cap(profiles, 3.5)
    assert all(
        p.peak_power_w <= 3.5 for pr in profiles for p in pr.points if p.frequency_hz == got["frequency_hz"]
    )
    code, text, err = run(capsys, "caps", "--profile", str(paths[0]), "--power-cap", "3.5")
    assert code == 0 and "MHz" in text


def test_caps_with_no_feasible_frequency_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    assert main(["profile", "--device", "sim:jetson-nano", "--model", "cnn-tiny", "--out", str(out),
                 "--batch-sizes", "64", "--predicted"]) == 0  # fmt: skip
    capsys.readouterr()
    code, text, err = run(capsys, "caps", "--profile", str(out), "--power-cap", "1.0")
    assert code == 2 and text == "" and err.count("\n") == 1 and "raise the cap" in err


def test_predicted_with_no_pin_is_the_clock_in_force_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 36, class 8: `--no-pin` holds for `--predicted` too, as for a measured profile: the board
    model's points at the one clock in force (the governor's ceiling), marked unpinned."""
    out = tmp_path / "p.json"
    code, _, err = run(
        capsys, "profile", "--device", "sim:jetson-nano", "--model", "cnn-tiny", "--out", str(out),
        "--batch-sizes", "4,16", "--predicted", "--no-pin",
    )  # fmt: skip
    assert code == 0, err
    data = json.loads(out.read_text())
    assert data["pinned"] is False and {p["frequency_hz"] for p in data["points"]} == {
        max(NANO.frequencies_hz)
    }
    assert sorted(p["batch_size"] for p in data["points"]) == [4, 16]


@pytest.mark.parametrize("device", ["host", "jetson-nano", "nvml:0"])
def test_predicted_is_refused_for_devices_that_are_measured(
    device: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    code, _, err = run(
        capsys, "profile", "--device", device, "--model", "cnn-tiny", "--out", str(out), "--predicted"
    )
    assert code == 2 and err.count("\n") == 1 and "sim:NAME" in err and not out.exists()
