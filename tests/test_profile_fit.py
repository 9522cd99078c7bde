"""The fitted profiling order: the fit, predict-then-confirm on simulated boards, provenance, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fl_server.run_config import RunConfigError, parse_server_config
from powerctl.devices.boards import board_model
from powerctl.devices.simulated import SimulatedBoard
from powerctl.errors import FileFormatError, InfeasibleCapError
from powerctl.profiling.fit import ProfileFit, _nonneg_lstsq, fit_profile, seed_frequencies
from powerctl.profiling.profiler import Profiler
from powerctl.records.profile import Profile, ProfilePoint
from powerctl.records.relation import RelationVector
from powerctl.records.workload import Workload
from powerctl.selection.joint import select
from powerfed.training.powerctl_cli import main

BATCHES = [4, 8, 16, 32, 64, 128]
NANO = board_model("jetson-nano").frequencies_hz
RELATION = {4: 1.8, 8: 1.45, 16: 1.0, 32: 1.0, 64: 1.4, 128: 2.1}
"""Samples-to-target shape of bench/profiling_cost.py (vision); × 1000 samples."""


def _noop(batch_size: int):
    return lambda: None  # the simulated board charges the workload's cost, not the step's CPU work


def _relation(model: str) -> RelationVector:
    return RelationVector.from_samples(model, "proxy", 0.5, {b: 1000.0 * r for b, r in RELATION.items()})


def _profile(board: str, workload: Workload, order: str, cap: float | None, *, seed: int = 0, noise=True):
    return Profiler(
        SimulatedBoard(board_model(board), seed=seed, noise=noise),
        workload,
        _noop,
        samples=2100,
        warmup_steps=1,
        measure_steps=2,
    ).run(
        BATCHES,
        order=order,
        power_cap_w=cap,
        relation=_relation(workload.model).as_map() if order == "fitted" else None,
        progress=False,
    )


# --- the fit ---------------------------------------------------------------------------------------


def _truth() -> ProfileFit:
    return ProfileFit(
        f_max_hz=NANO[-1],
        p0_w=2.1,
        d1_w=2.0,
        d3_w=4.0,
        utilisation={4: 0.3, 8: 0.45, 16: 0.6, 32: 0.8, 64: 0.93, 128: 1.0},
        g0_s=0.03,
        g1_s=0.001,
        alpha_s=0.0015,
        beta_s=0.004,
        mean_to_peak=0.9,
    )


def _seed_points(truth: ProfileFit, noise: float, rng: np.random.Generator) -> list[ProfilePoint]:
    pairs = [(128, f) for f in seed_frequencies(NANO)] + [
        (b, NANO[i]) for b, i in zip(BATCHES, (11, 9, 7, 5, 3), strict=False)
    ]
    out = []
    for b, f in pairs:
        p = truth.predict(b, f, 1000)
        k_w, k_s = 1 + noise * rng.standard_normal(2)
        out.append(
            ProfilePoint(
                b,
                f,
                p.peak_power_w * k_w,
                p.mean_power_w * k_w,
                p.seconds_per_batch * k_s,
                p.seconds_for_samples * k_s,
            )
        )
    return out


def test_the_fit_recovers_a_known_grid_from_eight_points() -> None:
    truth = _truth()
    fit = fit_profile(_seed_points(truth, 0.0, np.random.default_rng(0)), NANO[-1])
    for b in BATCHES:
        for f in NANO:
            assert fit.peak_power_w(b, f) == pytest.approx(truth.peak_power_w(b, f), rel=1e-6)
            assert fit.seconds_per_batch(b, f) == pytest.approx(truth.seconds_per_batch(b, f), rel=1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_with_one_percent_noise_the_fit_is_close_but_not_exact(seed: int) -> None:
    """Why the profiler confirms: one noisy point per smaller batch leaves errors of a few percent."""
    truth = _truth()
    fit = fit_profile(_seed_points(truth, 0.01, np.random.default_rng(seed)), NANO[-1])
    power = [abs(fit.peak_power_w(b, f) / truth.peak_power_w(b, f) - 1) for b in BATCHES for f in NANO]
    time = [
        abs(fit.seconds_per_batch(b, f) / truth.seconds_per_batch(b, f) - 1) for b in BATCHES for f in NANO
    ]
    assert np.median(power) < 0.03 and np.median(time) < 0.03
    assert max(power) < 0.25 and max(time) < 0.1


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    coef=st.tuples(*[st.sampled_from([0.0, 1e-4, 1e-3, 1e-2]) for _ in range(4)]),
    seed=st.integers(0, 2**32 - 1),
)
def test_nonneg_lstsq_is_the_least_squares_optimum_on_fitted_order_problems(
    coef: tuple[float, ...], seed: int
) -> None:
    """Step time = c0 + c1·b + (c2·b + c3·√b)/x with 3 % noise, laid out as the fitted order measures it
    (the largest batch at three clocks, three smaller batches at one clock each) and solved as the fit does
    (relative rows). The answer meets the optimality conditions of the bounded problem (≥ 0; no gradient
    on a positive coefficient; none pointing below zero on a zero one), so no feasible fit is better."""
    rng = np.random.default_rng(seed)
    b = np.array([128.0, 128.0, 128.0, 64.0, 16.0, 4.0])
    x = np.concatenate([[1 / 3, 2 / 3, 1.0], rng.uniform(0.2, 1.0, 3)])
    c0, c1, c2, c3 = coef
    step = (c0 + c1 * b + (c2 * b + c3 * np.sqrt(b)) / x + 1e-5) * (1 + 0.03 * rng.standard_normal(6))
    a = np.column_stack([np.ones_like(b), b, b / x, np.sqrt(b) / x]) / step[:, None]
    y = np.ones_like(step)
    got = _nonneg_lstsq(a, y)
    grad = a.T @ (a @ got - y)
    scale = float(np.linalg.norm(a, axis=0).max() * np.linalg.norm(y))
    assert (got >= 0).all()
    assert np.all(np.abs(grad[got > 0]) <= 1e-7 * scale)
    assert np.all(grad[got == 0] >= -1e-7 * scale)


def test_nonneg_lstsq_keeps_the_columns_the_optimum_keeps() -> None:
    """Six fitted-order step times whose unbounded fit has c0 and c2 negative, c0 the more so: dropping
    the most negative column and solving again ends at c0 = c2 = 0, while the optimum keeps c0 > 0 and
    drops only c2, with a smaller residual."""
    b = np.array([128.0, 128.0, 128.0, 64.0, 16.0, 4.0])
    x = np.array([1 / 3, 2 / 3, 1.0, 0.97, 0.78, 0.63])
    step = np.array([0.3479, 0.1838, 0.1269, 0.0947, 0.0512, 0.0317])
    a = np.column_stack([np.ones_like(b), b, b / x, np.sqrt(b) / x]) / step[:, None]
    y = np.ones_like(step)
    got = _nonneg_lstsq(a, y)
    assert got[0] == pytest.approx(3.6864e-4, rel=1e-3) and got[2] == 0.0
    assert float(np.sum((a @ got - y) ** 2)) == pytest.approx(0.0034440, rel=1e-4)


def test_the_fit_needs_the_largest_batch_at_two_frequencies() -> None:
    one = [_truth().predict(128, NANO[-1], 1000), _truth().predict(16, NANO[3], 1000)]
    for points in (one, []):
        with pytest.raises(ValueError, match=r"largest batch size measured at 2 or more"):
            fit_profile(points, NANO[-1])


# --- the fitted order on simulated boards ---------------------------------------------------------------


@pytest.mark.parametrize("board", ["jetson-nano", "jetson-tx2nx"])
def test_noise_free_fitted_order_chooses_what_the_grid_chooses_for_far_less(
    board: str, paper_workloads
) -> None:
    for model, workload in paper_workloads.items():
        grid = _profile(board, workload, "grid", None, noise=False)
        relation = _relation(model)
        for cap in (3.0, 3.5, 4.0, 5.0, 6.5, None):
            fitted = _profile(board, workload, "fitted", cap, noise=False)
            try:
                want = select(grid, relation, cap)
            except InfeasibleCapError:
                with pytest.raises(InfeasibleCapError):
                    select(fitted, relation, cap)
                continue
            got = select(fitted, relation, cap)
            assert (got.batch_size, got.frequency_hz) == (want.batch_size, want.frequency_hz), (model, cap)
            assert len(fitted.points) <= len(grid.points) / 4
            assert fitted.profiling_s < grid.profiling_s / 2  # low caps: slow low-clock points
            # every pair of the grid is either measured or predicted, never both
            measured = {(p.batch_size, p.frequency_hz) for p in fitted.points}
            predicted = {(p.batch_size, p.frequency_hz) for p in fitted.predicted}
            assert not measured & predicted
            assert measured | predicted == {(p.batch_size, p.frequency_hz) for p in grid.points}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    board=st.sampled_from(["jetson-nano", "jetson-tx2nx"]),
    model=st.sampled_from(["resnet18", "mobilenetv2", "chartransformer"]),
    cap=st.floats(1.5, 10.0),
    seed=st.integers(0, 10_000),
    relation=st.lists(st.floats(0.5, 5.0), min_size=6, max_size=6),
)
def test_the_chosen_pair_is_always_measured_under_the_cap(
    board, model, cap, seed, relation, paper_workloads
) -> None:
    workload = paper_workloads[model]
    r = dict(zip(BATCHES, relation, strict=True))
    prof = Profiler(
        SimulatedBoard(board_model(board), seed=seed),
        workload,
        _noop,
        samples=1000,
        warmup_steps=1,
        measure_steps=2,
    ).run(BATCHES, order="fitted", power_cap_w=cap, relation=r, progress=False)
    grid_size = len(board_model(board).frequencies_hz) * len(BATCHES)
    assert len(prof.points) < grid_size / 3
    try:
        choice = select(prof, RelationVector.from_samples(model, "p", 0.5, r), cap)
    except InfeasibleCapError:
        # only once the least-power pair of every batch size was measured over the cap
        lowest = min(board_model(board).frequencies_hz)
        assert all(p.peak_power_w > cap for p in prof.points)
        assert any(p.frequency_hz == lowest for p in prof.points)
        return
    point = prof.point(choice.batch_size, choice.frequency_hz)
    assert point is not None and point.peak_power_w <= cap  # measured, under the cap
    assert all(
        (p.batch_size, p.frequency_hz) != (choice.batch_size, choice.frequency_hz) for p in prof.predicted
    )


# --- provenance in the file ------------------------------------------------------------------------


def test_measured_and_predicted_points_round_trip_and_old_files_still_load(
    tmp_path: Path, small_workload
) -> None:
    prof = _profile("jetson-tx2nx", small_workload, "fitted", 4.0)
    assert prof.points and prof.predicted and prof.extra["order"] == "fitted"
    prof.save(tmp_path / "fitted.json")
    back = Profile.load(tmp_path / "fitted.json")
    assert back.points == tuple(ProfilePoint(**{**p.to_dict()}) for p in prof.points) and len(
        back.predicted
    ) == len(prof.predicted)
    assert {(p.batch_size, p.frequency_hz) for p in back.predicted} == {
        (p.batch_size, p.frequency_hz) for p in prof.predicted
    }
    assert all(back.point(p.batch_size, p.frequency_hz) is not None for p in back.points)
    assert not any(back.point(p.batch_size, p.frequency_hz) is not None for p in back.predicted)
    assert back.extra["fit"]["utilisation"] and "predicted_points" not in back.extra

    old = json.loads((tmp_path / "fitted.json").read_text())
    del old["predicted_points"]  # a file written before provenance existed: every point measured
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert Profile.load(tmp_path / "old.json").predicted == ()

    both = json.loads((tmp_path / "fitted.json").read_text())
    both["predicted_points"].append(both["points"][0])  # measured and predicted at once
    (tmp_path / "both.json").write_text(json.dumps(both))
    with pytest.raises(FileFormatError, match=r"predicted_points\[\d+\]: duplicate point"):
        Profile.load(tmp_path / "both.json")


# --- command line and run config ---------------------------------------------------------------------


def test_cli_fitted_order_writes_provenance_and_select_picks_a_measured_pair(tmp_path: Path, capsys) -> None:
    relation = tmp_path / "relation.json"
    RelationVector.from_samples("cnn-tiny", "proxy", 0.8, {4: 900.0, 16: 1400.0, 64: 3000.0}).save(relation)
    out = tmp_path / "p.json"
    base = ["profile", "--device", "sim:jetson-nano", "--model", "cnn-tiny", "--batch-sizes", "4,16,64"]
    base += ["--samples", "2000", "--warmup", "1", "--steps", "1", "--quiet"]
    code = main(
        [*base, "--order", "fitted", "--power-cap", "3", "--relation", str(relation), "--out", str(out)]
    )
    printed = capsys.readouterr().out
    assert code == 0 and "measured" in printed and "predicted (fitted)" in printed
    data = json.loads(out.read_text())
    assert data["order"] == "fitted" and len(data["points"]) + len(data["predicted_points"]) == 3 * 12
    assert (
        main(["select", "--profile", str(out), "--relation", str(relation), "--power-cap", "3", "--json"])
        == 0
    )
    choice = json.loads(capsys.readouterr().out)
    measured = {(p["batch_size"], p["frequency_hz"]): p["peak_power_w"] for p in data["points"]}
    assert measured[choice["batch_size"], choice["frequency_hz"]] <= 3.0

    other = tmp_path / "other.json"
    RelationVector.from_samples("resnet18", "proxy", 0.8, {4: 1.0, 16: 2.0}).save(other)
    for extra, words in [
        (["--order", "grid", "--relation", str(relation)], "--relation is for --order fitted"),
        (["--order", "fitted", "--relation", str(other)], "is of model 'resnet18', not 'cnn-tiny'"),
        (["--order", "fitted", "--relation", str(tmp_path / "missing.json")], "no such file"),
        (["--order", "fitted", "--predicted"], "drop --order fitted"),
    ]:
        code = main([*base, *extra, "--out", str(tmp_path / "x.json")])
        err = capsys.readouterr().err
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "x.json").exists()


def test_run_config_takes_the_fitted_order() -> None:
    assert parse_server_config({"profile-order": "fitted"}).profile_order == "fitted"
    with pytest.raises(
        RunConfigError, match="'profile-order' must be one of efficient, grid, fitted, got 'guessed'"
    ):
        parse_server_config({"profile-order": "guessed"})


def test_a_client_round_with_the_fitted_order_runs_a_measured_pair_and_caches_it() -> None:
    from fl_client.local_data import data_plan, load_local_data
    from fl_client.node import resolve_node
    from fl_client.round import RoundWork, run_round
    from tests.fl_helpers import RUN_CONFIG, initial_state, instructions

    settings = resolve_node({"partition-id": 0, "num-partitions": 3}, RUN_CONFIG)  # sim:jetson-nano at 3 W
    data = load_local_data(data_plan(settings, RUN_CONFIG, 64))
    fitted = instructions(profile_order="fitted", profile_warmup=1)
    report = run_round(RoundWork(settings, fitted, initial_state(), data, device_seed=1)).report
    assert report.profiled_peak_power_w <= 3.0 and not report.profiling.profile_cached
    again = run_round(RoundWork(settings, fitted, initial_state(), data, device_seed=1)).report
    assert again.profiling.profile_cached and (again.batch_size, again.frequency_hz) == (
        report.batch_size,
        report.frequency_hz,
    )
    other = instructions(profile_order="fitted", profile_warmup=1, relation_samples=[300.0, 200.0])
    moved = run_round(RoundWork(settings, other, initial_state(), data, device_seed=1)).report
    assert (
        not moved.profiling.profile_cached
    )  # another relation vector: the fitted order confirms other pairs
