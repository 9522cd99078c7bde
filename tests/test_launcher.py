"""`make run` (`python -m simulations flwr-run`): inputs checked before anything starts, Flower's string
syntax, and Ctrl-C / SIGTERM stopping every process of the run by process id, the results left alone.
A whole `make run` in Flower's string syntax that ends with its results line and leaves nothing is
tests/test_repeatable_run.py's (one start-up pays for both)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fl_server.run_config import RunConfigError
from powerctl.errors import PowerctlError
from powerctl.procs import alive
from simulations.launcher import (
    check_launch,
    parse_run_config,
    run_config_text,
)
from simulations.local_superlink import descendants, free_port, pids_listening_on, stop_local_superlink
from strategies.fleet import MAX_BOARDS

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.executable).parent.parent

SMALL_RUN = (
    'model="cnn-tiny" num-server-rounds=1 relation-seeds="0" batch-sizes=\'8,16\' pretrain-samples=256 '
    "target-accuracy=0.3 budget-samples=96 eval-every-samples=32 eval-max-samples=64 profile-samples=512 "
    "profile-warmup=0 profile-steps=1"
)


TWO_BOARDS = """\
name: two-boards
groups:
  - {device: sim:jetson-nano, power-cap-w: 3.0}
  - {device: sim:jetson-tx2nx, power-cap-w: none}
task: {model: cnn-tiny, pretrain-samples: 256, target-accuracy: 0.3, batch-sizes: [8, 16]}
rounds: 1
seeds: {relation: [0]}
budget: {samples: 96}
profiling: {samples: 512, warmup: 0, steps: 1}
evaluation: {every-samples: 32, max-samples: 64}
methods: [ours, state-of-practice]
"""
"""A fleet whose task is SMALL_RUN's (its seeded cache serves it)."""


def _make_run(tmp_path: Path, port: int, nodes: str = "2", run_config: str = SMALL_RUN) -> list[str]:
    """`make run` as a user types it, on this interpreter's venv (never re-installed by the test)."""
    return [
        "make",
        "-s",
        "-o",
        str(VENV / ".installed"),
        "run",
        f"VENV={VENV}",
        f"NODES={nodes}",
        f"SUPERLINK_PORT={port}",
        f"RUN_OUT={tmp_path / 'runs' / 'flwr'}",
        f"RUN_CONFIG={run_config}",
    ]


def _tree(root_pid: int, port: int) -> set[int]:
    """Every process of the run now: below `make`, and the SuperLink on `port` with all below it."""
    pids = {root_pid, *descendants(root_pid)}
    for pid in pids_listening_on(port):
        pids |= {pid, *descendants(pid)}
    return pids


# --- checked before anything starts -----------------------------------------------------------------
def test_run_config_strings_read_the_way_flower_documents_them() -> None:
    got = parse_run_config("model=\"cnn-tiny\" fleet='sim:jetson-nano@3' seed=3 lr-max=0.001 resume=false")
    assert got == {
        "model": "cnn-tiny",
        "fleet": "sim:jetson-nano@3",
        "seed": 3,
        "lr-max": 0.001,
        "resume": False,
    }


@given(
    st.dictionaries(
        st.from_regex(r"[a-z][a-z0-9-]{0,12}", fullmatch=True),
        st.one_of(
            st.integers(-(10**6), 10**6),
            st.floats(allow_nan=False, allow_infinity=False, width=32),
            st.booleans(),
            st.text(st.characters(min_codepoint=32, max_codepoint=126, exclude_characters="'"), max_size=12),
        ),
        max_size=5,
    )
)
def test_what_the_launcher_passes_on_flower_reads_back_unchanged(config: dict) -> None:
    assert parse_run_config(run_config_text(config)) == config


