"""A real-board profile killed mid-way leaves the board exactly as it found it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fake_boards import NANO_DEVFREQ, default_signals, make_nano_tree, tree_snapshot


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_profile_interrupted_on_a_jetson_restores_the_frequency(tmp_path: Path, sig: signal.Signals) -> None:
    root = make_nano_tree(tmp_path / "nano")
    before = tree_snapshot(root)
    min_freq = root / NANO_DEVFREQ / "min_freq"
    env = dict(os.environ, POWERCTL_SYSFS_ROOT=str(root))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "powerfed.training.powerctl_cli",
            "profile",
            "--device",
            "jetson",
            "--model",
            "cnn-tiny",
            "--batch-sizes",
            "4,8",
            "--steps",
            "200",
            "--quiet",
            "--out",
            str(tmp_path / "p.json"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_signals,
    )
    try:
        deadline = time.monotonic() + 120
        while min_freq.read_bytes() == before[str(min_freq.relative_to(root))]:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the profiler never pinned a frequency"
            time.sleep(0.05)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "Traceback" not in err
    assert tree_snapshot(root) == before
    assert not (tmp_path / "p.json").exists()


def test_a_guard_inside_a_guard_of_the_same_device_keeps_the_outer_ones_exit_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import types

    from powerctl.pinning import safety

    hooks: list = []  # atexit's own list cannot be read: a stand-in with its semantics

    def unregister(fn: object) -> None:  # atexit.unregister removes every hook equal to fn
        hooks[:] = [h for h in hooks if h != fn]

    monkeypatch.setattr(safety, "atexit", types.SimpleNamespace(register=hooks.append, unregister=unregister))

    class Board:
        restores = 0

        def restore(self) -> None:
            self.restores += 1

    board = Board()
    before = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)]
    with safety.restore_on_exit(board):
        with safety.restore_on_exit(board):
            assert len(hooks) == 2
        assert len(hooks) == 1  # the outer guard still restores the board at exit
        assert signal.getsignal(signal.SIGTERM) not in before
    assert hooks == [] and board.restores == 2
    assert [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)] == before
