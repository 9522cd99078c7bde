"""`python -m fl_client.supernode` when the SuperNode cannot start: one line naming the cause, at once,
and nothing left running (issue 28).

The fast tests run the wrapper from a throwaway venv whose `flower-supernode` and `flower-superexec`
are fakes doing what Flower 1.41's do in these faults: the SuperNode exits with `Exit Code: 305` after
starting a SuperExec that keeps the output pipe and lives while its parent's pid exists (a zombie's
does: the wrapper used to read that pipe for ever), or it fails on a local port in use with a
traceback. The venv's bin is not on PATH (a service started as `/opt/…/.venv/bin/python -m
fl_client.supernode`): the fake SuperNode finds `flower-superexec` only if the wrapper puts it there.
The slow tests do the same against a real SuperLink with node authentication.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from simulations.local_superlink import proc_stat

PROG = "python -m fl_client.supernode"
REPO = Path(__file__).resolve().parents[1]
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"

FAKE_SUPERNODE = r"""#!/bin/sh
# A fake flower-supernode: what Flower 1.41's does in the faults the wrapper must name.
echo start >> "$FAKE_DIR/starts"
case "$FAKE_SUPERNODE" in
refused)
  flower-superexec --parent-pid $$ &
  # like Flower's, exit only once the superexec runs (at most 5 s: a superexec not found never writes)
  i=0; while [ "$(cat "$FAKE_DIR/pids" 2>/dev/null | wc -l)" -lt 2 ] && [ $i -lt 100 ]; do
    sleep 0.05; i=$((i + 1)); done
  echo "ERROR :      Exit Code: 305"
  echo "Failed to initialize the connection to the SuperLink."
  echo "[code: 2004] Failed to activate SuperNode."
  exit 1 ;;
port)
  echo "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 39999):" \
    "address already in use"
  echo "Traceback (most recent call last):"
  echo '  File "flower_supernode.py", line 248, in _start_supernode_http_api'
  echo "RuntimeError: SuperNode Runtime HTTP API failed to start."
  exit 1 ;;
serve)
  flower-superexec --parent-pid $$ &
  trap 'echo "SuperNode terminated gracefully."; exit 0' TERM
  command -v flwr-clientapp > "$FAKE_DIR/clientapp"
  echo "SuperNode ID: 1"
  : > "$FAKE_DIR/ready"
  while :; do sleep 0.1; done ;;
