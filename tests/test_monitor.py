"""Power monitor arithmetic and the real-time (threaded) sampler."""

from __future__ import annotations

import pytest

from powerctl.devices.base import ThreadSampler
from powerctl.errors import DeviceError
from powerctl.profiling.monitor import summarize


def test_summary_of_a_step_function() -> None:
    # 2 W for 1 s then 6 W for 3 s, read at every change (as the simulated sensor does)
    samples = [(0.0, 2.0), (1.0, 2.0), (1.0, 6.0), (4.0, 6.0)]
    r = summarize(samples)
    assert r.energy_j == pytest.approx(2 + 18)
    assert r.mean_w == pytest.approx(20 / 4)
    assert r.peak_w == 6.0 and r.seconds == 4.0


def test_trapezoid_on_a_ramp() -> None:
    r = summarize([(0.0, 0.0), (2.0, 4.0)])
    assert r.energy_j == pytest.approx(4.0) and r.mean_w == pytest.approx(2.0)


def test_no_samples_is_an_error() -> None:
    with pytest.raises(ValueError):
        summarize([])


def test_thread_sampler_polls_at_its_rate() -> None:
    t = [0.0]

    def clock() -> float:
        return t[0]

    def read() -> float:
        t[0] += 0.01  # each reading takes the fake clock 10 ms forward
        return 5.0

    s = ThreadSampler(read, clock, rate_hz=1000)
    s.start()
    import time

    time.sleep(0.05)
    samples = s.stop()
    assert len(samples) >= 3
    assert all(w == 5.0 for _, w in samples)
    assert [ts for ts, _ in samples] == sorted(ts for ts, _ in samples)


def test_a_failing_sensor_is_reported() -> None:
    def read() -> float:
        raise OSError("i2c bus error")

    s = ThreadSampler(read, lambda: 0.0, rate_hz=100)
    s.start()
    with pytest.raises(DeviceError, match="i2c bus error"):
        s.stop()


def test_a_block_not_kept_reads_none_and_new_samples_are_each_steps_own() -> None:
    from powerctl.devices.simulated import SimulatedBoard
    from powerctl.profiling.monitor import PowerMonitor
    from powerctl.records.workload import Workload

    board = SimulatedBoard.open("jetson-nano", seed=0)
    wl = Workload("m", (3, 8, 8), 1e6, 1e3, 1e4)
    mon = PowerMonitor(board)
    mon.start()
    board.run_step(lambda: None, batch_size=4, workload=wl)
    first = mon.new_samples()
    board.run_step(lambda: None, batch_size=4, workload=wl)
    second = mon.new_samples()
    assert len(first) >= 2 and second and second[0][0] >= first[-1][0] and mon.new_samples() == []
    kept = mon.stop()
    assert kept is not None and mon.reading is kept and mon.new_samples() == []
    mon.start()  # a second block, dropped: no reading, not the first block's
    board.run_step(lambda: None, batch_size=4, workload=wl)
    assert len(mon.new_samples()) >= 3  # the new block's own, from its start
    assert mon.stop(keep=False) is None and mon.reading is None
    assert mon.stop() is None  # not sampling: nothing to read
