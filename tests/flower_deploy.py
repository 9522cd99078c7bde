"""A loopback Flower deployment for tests: one SuperLink, SuperNodes, `flwr run`, all on 127.0.0.1.

`Deployment` starts every process in a new session (its own process group), writes each one's output
to a log file, and remembers every process of each tree it started (a watcher samples the descendants,
so short-lived children such as `flwr-serverapp`/`flwr-clientapp` and the SuperLink's detached
SuperExec are known too). `stop()` ends each tree with `simulations.local_superlink.stop_tree` (by
process id and process group, never by name) and returns whatever of them is still alive.

Three connection modes: insecure; TLS (a CA and a server certificate made here with `cryptography`);
TLS + SuperNode authentication (ECDSA keys from `ssh-keygen`, registered with `flwr supernode register`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from simulations.local_superlink import descendants, free_port, proc_stat, proc_table, stop_tree

PROC = Path("/proc")
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
"""The venv's bin: flower-superlink, flower-supernode, flwr (works in CI's fresh venv too)."""


# --------------------------------------------------------------------------------------------- ports


def wait_listening(port: int, timeout_s: float, alive=lambda: True) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and alive():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.2)
    return False


# -------------------------------------------------------------------------------------- certificates


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for localhost/127.0.0.1: (ca.crt, server.pem, server.key)."""
    from fl_server.certs import make_certificates as make

    return make(folder, days=1)


def make_ecdsa_key(path: Path) -> tuple[Path, Path]:
    """`ssh-keygen -t ecdsa -b 384 -N "" -f PATH`: (private key, public key)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ecdsa", "-b", "384", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return path, path.with_name(path.name + ".pub")


# ----------------------------------------------------------------------------------------- processes


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(parent pid, session id, start time in clock ticks) of a live process; None if gone or a zombie."""
    st = proc_stat(pid)
    return (st.ppid, st.sid, st.start_ticks) if st is not None and st.running else None


def _start_time(pid: int) -> int | None:
    """The process's start time (with the pid, it names one process, not a reused pid)."""
    st = _stat(pid)
    return None if st is None else st[2]


def _proc_table() -> dict[int, tuple[int, int, int]]:
    return {pid: (st.ppid, st.sid, st.start_ticks) for pid, st in proc_table().items() if st.running}


def _cmdline(pid: int) -> str:
    try:
        return (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "?"


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path}: no log)"
    return "\n".join(text[-lines:])


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path
    argv: list[str]

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 40) -> str:
        return f"--- {self.name} (pid {self.pid}, log {self.log}) ---\n{tail(self.log, lines)}"


