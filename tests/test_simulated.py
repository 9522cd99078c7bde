"""The simulated board: the trade-off the method exploits, memory limits, seeded noise, knobs."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from powerctl.devices import open_device
from powerctl.devices.boards import BoardModel, board_model
from powerctl.devices.simulated import SimulatedBoard, step_cost, top_clock_time_ratio
from powerctl.errors import DeviceError, DeviceOutOfMemory
from powerctl.profiling.monitor import PowerMonitor
from powerctl.records.workload import Workload, measure_workload

NANO = board_model("jetson-nano")


def _cnn(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, 10),
    )


def _workload(width: int) -> Workload:
    model = _cnn(width)
    x, y = torch.randn(2, 3, 32, 32), torch.randint(0, 10, (2,))
    return measure_workload(model, x, y, nn.functional.cross_entropy, f"cnn{width}")


@pytest.fixture(scope="module")
def big() -> Workload:
    return _workload(128)


def test_larger_batch_is_faster_per_sample_but_draws_more_power(big: Workload) -> None:
    f = NANO.frequencies_hz[-1]
    costs = [step_cost(NANO, big, b, f) for b in (4, 16, 64, 256)]
    per_sample = [c.seconds / b for c, b in zip(costs, (4, 16, 64, 256), strict=True)]
    powers = [c.compute_w for c in costs]
    assert per_sample == sorted(per_sample, reverse=True)
    assert powers == sorted(powers) and powers[-1] > powers[0] + 1.0


def test_under_a_cap_a_larger_batch_forces_a_lower_frequency(big: Workload) -> None:
    cap = 5.0

    def highest_feasible(b: int) -> int:
        ok = [f for f in NANO.frequencies_hz if step_cost(NANO, big, b, f).compute_w <= cap]
        return ok[-1]

    assert highest_feasible(256) < highest_feasible(8)


def test_power_never_exceeds_full_load_sgemm_power(big: Workload) -> None:
    for f in NANO.frequencies_hz:
        for b in (1, 64, 4096):
            assert step_cost(NANO, big, b, f).compute_w <= NANO.full_load_power(f)


def test_a_bigger_network_takes_longer_and_draws_more(big: Workload) -> None:
    small = _workload(16)
    assert small.flops_per_sample < big.flops_per_sample
    f = NANO.frequencies_hz[-1]
    s, b = step_cost(NANO, small, 32, f), step_cost(NANO, big, 32, f)
    assert b.seconds > s.seconds and b.compute_w > s.compute_w


def test_run_step_runs_the_real_step_and_charges_the_virtual_clock(big: Workload) -> None:
    dev = SimulatedBoard(NANO, seed=0, noise=False)
    calls = []
    assert dev.run_step(lambda: calls.append(1) or "out", batch_size=32, workload=big) == "out"
    assert calls == [1]
    assert dev.clock() == pytest.approx(dev.predict(big, 32).seconds)


def test_a_batch_that_does_not_fit_is_refused_before_running(big: Workload) -> None:
    dev = open_device("sim:jetson-nano")
    too_many = int(dev.memory_bytes() / big.activation_bytes_per_sample) + 1
    ran = []
    with pytest.raises(DeviceOutOfMemory, match=f"batch size {too_many}"):
        dev.run_step(lambda: ran.append(1), batch_size=too_many, workload=big)
    assert ran == [] and dev.clock() == 0.0


def test_monitor_energy_matches_the_model(big: Workload) -> None:
    dev = SimulatedBoard(NANO, seed=1, noise=False)
    f = NANO.frequencies_hz[6]
    with dev.pinned(f), PowerMonitor(dev) as mon:
        for _ in range(10):
            dev.run_step(lambda: None, batch_size=32, workload=big)
    c = step_cost(NANO, big, 32, f)
    assert mon.reading is not None
    assert mon.reading.energy_j == pytest.approx(10 * (c.compute_s * c.compute_w + c.fixed_s * c.fixed_w))
    assert mon.reading.peak_w == pytest.approx(c.compute_w)
    assert mon.reading.seconds == pytest.approx(10 * c.seconds)


def test_noise_is_seeded(big: Workload) -> None:
    def trace(seed: int) -> list[float]:
        dev = open_device("sim:jetson-nano", seed=seed)
        out = []
        for _ in range(5):
            dev.run_step(lambda: None, batch_size=16, workload=big)
            out += [dev.clock(), dev.read_power_w()]
        return out

    assert trace(3) == trace(3)
    assert trace(3) != trace(4)


def test_pin_and_restore() -> None:
    dev = open_device("sim:jetson-tx2nx")
    top = dev.current_frequency()
    with dev.pinned(dev.frequencies()[2]):
        assert dev.current_frequency() == dev.frequencies()[2]
    assert dev.current_frequency() == top and not dev.is_pinned
    with pytest.raises(DeviceError, match="not a frequency"):
        dev.pin_frequency(123)


def test_unknown_simulated_board() -> None:
    with pytest.raises(DeviceError, match="sim:jetson-nano"):
        open_device("sim:jetson-agx-thor")


# --- the shape facts of the paper (issue 10) -----------------------------------------------------------

TX2 = board_model("jetson-tx2nx")


def _slowdown(board: BoardModel, w: Workload, b: int, hi: int, lo: int) -> float:
    return step_cost(board, w, b, lo).seconds / step_cost(board, w, b, hi).seconds


def test_small_batches_slow_down_less_when_the_clock_is_lowered(paper_workloads: dict[str, Workload]) -> None:
    # paper, ResNet18, no cap → low cap: Nano 2.32x at b=128 vs 1.95x at the proxy-best batch;
    # TX2 NX 2.43x vs 1.80x
    resnet = paper_workloads["resnet18"]
    nano = _slowdown(NANO, resnet, 128, 921_600_000, 384_000_000) / _slowdown(
        NANO, resnet, 16, 921_600_000, 384_000_000
    )
    assert 1.10 <= nano <= 1.35
    tx2 = _slowdown(TX2, resnet, 128, 1_300_500_000, 522_750_000) / _slowdown(
        TX2, resnet, 16, 1_300_500_000, 522_750_000
    )
    assert 1.10 <= tx2 <= 1.45 and tx2 > nano  # a faster GPU with a CPU only 1.4x faster: more launch-bound


def test_the_tx2nx_is_built_from_the_nano_and_its_own_specifications() -> None:
    assert TX2.gflops_per_ghz == pytest.approx(NANO.gflops_per_ghz * 2)
    assert TX2.launch_s == pytest.approx(NANO.launch_s * 1.43 / 2.0)
    assert list(TX2.full_load_power_w) == sorted(TX2.full_load_power_w)
    assert TX2.full_load_power_w[0] > TX2.idle_power_w


def test_the_tx2nx_is_calibrated_to_the_papers_time_ratio(paper_workloads: dict[str, Workload]) -> None:
    # the paper's state of practice without a cap (ResNet18, b=128, top clocks): Nano / TX2 NX ≈ 2.05
    cal = TX2.calibration
    assert cal is not None
    ref, w = board_model(cal.reference), paper_workloads[cal.model]
    assert top_clock_time_ratio(ref, TX2, w, cal.batch_size) == pytest.approx(
        cal.paper_time_ratio(), rel=0.05
    )
    # the calibrated constants are what bring it there: with the Nano's values the TX2 NX is far too fast
    tuned = [k for k in TX2.sources if TX2.source_kind(k) == "estimated, calibrated"]
    assert tuned == ["max_utilisation"]
    spec_only = dataclasses.replace(TX2, **{k: getattr(ref, k) for k in tuned})
    assert top_clock_time_ratio(ref, spec_only, w, cal.batch_size) > 1.10 * cal.paper_time_ratio()


def test_the_small_batch_end_follows_the_two_boards_physics(all_workloads: dict[str, Workload]) -> None:
    # not tuned: a small step is launch- and CPU-bound and gains about the CPU's speed-up (1.4x: the launch
    # path on a 2.0 GHz A57 vs a 1.43 GHz one), a large one the GPU's; never more than the GPU's peak ratio
    cpu = NANO.launch_s / TX2.launch_s
    peak = (TX2.gflops_per_ghz * TX2.frequencies_hz[-1]) / (NANO.gflops_per_ghz * NANO.frequencies_hz[-1])
    for name, w in all_workloads.items():
        sizes = [b for b in (4, 8, 16, 32, 64, 128) if w.memory_bytes(b) <= NANO.training_memory_bytes]
        ratios = [top_clock_time_ratio(NANO, TX2, w, b) for b in sizes]
        assert ratios == sorted(ratios), (name, ratios)
        assert cpu <= ratios[0] and ratios[-1] < peak, (name, ratios)
        assert ratios[0] - cpu < ratios[-1] - ratios[0], (name, ratios)  # nearer the CPU's than the large end


@pytest.mark.parametrize("board", [NANO, TX2], ids=lambda b: b.name)
def test_every_shipped_model_shows_the_trade_off(
    board: BoardModel, all_workloads: dict[str, Workload]
) -> None:
    # peak power grows with the batch size and time per sample falls, at the top clock and at a low one
    for name, w in all_workloads.items():
        for hz in (board.frequencies_hz[-1], board.frequencies_hz[3]):
            sizes = [b for b in (4, 8, 16, 32, 64, 128) if w.memory_bytes(b) <= board.training_memory_bytes]
            costs = [step_cost(board, w, b, hz) for b in sizes]
            peaks = [c.peak_w for c in costs]
            per_sample = [c.seconds / b for c, b in zip(costs, sizes, strict=True)]
            # the rise spans a fifth or more of what training can draw above idle (max_utilisation of the
            # full-load range; the TX2 NX's training reaches less of its SGEMM peak than the Nano's)
            trainable = board.max_utilisation * (board.full_load_power(hz) - board.idle_power_w)
            assert peaks == sorted(peaks) and peaks[-1] > peaks[0] + 0.19 * trainable, (name, hz, peaks)
            assert per_sample == sorted(per_sample, reverse=True), (name, hz, per_sample)