esac
"""

FAKE_SUPEREXEC = r"""#!/bin/sh
# A fake flower-superexec: like Flower's, it lives while its parent's pid exists (a zombie's does);
# its child (a ClientApp that does not watch its parent) lives on regardless. Both hold the output.
echo $$ >> "$FAKE_DIR/pids"
sleep 300 &
echo $! >> "$FAKE_DIR/pids"
while kill -0 "$2" 2>/dev/null; do sleep 0.2; done
"""


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with this project's packages (through a .pth) and the two fake Flower commands."""
    root = tmp_path_factory.mktemp("fake-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    Path(purelib).mkdir(parents=True, exist_ok=True)
    ours = sysconfig.get_paths()["purelib"]
    (Path(purelib) / "powerfed-test.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    for name, text in (("flower-supernode", FAKE_SUPERNODE), ("flower-superexec", FAKE_SUPEREXEC)):
        (root / "bin" / name).write_text(text)
        (root / "bin" / name).chmod(0o755)
    return root


def start(venv: Path, tmp_path: Path, mode: str, *flags: str) -> subprocess.Popen[str]:
    env = {"PATH": SYSTEM_PATH, "HOME": str(tmp_path), "FAKE_SUPERNODE": mode, "FAKE_DIR": str(tmp_path)}
    env["FLWR_HOME"] = str(tmp_path / "flwr-home")
    argv = [str(venv / "bin" / "python"), "-m", "fl_client.supernode", *flags]
    return subprocess.Popen(argv, cwd="/", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, list[str]]:
    """(exit status, stdout, stderr lines); a wrapper that hangs fails the test here (it used to)."""
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"the wrapper did not return:\n{out}\n{err}")
    return proc.returncode, out, err.strip().splitlines()


def left_running(tmp_path: Path) -> list[int]:
    """The fake SuperExec and its child, if still running (a zombie counts as gone)."""
    pids_file = tmp_path / "pids"
    pids = [int(p) for p in pids_file.read_text().split()] if pids_file.exists() else []
    deadline = time.monotonic() + 5  # init reaps what was re-parented to it when the wrapper exited
    while time.monotonic() < deadline:
        alive = [p for p in pids if (st := proc_stat(p)) is not None and st.running]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def test_a_refused_supernode_is_one_line_at_once_and_its_superexec_is_stopped(
    venv: Path, tmp_path: Path
) -> None:
    rc, out, err = finish(start(venv, tmp_path, "refused", "--superlink", "127.0.0.1:1", "--insecure"))
    assert rc == 1, (out, err)
    assert len(err) == 1 and err[0].startswith(
        f"{PROG}: error: wrong address: nothing listens on 127.0.0.1:1"
    ), err
    assert "Exit Code: 305" in out and "Traceback" not in out + "".join(err)
    assert (tmp_path / "starts").read_text().count("start") == 1  # not started again: waiting would not help
    assert len((tmp_path / "pids").read_text().split()) == 2  # flower-superexec was found (not on PATH)
    assert left_running(tmp_path) == []


def test_a_port_in_use_is_one_line_naming_the_port(venv: Path, tmp_path: Path) -> None:
    rc, out, err = finish(start(venv, tmp_path, "port", "--superlink", "127.0.0.1:1", "--insecure"))
    assert rc == 1, (out, err)
    assert len(err) == 1 and err[0].startswith(f"{PROG}: error: port 39999 is in use"), err
    assert "--port" in err[0]
    assert "Traceback" not in out and "RuntimeError" not in out, out
    assert (tmp_path / "starts").read_text().count("start") == 1  # no restart loop


def test_a_stop_signal_reaches_the_supernode_and_what_it_started_is_stopped(
    venv: Path, tmp_path: Path
) -> None:
    proc = start(venv, tmp_path, "serve", "--superlink", "127.0.0.1:1", "--insecure")
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    while len((tmp_path / "pids").read_text().split() if (tmp_path / "pids").exists() else []) < 2:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert rc == 0 and "SuperNode terminated gracefully." in out, (out, err)
    assert err == []
    assert left_running(tmp_path) == []


def test_the_supernode_runs_the_light_clientapp_and_it_is_gone_after(venv: Path, tmp_path: Path) -> None:
    """Each message's `flwr-clientapp` is the light one (`fl_client.clientapp_entry`), from a folder only
    the SuperNode's PATH has; it answers `--help` as Flower's own does; the wrapper removes it."""
    proc = start(venv, tmp_path, "serve", "--superlink", "127.0.0.1:1", "--insecure")
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    found = Path((tmp_path / "clientapp").read_text().strip())
    assert found.parent.name.startswith("powerfed-clientapp-"), found
    helps = [
        subprocess.run([str(tool), "--help"], capture_output=True, text=True, timeout=60).stdout
        for tool in (found, Path(sys.executable).parent / "flwr-clientapp")
    ]
    assert "--token" in helps[0] and helps[0] == helps[1]
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert rc == 0 and err == [], (out, err)
    assert not found.parent.exists()


@pytest.mark.parametrize(
    ("what", "make", "says"),
    [
        ("passphrase key", "key", "is protected by a passphrase"),
        ("key is a folder", "folder", "cannot read the node key"),
        ("CA is a device", "device-ca", "not a regular file"),
        ("CA is binary", "binary-ca", "is not a CA certificate in PEM form"),
    ],
)
def test_bad_files_are_one_line_before_flower_starts(
    venv: Path, tmp_path: Path, what: str, make: str, says: str
) -> None:
    from fl_server.certs import make_certificates

    ca, _, _ = make_certificates(tmp_path / "certs", days=1)
    key = tmp_path / "board1"
    keygen = ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-f", str(key)]
    subprocess.run([*keygen, "-N", "secret" if make == "key" else ""], check=True, timeout=60)
    if make == "folder":
        key = tmp_path / "keys"
        key.mkdir()
    if make == "device-ca":
        ca = Path("/dev/zero")
    if make == "binary-ca":
        ca.write_bytes(os.urandom(512))
    flags = ["--superlink", "127.0.0.1:1", "--root-certificates", str(ca)]
    flags += ["--auth-supernode-private-key", str(key)]
    rc, out, err = finish(start(venv, tmp_path, "refused", *flags))
    assert rc == 2 and len(err) == 1 and says in err[0], (what, out, err)
    assert not (tmp_path / "starts").exists()  # Flower never started


def test_a_bad_wait_is_one_line(venv: Path, tmp_path: Path) -> None:
    for value in ("-3", "nan", "soon", "1e9"):
        rc, _, err = finish(start(venv, tmp_path, "refused", "--wait", value, "--superlink", "127.0.0.1:1"))
        assert rc == 2 and len(err) == 1 and "--wait takes seconds" in err[0], (value, err)
    assert not (tmp_path / "starts").exists()


# ------------------------------------------------------------------------- a real SuperLink (slow)


def log_says(log: Path, text: str, timeout_s: float, alive: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        if text in log.read_text(errors="replace"):
            return True
        time.sleep(0.5)
    return text in log.read_text(errors="replace")


@pytest.mark.slow
def test_an_unregistered_key_is_one_line_at_once_with_the_venv_not_on_path(tmp_path: Path) -> None:
    """The issue's case: a real flower-supernode exits 305 and its real SuperExec lives on; the wrapper,
    run as the docs' systemd unit runs it (the venv not on PATH, from /), names the cause at once."""
    from tests.flower_deploy import Deployment, free_port, make_ecdsa_key

    d = Deployment(tmp_path / "deploy", mode="auth")
    try:
        d.start_superlink()
        d.write_connection()
        stranger, _ = make_ecdsa_key(d.root / "keys" / "stranger")
        argv = [sys.executable, "-m", "fl_client.supernode", "--superlink", d.address, "--root-certificates"]
        argv += [str(d.ca), "--auth-supernode-private-key", str(stranger), "--port", str(free_port())]
        node = d.spawn("supernode", argv, {**d._home("supernode"), "PATH": SYSTEM_PATH}, cwd=Path("/"))
        rc = node.popen.wait(timeout=120)
        text = node.log.read_text(errors="replace")
        lines = [line for line in text.splitlines() if line.startswith(f"{PROG}: error:")]
        assert rc == 1, node.tail()
        assert len(lines) == 1 and "unregistered node key" in lines[0], node.tail()
        assert f"flwr supernode register {stranger}.pub" in lines[0]
        assert "Traceback" not in text and "FileNotFoundError" not in text, node.tail()
        assert text.count("Exit Code: 305") == 1, node.tail()  # started once
    finally:
        left = d.stop()
    assert not left, f"processes left: {left}"


@pytest.mark.slow
def test_the_systemd_sketch_runs_a_supernode_with_its_superexec(tmp_path: Path) -> None:
    """docs/deployment.md's unit: `.venv/bin/python -m fl_client.supernode …` from /, the venv not on
    PATH: the SuperNode connects and its flower-superexec runs (it used to be FileNotFoundError)."""
    from tests.flower_deploy import Deployment, free_port, make_ecdsa_key

    d = Deployment(tmp_path / "deploy", mode="auth")
    try:
        d.start_superlink()
        d.write_connection()
        key, pub = make_ecdsa_key(d.root / "keys" / "board1")
        d.register(pub)
        argv = [sys.executable, "-m", "fl_client.supernode", "--superlink", d.address, "--root-certificates"]
        argv += [str(d.ca), "--auth-supernode-private-key", str(key), "--port", str(free_port())]
        argv += ["--node-config", 'device="sim:jetson-nano"']
        node = d.spawn("supernode", argv, {**d._home("supernode"), "PATH": SYSTEM_PATH}, cwd=Path("/"))
        assert log_says(node.log, "SuperNode ID:", 120, node.alive), node.tail()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any("flower-superexec" in c for _, _, c in d.seen.values()):
            time.sleep(0.5)
        assert any("flower-superexec" in c for _, _, c in d.seen.values()), node.tail()
        assert node.alive() and "FileNotFoundError" not in node.log.read_text(errors="replace"), node.tail()
        node.popen.send_signal(signal.SIGTERM)
        assert node.popen.wait(timeout=60) == 0, node.tail()
    finally:
        left = d.stop()
    assert not left, f"processes left: {left}"


# ------------------------------------------------- the files fl_client.check and the supervisor read


@pytest.mark.parametrize("kind", ["binary", "folder", "fifo", "device", "not toml", "no such connection"])
@pytest.mark.parametrize("prog", ["fl_client.check", "fl_server.supervise"])
def test_a_bad_config_toml_is_one_line_and_left_as_it_is(tmp_path: Path, kind: str, prog: str) -> None:
    home = tmp_path / "flwr-home"
    home.mkdir()
    config = home / "config.toml"
    if kind == "binary":
        config.write_bytes(b"\xff\xfe\x00" + os.urandom(256))
    elif kind == "folder":
        config.mkdir()
    elif kind == "fifo":
        os.mkfifo(config)
    elif kind == "device":
        config.symlink_to("/dev/zero")
    elif kind == "not toml":
        config.write_text("[superlink\naddress = \n")
    else:
        config.write_text('[superlink.other]\naddress = "127.0.0.1:9092"\ninsecure = true\n')
    before = os.lstat(config)
    content = config.read_bytes() if kind in ("binary", "not toml", "no such connection") else None
    argv = ["--connection", "deploy"] if prog == "fl_client.check" else ["deploy", "--results-dir", "r"]
    proc = subprocess.run(
        [sys.executable, "-m", prog, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "FLWR_HOME": str(home)},
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and str(config) in lines[0], (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stdout + proc.stderr
    assert os.lstat(config).st_mode == before.st_mode and os.lstat(config).st_ino == before.st_ino
    if content is not None:
        assert config.read_bytes() == content
    assert not (tmp_path / "r").exists()


def test_a_stop_signal_while_the_supernode_starts_is_passed_on_and_leaves_nothing(
    venv: Path, tmp_path: Path
) -> None:
    """SIGTERM as soon as the SuperNode process exists (a service manager stopping the unit at once):
    the wrapper's handlers are in place before it starts the SuperNode, so the signal reaches it and the
    wrapper ends by itself (not killed by the signal, which would orphan the SuperNode)."""
    proc = start(venv, tmp_path, "serve", "--superlink", "127.0.0.1:1", "--insecure")
    deadline = time.monotonic() + 60
    while not (tmp_path / "starts").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    rc, out, err = finish(proc)
    assert rc >= 0, f"the wrapper died of signal {-rc}: {out}{err}"
    assert "Traceback" not in out + "".join(err), (out, err)
    time.sleep(0.5)  # a fake SuperExec polls its parent every 0.2 s
    assert left_running(tmp_path) == []


def test_what_a_zombie_child_left_is_stopped_though_it_shows_as_re_parented_only_after_the_reap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel may show an exited SuperExec as a zombie before its own child shows as re-parented to
    the wrapper (seen under load: a ClientApp left running). The wrapper looks again after reaping."""
    from fl_client import supernode

    superexec, clientapp = 101, 102
    scans = iter([{superexec: False}, {clientapp: True}, {clientapp: False}, {}])
    reaped: list[int] = []
    signalled: list[tuple[int, int]] = []
    monkeypatch.setattr(supernode, "_children", lambda: next(scans))
    monkeypatch.setattr(supernode.os, "waitpid", lambda pid, _flags: reaped.append(pid) or (pid, 0))
    monkeypatch.setattr(supernode.os, "kill", lambda pid, sig: signalled.append((pid, sig)))
    assert supernode.stop_leftovers(grace_s=5) == [clientapp]
    assert signalled == [(clientapp, signal.SIGTERM)]
    assert reaped == [superexec, clientapp]


def test_a_zombie_that_cannot_be_reaped_yet_is_signalled_not_waited_on_forever(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread group's exited leader shows as a zombie while its other threads run; waitpid cannot
    reap it until they end, so the wrapper signals it (which ends the group) instead of looping."""
    from fl_client import supernode

    leader = 201
    scans = iter([{leader: False}, {leader: False}, {}])
    reapable = iter([False, True])
    signalled: list[tuple[int, int]] = []
    monkeypatch.setattr(supernode, "_children", lambda: next(scans))
    monkeypatch.setattr(supernode.os, "waitpid", lambda pid, _flags: (pid if next(reapable) else 0, 0))
    monkeypatch.setattr(supernode.os, "kill", lambda pid, sig: signalled.append((pid, sig)))
    assert supernode.stop_leftovers(grace_s=5) == [leader]
    assert signalled == [(leader, signal.SIGTERM)]
