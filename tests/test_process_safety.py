"""Only what the project started is ever stopped (issue 28): `stop-superlink` and the launcher's stop
before a run refuse a port held by anything but a local SuperLink of `flwr run` (one line, exit 2,
nothing signalled, no process group of anyone else), and a launcher killed with SIGKILL leaves nothing
running: its watchdog, or else the next start, stops its processes and removes its Flower home."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from powerctl.procs import alive, environ
from simulations.flower_home import MARKER, PREFIX, SCHEMA, FlowerHome, clean_stale_homes
from simulations.local_superlink import (
    cmdline,
    descendants,
    free_port,
    pids_listening_on,
    proc_stat,
    stop_tree,
    superlink_home,
)

ROOT = Path(__file__).resolve().parents[1]
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]

FAKE_SUPERLINK = """\
import socket, subprocess, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
s = socket.socket()
s.bind(("127.0.0.1", port))
s.listen()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(child.pid, flush=True)
time.sleep(600)
"""
"""Stands in for `flower-superlink`: listens on --port, starts a child in a session of its own (as the
real one starts its SuperExec) and prints the child's pid."""


def _wait(condition: object, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"still waiting for {what} after {timeout:.0f} s")
        time.sleep(0.1)


def _carries(pid: int, home: Path) -> bool:
    """Whether the process has exec'd with FLWR_HOME=`home` (between fork and exec /proc shows the
    parent's environment: a loaded machine makes that window long enough to read)."""
    env = environ(pid)
    return env is not None and env.get("FLWR_HOME") == str(home)


@contextlib.contextmanager
def _started(cmd: list[str], **kwargs: object) -> Iterator[subprocess.Popen[str]]:
    """A process this test starts, stopped by its pid (and what it started) whatever happens."""
    proc = subprocess.Popen(cmd, text=True, **kwargs)  # type: ignore[call-overload]
    try:
        yield proc
    finally:
        if alive(proc.pid):
            stop_tree(proc.pid, grace_s=2.0)
        proc.wait(timeout=30)


def _listener(port: int, **kwargs: object) -> contextlib.AbstractContextManager[subprocess.Popen[str]]:
    return _started(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        **kwargs,
    )