@pytest.mark.parametrize(
    ("run_config", "fragments"),
    [
        ("num-server-roundz=3", ["unknown key 'num-server-roundz'", "did you mean 'num-server-rounds'"]),
        ("targte-accuracy=0.5", ["unknown key 'targte-accuracy'", "did you mean 'target-accuracy'"]),
        ("model=cnn-tiny", ["'cnn-tiny' is not a number", 'model="cnn-tiny"']),
        ("num-server-rounds 3", ["'num-server-rounds' is not key=value"]),
    ],
)
def test_a_bad_run_config_is_one_line_before_flower_starts(
    tmp_path: Path, run_config: str, fragments: list[str]
) -> None:
    with pytest.raises(PowerctlError) as err:
        check_launch(4, run_config, tmp_path / "flwr", tmp_path / "flwr.log")
    assert all(f in str(err.value) for f in fragments) and "\n" not in str(err.value), err.value
    assert not (tmp_path / "flwr").exists()


def test_bad_values_are_refused_by_the_server_config_parser_before_flower_starts(tmp_path: Path) -> None:
    with pytest.raises(RunConfigError, match=r"'target-accuracy' must be a number in \(0, 1\], got 2"):
        check_launch(4, "target-accuracy=2", tmp_path / "flwr", tmp_path / "flwr.log")
    with pytest.raises(RunConfigError, match="'model' must be one of"):
        check_launch(4, "model='resnet99'", tmp_path / "flwr", tmp_path / "flwr.log")
    plan = check_launch(3, 'model="cnn-tiny"', tmp_path / "flwr", tmp_path / "flwr.log")
    assert plan.overrides == {"results-dir": str((tmp_path / "flwr").resolve()), "model": "cnn-tiny"}


