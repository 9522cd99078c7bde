"""Profiler on simulated boards: grid, efficient order, out-of-memory skips, restore, cost."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from powerctl.devices import open_device
from powerctl.devices.boards import board_model
from powerctl.devices.simulated import SimulatedBoard
from powerctl.errors import DeviceError
from powerctl.profiling.profiler import Profiler
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerctl.records.workload import Workload, measure_workload
from powerctl.selection.joint import select

BATCHES = [4, 8, 16, 32]


@pytest.fixture(scope="module")
def model_and_workload() -> tuple[nn.Module, Workload]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 32 * 32, 10))
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    w = measure_workload(model, x, y, nn.functional.cross_entropy, "conv8")
    # the real conv is tiny; charge it as a ResNet-sized network so power varies over the grid
    return model, Workload("conv8", w.input_shape, 1.5e9, w.activation_bytes_per_sample, w.parameter_bytes)


def _factory(model: nn.Module, calls: list[int] | None = None):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def make_step(b: int):
        x, y = torch.randn(b, 3, 32, 32), torch.randint(0, 10, (b,))

        def step() -> None:
            if calls is not None:
                calls.append(b)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        return step

    return make_step


def test_grid_profile_covers_every_pair_and_runs_real_steps(model_and_workload) -> None:
    model, w = model_and_workload
    dev = open_device("sim:jetson-nano")
    calls: list[int] = []
    prof = Profiler(dev, w, _factory(model, calls), samples=1000, warmup_steps=1, measure_steps=2).run(
        [4, 32], progress=False
    )
    assert len(prof.points) == 2 * 12
    assert len(calls) == len(prof.points) * 3  # warm-up + measured steps all ran for real
    for b in (4, 32):
        row = sorted((p for p in prof.points if p.batch_size == b), key=lambda p: p.frequency_hz)
        # time falls and power rises as the frequency rises (beyond the 1 % noise)
        assert row[-1].seconds_per_batch < row[0].seconds_per_batch / 5
        assert row[-1].peak_power_w > row[0].peak_power_w
        assert all(p.seconds_for_samples == pytest.approx(p.seconds_per_batch * 1000 / b) for p in row)
    assert prof.profiling_s == pytest.approx(dev.clock())
    assert dev.current_frequency() == dev.frequencies()[-1] and not dev.is_pinned


def test_profile_json_round_trip(model_and_workload, tmp_path) -> None:
    model, w = model_and_workload
    dev = open_device("sim:jetson-tx2nx")
    prof = Profiler(dev, w, _factory(model), samples=500, measure_steps=1, warmup_steps=0).run(
        [8], progress=False
    )
    prof.save(tmp_path / "p.json")
    back = Profile.load(tmp_path / "p.json")
    assert back.device == "jetson-tx2nx" and back.model == "conv8" and back.input_shape == (3, 32, 32)
    assert [(p.batch_size, p.frequency_hz) for p in back.points] == [
        (p.batch_size, p.frequency_hz) for p in prof.points
    ]
    assert back.profiling_s == pytest.approx(prof.profiling_s)


def test_efficient_order_selects_what_the_grid_selects(model_and_workload) -> None:
    model, w = model_and_workload
    relation = RelationVector.from_samples("conv8", "proxy", 0.8, {4: 600.0, 8: 700.0, 16: 900.0, 32: 1300.0})
    grid = Profiler(
        SimulatedBoard(board_model("jetson-nano"), noise=False),
        w,
        _factory(model),
        samples=1000,
        warmup_steps=0,
        measure_steps=1,
    ).run(BATCHES, progress=False)
    for cap in (2.6, 3.5, 5.0, 8.0):
        fast = Profiler(
            SimulatedBoard(board_model("jetson-nano"), noise=False),
            w,
            _factory(model),
            samples=1000,
            warmup_steps=0,
            measure_steps=1,
        ).run(BATCHES, order="efficient", power_cap_w=cap, progress=False)
        assert len(fast.points) < len(grid.points)
        a, b = select(fast, relation, cap), select(grid, relation, cap)
        assert (a.batch_size, a.frequency_hz) == (b.batch_size, b.frequency_hz)
        assert a.predicted_s == pytest.approx(b.predicted_s)
        assert fast.profiling_s < grid.profiling_s


def test_batches_that_do_not_fit_are_skipped(model_and_workload) -> None:
    model, w = model_and_workload
    dev = open_device("sim:jetson-nano")
    fat = Workload("fat", w.input_shape, w.flops_per_sample, dev.memory_bytes() / 12, w.parameter_bytes)
    prof = Profiler(dev, fat, _factory(model), samples=100, warmup_steps=0, measure_steps=1).run(
        [4, 8, 16], progress=False
    )
    assert prof.batch_sizes() == [4, 8]
    assert [s["batch_size"] for s in prof.skipped] == [16]
    assert "out of memory" in prof.skipped[0]["reason"]


def test_frequency_restored_when_a_step_fails(model_and_workload) -> None:
    _, w = model_and_workload
    dev = open_device("sim:jetson-nano")
    before = dev.snapshot()
    n = [0]

    def make_step(b: int):
        def step() -> None:
            n[0] += 1
            if n[0] == 5:
                raise RuntimeError("kernel failed")

        return step

    with pytest.raises(RuntimeError, match="kernel failed"):
        Profiler(dev, w, make_step, samples=100, warmup_steps=1, measure_steps=1).run([4], progress=False)
    assert dev.snapshot() == before and not dev.is_pinned


def test_profiling_needs_a_knob_and_a_sensor(model_and_workload) -> None:
    model, w = model_and_workload
    with pytest.raises(DeviceError, match="no GPU frequency knob"):
        Profiler(open_device("host"), w, _factory(model), samples=10).run([4], progress=False)


def test_efficient_order_needs_a_cap(model_and_workload) -> None:
    model, w = model_and_workload
    with pytest.raises(ValueError, match="power cap"):
        Profiler(open_device("sim:jetson-nano"), w, _factory(model), samples=10).run(
            [4], order="efficient", progress=False
        )


def test_the_progress_bar_stays_out_of_a_log(model_and_workload, capsys, monkeypatch) -> None:
    """progress=True draws the bar only on a terminal: with stderr a file or a pipe (a log, a service's
    journal) nothing is written; on a terminal the bar is drawn."""
    model, w = model_and_workload
    profiler = Profiler(open_device("sim:jetson-nano"), w, _factory(model), samples=1000, measure_steps=1)
    profiler.run([4], frequencies=[76800000], progress=True)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr("sys.stderr.isatty", lambda: True)
    profiler.run([4], frequencies=[76800000], progress=True)
    assert "profiling sim:jetson-nano" in capsys.readouterr().err