def _stop_superlink(
    port: int, capsys: pytest.CaptureFixture[str] | None = None, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """`python -m simulations stop-superlink --port PORT`: in this process when `capsys` is given (fast),
    else as a process of its own (with `kwargs` for Popen)."""
    if capsys is not None:
        from simulations.__main__ import main

        code = main(["stop-superlink", "--port", str(port)])
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess([], code, out, err)
    return subprocess.run(
        [sys.executable, "-m", "simulations", "stop-superlink", "--port", str(port)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        **kwargs,  # type: ignore[arg-type]
    )


def _fake_superlink(tmp_path: Path, port: int, log_home: Path) -> list[str]:
    """The command line `flwr run` gives its local SuperLink, run by this Python: the log in `log_home`."""
    script = tmp_path / "bin" / "flower-superlink"
    script.parent.mkdir(exist_ok=True)
    script.write_text(FAKE_SUPERLINK)
    log = log_home / "local-superlink" / "superlink.log"
    args = ["--insecure", "--simulation", "--host", "127.0.0.1", "--port", str(port), "--log-file", str(log)]
    return [sys.executable, str(script), *args]


# --- stop-superlink --------------------------------------------------------------------------------
def test_stop_superlink_refuses_a_plain_listener_in_one_line_and_signals_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()
    with _listener(port, start_new_session=True) as server:
        _wait(lambda: pids_listening_on(port), "the listener")
        done = _stop_superlink(port, capsys)
        assert done.returncode == 2 and done.stdout == ""
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"python -m simulations: error: port {port} is held by pid {server.pid} (")
        assert "http.server" in line and "nothing stopped" in line
        assert alive(server.pid) and pids_listening_on(port) == [server.pid]


def test_stop_superlink_never_signals_the_process_group_of_the_one_who_asked() -> None:
    """The listener shares this test's process group (a shell's job without job control): the old
    stop killpg'd that group. Now nothing is signalled, this process least of all."""
    port = free_port()
    got: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        with _listener(port) as server:  # no session of its own: this test's group
            assert os.getpgid(server.pid) == os.getpgrp()
            _wait(lambda: pids_listening_on(port), "the listener")
            done = _stop_superlink(port, start_new_session=True)
            assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
            assert alive(server.pid) and not got
    finally:
        signal.signal(signal.SIGTERM, old)
    assert not got


def test_stop_superlink_stops_a_local_superlink_with_what_it_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port, home = free_port(), tmp_path / "flwr-home"
    cmd = _fake_superlink(tmp_path, port, home)
    env = {**os.environ, "FLWR_HOME": str(home)}
    with _started(cmd, env=env, stdout=subprocess.PIPE, start_new_session=True) as link:
        assert link.stdout is not None
        child = int(link.stdout.readline())
        _wait(lambda: pids_listening_on(port), "the fake SuperLink")
        assert superlink_home(link.pid) == home
        done = _stop_superlink(port, capsys)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip().startswith(f"stopped the local SuperLink on port {port} (pids ")
        assert str(child) in done.stdout and str(link.pid) in done.stdout
        assert not alive(link.pid) and not alive(child) and not pids_listening_on(port)


@pytest.mark.parametrize("case", ["another home", "no --simulation", "not python"])
def test_stop_superlink_refuses_what_only_looks_like_a_local_superlink(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    port, home = free_port(), tmp_path / "flwr-home"
    cmd = _fake_superlink(tmp_path, port, tmp_path / "elsewhere" if case == "another home" else home)
    if case == "no --simulation":
        cmd.remove("--simulation")
    env = {**os.environ, "FLWR_HOME": str(home)}
    if case == "not python":  # the same arguments, run by a program that is not a Python
        (tmp_path / "bin" / "node").symlink_to(sys.executable)
        cmd[0] = str(tmp_path / "bin" / "node")
    with _started(cmd, env=env, stdout=subprocess.PIPE, start_new_session=True) as link:
        assert link.stdout is not None
        child = int(link.stdout.readline())
        _wait(lambda: pids_listening_on(port), "the fake SuperLink")
        done = _stop_superlink(port, capsys)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert f"is held by pid {link.pid} (" in done.stderr and "nothing stopped" in done.stderr
        assert alive(link.pid) and alive(child)
        stop_tree(child, grace_s=2.0)


def test_stop_superlink_stops_the_superlink_flower_itself_starts(capsys: pytest.CaptureFixture[str]) -> None:
    """The identity rule against the real thing: Flower's own `_start_local_superlink` (what `flwr run`
    calls), on private ports and home."""
    port, control = free_port(), free_port()
    env = {
        **os.environ,
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(port),
        "FLWR_LOCAL_CONTROL_API_PORT": str(control),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    start = "from flwr.cli.local_superlink import _start_local_superlink as s; s()"
    subprocess.run([sys.executable, "-c", start], env=env, check=True, capture_output=True, timeout=120)
    (link,) = pids_listening_on(port)
    tree = [link, *descendants(link)]
    try:
        assert superlink_home(link) == Path(os.environ["FLWR_HOME"])
        done = _stop_superlink(port, capsys)
        assert done.returncode == 0, done.stderr
        assert not [p for p in tree if alive(p)] and not pids_listening_on(port)
    finally:
        for pid in tree:
            if alive(pid):
                stop_tree(pid, grace_s=2.0)


# --- the launcher's stop before its run ------------------------------------------------------------
def test_make_run_refuses_a_port_held_by_another_program_before_flower_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from simulations.launcher import check_launch, launch
    from simulations.local_superlink import NotOurProcessError

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("flwr run was started on a port held by another program")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    port = free_port()
    with _listener(port, start_new_session=True) as server:
        _wait(lambda: pids_listening_on(port), "the listener")
        with monkeypatch.context() as m, pytest.raises(NotOurProcessError) as err:
            m.setattr(subprocess, "Popen", refuse)
            launch(check_launch(2, "", tmp_path / "flwr", tmp_path / "flwr.log", port))
        assert f"port {port} is held by pid {server.pid}" in str(err.value) and "\n" not in str(err.value)
        assert alive(server.pid)
    assert not list((tmp_path / "tmp").iterdir()), "no Flower home may be left"


def test_make_run_never_stops_nor_joins_another_runs_superlink_on_its_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two `make run`s on the same SUPERLINK_PORT: the second is one line naming the first's SuperLink,
    which goes on (issue 37, item 6); it used to stop it as "a local SuperLink of flwr run"."""
    from simulations.launcher import check_launch, launch
    from simulations.local_superlink import NotOurProcessError

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("flwr run was started on a port another run's SuperLink holds")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    port, home = free_port(), tmp_path / "first-run-home"
    env = {**os.environ, "FLWR_HOME": str(home)}
    cmd = _fake_superlink(tmp_path, port, home)
    with _started(cmd, env=env, stdout=subprocess.PIPE, start_new_session=True) as link:
        assert link.stdout is not None
        child = int(link.stdout.readline())
        _wait(lambda: pids_listening_on(port), "the first run's SuperLink")
        with monkeypatch.context() as m, pytest.raises(NotOurProcessError) as err:
            m.setattr(subprocess, "Popen", refuse)
            launch(check_launch(2, "", tmp_path / "flwr", tmp_path / "flwr.log", port))
        text = str(err.value)
        assert f"port {port} is held by pid {link.pid}" in text and "\n" not in text, text
        assert "this run starts its own SuperLink" in text
        assert alive(link.pid) and alive(child), "the first run's SuperLink was stopped"


# --- what a killed launcher leaves -----------------------------------------------------------------
def _leftover_home(base: Path, launcher: int, recorded: list[list[int]]) -> Path:
    """A home as a launcher writes it, whose launcher is gone (nobody holds its lock)."""
    home = base / f"{PREFIX}killed"
    (home / "local-superlink").mkdir(parents=True)
    (home / MARKER).write_text(
        json.dumps({"schema": SCHEMA, "launcher": [launcher, 1], "processes": recorded})
    )
    return home


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


def test_the_next_start_cleans_up_what_a_killed_launcher_left(tmp_path: Path) -> None:
    base = tmp_path / "tmp"
    base.mkdir()
    home = _leftover_home(base, _dead_pid(), [])
    marked = {**os.environ, "FLWR_HOME": str(home)}
    elsewhere = {**os.environ, "FLWR_HOME": str(tmp_path / "another-home")}
    with (
        _started(SLEEPER, env=marked, start_new_session=True) as run,  # carries the home: the run's
        _started(SLEEPER, start_new_session=True) as recorded,  # named in launcher.json
        _started(SLEEPER, start_new_session=True) as reused,  # its pid recorded with another start time
        _started(SLEEPER, env=elsewhere, start_new_session=True) as stranger,
    ):
        ticks = {p.pid: proc_stat(p.pid).start_ticks for p in (recorded, reused)}  # type: ignore[union-attr]
        data = json.loads((home / MARKER).read_text())
        data["processes"] = [[recorded.pid, ticks[recorded.pid]], [reused.pid, ticks[reused.pid] + 1]]
        (home / MARKER).write_text(json.dumps(data))
        _wait(lambda: _carries(run.pid, home) and proc_stat(recorded.pid), "the processes")
        live = FlowerHome.create(base)  # a launcher alive now: its home and its run are left alone
        with _started(
            SLEEPER, env={**os.environ, "FLWR_HOME": str(live.path)}, start_new_session=True
        ) as own:
            (cleaned,) = clean_stale_homes(base)
            assert cleaned[0] == home and sorted(cleaned[2]) == sorted([run.pid, recorded.pid])
            assert not home.exists() and not alive(run.pid) and not alive(recorded.pid)
            assert alive(reused.pid) and alive(stranger.pid)
            assert live.path.is_dir() and alive(own.pid)
            assert live.close() == [own.pid] and not live.path.exists() and not alive(own.pid)
    assert list(base.iterdir()) == []


def test_a_home_without_a_record_is_cleaned_by_its_flower_home_mark(tmp_path: Path) -> None:
    """A home from a launcher killed before it wrote launcher.json, or by an older launcher."""
    base = tmp_path / "tmp"
    home = base / f"{PREFIX}old"
    home.mkdir(parents=True)
    with _started(SLEEPER, env={**os.environ, "FLWR_HOME": str(home)}, start_new_session=True) as run:
        _wait(lambda: _carries(run.pid, home), "the process's exec")  # before exec it has our environment
        assert clean_stale_homes(base) == [(home, None, [run.pid])]
        assert not alive(run.pid) and not home.exists()


LAUNCHER = """\
import subprocess, sys, time
from pathlib import Path
from simulations.flower_home import FlowerHome
home = FlowerHome.create(Path(sys.argv[1]))
home.start_watchdog()
env = {"FLWR_HOME": str(home.path), "PATH": "/usr/bin:/bin"}
run = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], env=env,
                       start_new_session=True)
home.record([run.pid])
print(home.path, run.pid, home._watchdog.pid, flush=True)
time.sleep(600)
"""
"""What the launcher does with its home, in small: a home, its watchdog, one process of the run."""


@pytest.mark.parametrize("watchdog", ["lives", "killed too"])
def test_a_sigkilled_launcher_leaves_nothing_running(tmp_path: Path, watchdog: str) -> None:
    base = tmp_path / "tmp"
    base.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with _started([sys.executable, "-c", LAUNCHER, str(base)], env=env, stdout=subprocess.PIPE) as launcher:
        assert launcher.stdout is not None
        path, run, dog = launcher.stdout.readline().split()
        home, run_pid, dog_pid = Path(path), int(run), int(dog)
        try:
            assert alive(run_pid) and home.is_dir()
            if watchdog == "killed too":
                os.kill(dog_pid, signal.SIGKILL)
                _wait(lambda: not alive(dog_pid), "the watchdog's end")
            os.kill(launcher.pid, signal.SIGKILL)
            launcher.wait(timeout=30)
            if watchdog == "lives":  # it stops the run at once
                _wait(lambda: not alive(run_pid) and not home.exists(), "the watchdog's clean-up")
                _wait(lambda: not alive(dog_pid), "the watchdog's end")
            else:  # the next start does
                assert alive(run_pid) and home.is_dir()
                (cleaned,) = clean_stale_homes(base)
                assert cleaned[1] == launcher.pid and cleaned[2] == [run_pid]
                assert not alive(run_pid) and not home.exists()
        finally:
            for pid in (run_pid, dog_pid):
                if alive(pid):
                    stop_tree(pid, grace_s=2.0)
    assert list(base.iterdir()) == []


# --- deploy/loopback.sh: every input checked before anything starts --------------------------------
@pytest.mark.parametrize(
    ("env", "work", "fragment"),
    [
        ({"PORT": "abc"}, None, "PORT=abc: expected a TCP port from 1 to 65533"),
        ({"PORT": "65534"}, None, "PORT=65534: expected a TCP port from 1 to 65533"),
        ({"PORT": "BUSY"}, None, "is not free"),
        ({"ROUNDS": "0"}, None, "ROUNDS=0: expected a whole number of rounds >= 1"),
        ({"PYTHON": "/nonexistent/python"}, None, "PYTHON=/nonexistent/python: no such program"),
        ({"PYTHON": "/bin/true"}, None, "PYTHON=/bin/true cannot import flwr and this project"),
        ({}, "FILE", "exists and is not a folder"),
    ],
)
def test_loopback_refuses_a_bad_input_at_once_in_one_line(
    tmp_path: Path, env: dict[str, str], work: str | None, fragment: str
) -> None:
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    env = {k: (str(port) if v == "BUSY" else v) for k, v in env.items()}
    run_env = {"PYTHON": sys.executable, "PORT": str(free_port()), **env, "TMPDIR": str(tmp_path)}
    args = []
    if work == "FILE":
        (tmp_path / "a-file").write_text("mine\n")
        args = [str(tmp_path / "a-file")]
    try:
        done = subprocess.run(
            ["bash", str(ROOT / "deploy" / "loopback.sh"), *args],
            cwd=ROOT,
            env={**os.environ, **run_env},
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        busy.close()
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("loopback: error: ") and fragment in line
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == (["a-file"] if work == "FILE" else []), left
    if work == "FILE":
        assert (tmp_path / "a-file").read_text() == "mine\n"


# --- end to end: `make run`'s launcher killed with SIGKILL mid-round -------------------------------
def _run_home(base: Path, port: int) -> Path | None:
    for pid in pids_listening_on(port):
        home = superlink_home(pid)
        if home is not None and home.parent == base:
            return home
    return None


@pytest.mark.slow
def test_a_sigkilled_make_run_leaves_no_process_and_no_flower_home(
    tmp_path: Path, seeded_cache: Callable[[str], Path]
) -> None:
    """The launcher SIGKILLed mid-round, its watchdog alive: the watchdog stops the real run (Ray's
    processes included). With the watchdog killed too, the next start's `clean_stale_homes` stops it:
    the same `processes_of` and `_stop`, proven on a small run in
    `test_a_sigkilled_launcher_leaves_nothing_running[killed too]`."""
    from tests.test_launcher import SMALL_RUN

    # TMPDIR moves Ray's folder too: a short one, as Ray's socket paths must fit in 107 bytes
    base = Path(tempfile.mkdtemp(prefix="pf-", dir="/tmp"))
    port = free_port()
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "simulations", "flwr-run", "--nodes", "2", "--port", str(port)]
    cmd += ["--out", str(out / "flwr"), "--log", str(out / "flwr.log"), "--run-config", SMALL_RUN]
    env = {**os.environ, "TMPDIR": str(base), "POWERFED_CACHE": str(seeded_cache(SMALL_RUN))}
    seen: set[int] = set()
    with _started(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, start_new_session=True) as launcher:
        log = out / "flwr.log"
        _wait(lambda: "round 1 train" in (log.read_text() if log.exists() else ""), "round 1", 300)
        home = _run_home(base, port)
        assert home is not None and home.is_dir()
        for pid in [launcher.pid, *pids_listening_on(port)]:
            seen |= {pid, *descendants(pid)}
        dogs = [p for p in descendants(launcher.pid) if "simulations.flower_home" in " ".join(cmdline(p))]
        assert len(dogs) == 1 and len(seen) >= 5, "the launcher, its watchdog, flwr, the SuperLink, the app"
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        try:
            _wait(lambda: not [p for p in seen if alive(p)] and not home.exists(), "the clean-up", 120)
            assert not pids_listening_on(port) and not list(base.glob(PREFIX + "*"))
        finally:
            for pid in seen:
                if alive(pid):
                    stop_tree(pid, grace_s=2.0)
            shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("path", ["", None])
def test_a_child_with_an_empty_or_no_path_gets_no_empty_entry_that_would_be_the_current_folder(
    monkeypatch: pytest.MonkeyPatch, path: str | None
) -> None:
    from fl_client.supernode import child_env
    from simulations.local_superlink import flower_env

    if path is None:
        monkeypatch.delenv("PATH", raising=False)
    else:
        monkeypatch.setenv("PATH", path)
    here = Path(sys.executable).parent
    assert flower_env(1, 2)["PATH"] == str(here)  # not "here:" (an empty entry: the current folder)
    assert child_env("/opt/flwr/bin/flower-supernode", Path("/first"))["PATH"] == os.pathsep.join(
        ["/first", "/opt/flwr/bin"]
    )
    monkeypatch.setenv("PATH", "/usr/bin")
    assert flower_env(1, 2)["PATH"] == os.pathsep.join([str(here), "/usr/bin"])