@contextlib.contextmanager
def _make(
    tmp_path: Path, port: int, env: dict[str, str] | None = None, **kwargs: str
) -> Iterator[subprocess.Popen[str]]:
    """`make run` in its own process group (a shell's foreground job); whatever happens in the test, its
    group and the SuperLink on `port` are stopped afterwards (today's main would leave them running)."""
    proc = subprocess.Popen(
        _make_run(tmp_path, port, **kwargs),
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        stop_local_superlink(port)


def _watch(proc: subprocess.Popen[str], port: int) -> tuple[str, str, set[int]]:
    """Wait for the end, noting every process of the run seen on the way; (stdout, stderr, pids)."""
    seen: set[int] = set()
    reader = ThreadPoolExecutor(1).submit(proc.communicate)
    while proc.poll() is None:
        seen |= _tree(proc.pid, port)
        time.sleep(0.5)
    out, err = reader.result(timeout=60)
    return out, err, seen


@pytest.mark.parametrize("nodes", ["0", "-2", str(MAX_BOARDS + 1)])
def test_make_run_refuses_a_bad_number_of_nodes_before_anything_starts(tmp_path: Path, nodes: str) -> None:
    port = free_port()
    with _make(tmp_path, port, nodes=nodes) as proc:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, out + err
    lines = [ln for ln in err.splitlines() if not ln.startswith("make")]
    assert (
        len(lines) == 1 and f"NODES: the number of virtual nodes must be from 1 to {MAX_BOARDS}" in lines[0]
    )
    assert not (tmp_path / "runs").exists() and not pids_listening_on(port)


@pytest.mark.parametrize("value", ['"resnet99"', "'resnet99'"])
def test_make_run_passes_flowers_string_quotes_through_untouched(tmp_path: Path, value: str) -> None:
    """The string reaches the ServerApp's own check as the string resnet99, whichever quotes it has."""
    port = free_port()
    with _make(tmp_path, port, run_config=f"model={value}") as proc:
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "'model' must be one of" in err and "got 'resnet99'" in err, out + err


# --- owning the run --------------------------------------------------------------------------------
def _plant_earlier_results(tmp_path: Path) -> tuple[Path, bytes]:
    out_dir = tmp_path / "runs" / "flwr"
    out_dir.mkdir(parents=True)
    earlier = out_dir / "results.json"
    earlier.write_text('{"schema": "fl_server.results/2", "run": {"fingerprint": "an earlier run"}}\n')
    return earlier, earlier.read_bytes()


@pytest.mark.slow
def test_make_run_in_which_every_client_fails_is_a_failed_run_that_keeps_the_earlier_results(
    tmp_path: Path, seeded_cache: Callable[[str], Path]
) -> None:
    earlier, before = _plant_earlier_results(tmp_path)
    port = free_port()  # every client raises in every round (a cap nothing fits is refused before it starts)
    faults = {"POWERFED_FAULT_INJECTION": "1", "POWERFED_CACHE": str(seeded_cache(SMALL_RUN))}
    with _make(tmp_path, port, env=faults, run_config=SMALL_RUN + " inject-failures='raise:1.0'") as proc:
        out, err, seen = _watch(proc, port)
    assert proc.returncode == 2, (out + err)[-3000:]
    assert "the ServerApp stopped: every client failed in every round" in err
    assert "results: " not in out and "FAILED" in out
    assert earlier.read_bytes() == before and [p.name for p in earlier.parent.iterdir()] == ["results.json"]
    assert not [p for p in seen if alive(p)] and not pids_listening_on(port)


@pytest.mark.slow
def test_interrupting_make_run_stops_every_process_and_leaves_the_earlier_results(
    tmp_path: Path, seeded_cache: Callable[[str], Path]
) -> None:
    """SIGTERM to `make` alone, mid-round: make passes it on, the launcher stops the run as on Ctrl-C
    (`simulations.launcher` turns SIGTERM into the KeyboardInterrupt Ctrl-C raises). Ctrl-C itself,
    SIGINT to the terminal's whole process group, is the fleet run's test below: the same `run_flwr`."""
    earlier, before = _plant_earlier_results(tmp_path)
    log = tmp_path / "runs" / "flwr.log"
    port = free_port()
    seen: set[int] = set()
    with _make(tmp_path, port, env={"POWERFED_CACHE": str(seeded_cache(SMALL_RUN))}) as proc:
        deadline = time.monotonic() + 300
        while "round 1 train" not in (log.read_text() if log.exists() else ""):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text()[-3000:] if log.exists() else ""
                pytest.fail(
                    f"the run ended or hung before round 1: {proc.stderr.read() if proc.stderr else ''}{tail}"
                )
            seen |= _tree(proc.pid, port)
            time.sleep(0.2)
        seen |= _tree(proc.pid, port)
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "interrupted" in err, err
    assert len(seen) >= 5, "make, the launcher, flwr, the SuperLink and the simulation should have run"
    time.sleep(3)  # nothing orphaned may go on to write
    assert not [p for p in seen if alive(p)], "processes of the run are still alive"
    assert not pids_listening_on(port) and not pids_listening_on(port + 2)
    assert earlier.read_bytes() == before and [p.name for p in earlier.parent.iterdir()] == ["results.json"]


@pytest.mark.slow
def test_interrupting_a_fleet_run_stops_every_process_and_leaves_its_earlier_results(
    tmp_path: Path, seeded_cache: Callable[[str], Path]
) -> None:
    """`make fleet` runs `python -m simulations run`: Ctrl-C mid-round, the same by process id."""
    fleet = tmp_path / "tiny.yaml"
    fleet.write_text(TWO_BOARDS)
    out = tmp_path / "fleet"
    out.mkdir()
    (out / "results.json").write_text('{"schema": "simulations.fleet/2", "earlier": true}\n')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    cmd = [sys.executable, "-m", "simulations", "run", str(fleet), "--out", str(out)]
    env = {**os.environ, "POWERFED_CACHE": str(seeded_cache(SMALL_RUN))}  # the fleet's task
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        log = out / "flwr.log"
        while "round 1 train" not in (log.read_text() if log.exists() else ""):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"the run ended or hung before round 1: {proc.stderr.read() if proc.stderr else ''}"
                )
            seen |= {proc.pid, *descendants(proc.pid)}
            time.sleep(0.2)
        seen |= {proc.pid, *descendants(proc.pid)}
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and "interrupted" in err, err
    assert len(seen) >= 4, "the runner, flwr, the SuperLink and the simulation should have run"
    time.sleep(3)
    assert not [p for p in seen if alive(p)], "processes of the run are still alive"
    assert (out / "results.json").read_bytes() == before["results.json"]
