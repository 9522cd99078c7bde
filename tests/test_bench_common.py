"""bench/bench_common.py: what several benches share prints as each bench printed it, and a run's
process-tree memory counts each process once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import bench_common  # noqa: E402


def test_mean_plus_minus_std_is_one_value_alone_and_sample_std_otherwise() -> None:
    assert bench_common.mean_pm([3.14159]) == "3.14"
    assert bench_common.mean_pm([1.0, 2.0, 3.0], ".1f") == "2.0 ± 1.0"
    assert bench_common.mean_pm([2, 2], ".1f") == "2.0 ± 0.0"  # integers (switches, pauses) as well
    assert bench_common.mean_std([5.0]) == (5.0, 0.0)


def test_tree_memory_counts_each_process_once() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        memory = bench_common.TreeMemory(port=1, every_s=0.05)  # nothing listens on port 1
        memory.roots += [os.getpid(), os.getpid(), child.pid]  # the same root twice, its child below it
        memory.start()
        deadline = time.monotonic() + 30
        while not memory.samples and time.monotonic() < deadline:
            time.sleep(0.05)
        memory.stop.set()
        memory.join()
        tree = [os.getpid(), child.pid]
        expected = sum(bench_common.rss_bytes(p) for p in tree)
        _, total, largest = memory.samples[0]
        assert 0 < largest <= total < 1.5 * expected  # counted twice, it would be about twice as much
        assert memory.peak == max(s[1] for s in memory.samples)
    finally:
        child.kill()
        child.wait()