@dataclass
class Deployment:
    """One SuperLink and its SuperNodes on 127.0.0.1, in `root`; `mode` is insecure, tls or auth."""

    root: Path
    mode: str = "insecure"
    connection: str = "deploy"
    procs: list[Proc] = field(default_factory=list)
    superlink: Proc | None = None
    seen: dict[int, tuple[int, int, str]] = field(default_factory=dict)
    """Every process of the started trees: pid → (start time, session id, command line)."""

    def __post_init__(self) -> None:
        assert self.mode in ("insecure", "tls", "auth"), self.mode
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs = self.root / "logs"
        self.logs.mkdir(exist_ok=True)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = self._env()
        self.flwr_home = Path(self.env["FLWR_HOME"])
        if self.mode != "insecure":
            self.ca, self.server_cert, self.server_key = make_certificates(self.root / "certs")
        self._lock = threading.Lock()
        self._stop_watch = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    # ------------------------------------------------------------------ environment and connection
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        flwr_home = env.get("FLWR_HOME") or str(self.root / "flwr-home")
        env.update(
            FLWR_HOME=flwr_home,
            POWERFED_CACHE=env.get("POWERFED_CACHE") or str(self.root / "cache"),
            FLWR_TELEMETRY_ENABLED="0",
            FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",
            FLWR_DISABLE_UPDATE_CHECK="1",
            RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0",
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
            NO_COLOR="1",
        )
        # Flower's apps run from their installed copy of the FAB, not from the test's import path.
        env.pop("PYTHONPATH", None)
        return env

    def _home(self, name: str) -> dict[str, str]:
        """A process's own FLWR_HOME (its installed apps, its state), under the test's one."""
        home = self.flwr_home / "processes" / name
        home.mkdir(parents=True, exist_ok=True)
        return {"FLWR_HOME": str(home)}

    def write_connection(self) -> Path:
        """`[superlink.NAME]` in $FLWR_HOME/config.toml, the connection `flwr run . NAME` uses."""
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        lines = ["[superlink]", f'default = "{self.connection}"', "", f"[superlink.{self.connection}]"]
        lines.append(f'address = "{self.address}"')
        if self.mode == "insecure":
            lines.append("insecure = true")
        else:
            lines.append(f'root-certificates = "{self.ca}"')
        path = self.flwr_home / "config.toml"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    # --------------------------------------------------------------------------------- processes
    def spawn(
        self, name: str, argv: list[str], extra_env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> Proc:
        log = self.logs / f"{name}.log"
        env = {**self.env, **(extra_env or {})}
        with log.open("wb") as out:
            popen = subprocess.Popen(
                argv,
                cwd=cwd or self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        proc = Proc(name, popen, log, argv)
        with self._lock:
            self.procs.append(proc)
            self._remember(popen.pid)
        return proc

    def start_superlink(
        self,
        timeout_s: float = 60.0,
        database: Path | None = None,
        own_superexec: bool = False,
        name: str = "",
    ) -> Proc:
        """The SuperLink (`name` defaults to superlink; a restart gets its own log). `database`: its
        state in that file (survives a restart). `own_superexec`: `--isolation process`, the ServerApp
        run by a SuperExec that `start_superexec` starts apart (it outlives a SuperLink restart)."""
        argv = [str(BIN / "flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port)]
        argv.append("--disable-runtime-dependency-installation")
        if database is not None:
            argv += ["--database", str(database)]
        if own_superexec:
            argv += ["--isolation", "process"]
        if self.mode == "insecure":
            argv.append("--insecure")
        else:
            argv += ["--ssl-ca-certfile", str(self.ca), "--ssl-certfile", str(self.server_cert)]
            argv += ["--ssl-keyfile", str(self.server_key)]
        if self.mode == "auth":
            argv.append("--enable-supernode-auth")
        proc = self.superlink = self.spawn(name or "superlink", argv, self._home("superlink"))
        assert wait_listening(self.port, timeout_s, proc.alive), (
            f"SuperLink not listening on {self.address} after {timeout_s} s\n{proc.tail()}"
        )
        return proc

    def start_superexec(self) -> Proc:
        """The SuperExec that runs ServerApps for a SuperLink started with `own_superexec`."""
        argv = [str(BIN / "flower-superexec"), "--runtime-api-address", self.address]
        argv += ["--insecure"] if self.mode == "insecure" else ["--root-certificates", str(self.ca)]
        return self.spawn("superexec", argv, self._home("superlink"))

    def start_supernode(
        self, name: str, node_config: str, key: Path | None = None, extra_env: dict[str, str] | None = None
    ) -> Proc:
        argv = [str(BIN / "flower-supernode"), "--superlink", self.address, "--port", str(free_port())]
        argv += ["--node-config", node_config]
        if self.mode == "insecure":
            argv.append("--insecure")
        else:
            argv += ["--root-certificates", str(self.ca)]
        if key is not None:
            argv += ["--auth-supernode-private-key", str(key)]
        return self.spawn(name, argv, {**self._home(name), **(extra_env or {})})

    def flwr(self, name: str, args: list[str], timeout_s: float, cwd: Path | None = None) -> tuple[int, str]:
        """`flwr ARGS`, bounded: (exit status, output); on timeout its tree is stopped, status 124."""
        proc = self.spawn(name, [str(BIN / "flwr"), *args], cwd=cwd)
        try:
            rc = proc.popen.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_tree(proc.pid, grace_s=3.0)
            proc.popen.wait(timeout=10)
            rc = 124
        return rc, proc.log.read_text(errors="replace")

    def register(self, public_key: Path, timeout_s: float = 60.0) -> str:
        """`flwr supernode register KEY.pub NAME`; its output."""
        args = ["supernode", "register", str(public_key), self.connection]
        rc, out = self.flwr(f"register-{public_key.stem}", args, timeout_s)
        assert rc == 0, f"flwr {' '.join(args)} exited {rc}\n{out}\n{self.tails()}"
        return out

    # ----------------------------------------------------------------------------- bookkeeping
    def _remember(self, pid: int, st: tuple[int, int, int] | None = None) -> None:
        st = st or _stat(pid)
        if pid not in self.seen and st is not None:
            self.seen[pid] = (st[2], st[1], _cmdline(pid))

    def _sessions(self) -> set[int]:
        """The sessions the started processes opened (each is started in a new one; SuperExec too)."""
        return {sid for _, sid, _ in self.seen.values()} - {os.getsid(0)}

    def _watch(self) -> None:
        while not self._stop_watch.wait(0.25):
            self.sample()

    def sample(self) -> None:
        """Add to `seen` every live process whose parent is a seen one or that is in a seen session.

        The session rule keeps a process whose parent exited before it was sampled (reparented to
        init, e.g. an orphaned `flwr-clientapp`): it stays in the session its tree opened.
        """
        table = _proc_table()
        with self._lock:
            for p in self.procs:
                if p.pid in table:
                    self._remember(p.pid, table[p.pid])
            grew = True
            while grew:
                live = {
                    pid for pid, (start, _, _) in self.seen.items() if table.get(pid, (0, 0, -1))[2] == start
                }
                sessions = self._sessions()
                new = [
                    pid
                    for pid, (ppid, sid, _) in table.items()
                    if pid not in self.seen and (ppid in live or sid in sessions)
                ]
                for pid in new:
                    self._remember(pid, table[pid])
                grew = bool(new)

    def remaining(self) -> dict[int, str]:
        """Live processes of the started trees: seen ones (same pid AND start time) or in their sessions."""
        table = _proc_table()
        sessions = self._sessions()
        out = {}
        for pid, (_, sid, start) in table.items():
            known = self.seen.get(pid)
            if (known is not None and known[0] == start) or sid in sessions:
                out[pid] = known[2] if known else _cmdline(pid)
        return out

    def tails(self, lines: int = 30) -> str:
        return "\n".join(p.tail(lines) for p in self.procs)

    def stop(self, grace_s: float = 5.0) -> dict[int, str]:
        """Stop every started tree (last started first, the SuperLink last); what was still alive after.

        Each tree goes with `stop_tree` (SIGTERM to the processes and their groups, SIGKILL after
        `grace_s`); then whatever of them still runs gets `stop_tree` by pid, and a SIGKILL.
        """
        self.sample()
        self._stop_watch.set()
        self._watcher.join(timeout=5)
        for proc in reversed(self.procs):
            if proc.alive() or descendants(proc.pid):
                stop_tree(proc.pid, grace_s=grace_s)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=grace_s)
        # anything that outlived its tree (reparented to init, or in a session of ours): by pid
        for pid in self.remaining():
            stop_tree(pid, grace_s=grace_s)
        leftovers = self.remaining()
        for pid in leftovers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return leftovers
