"""A private Ray cluster for tests: `ray start` nodes on 127.0.0.1, stopped by session id, never by name.

Other people run Ray on the same machine, so nothing here may use `ray stop` (it stops every Ray there)
or touch /tmp/ray: every node gets its own short temp dir (Ray's unix sockets live under it, and a socket
path may not pass 107 bytes, so pytest's long tmp_path will not do) and its own free ports (the head's
Ray Client server, dashboard and agent ports default to fixed numbers that would clash).

`ray start` forks its daemons and exits; started with `start_new_session`, its pid is the session id of
every daemon it leaves (gcs_server, raylet, agents) and of the workers they fork, so a node is "every
process of that session, and their descendants". Linux does not hand out a pid still in use as a session
id, and `ray start` itself has exited, so a process whose pid IS that session id is somebody else's new
session: then ours is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from powerctl.procs import alive
from simulations.local_superlink import descendants, free_port, proc_stat, proc_table
from tests.flower_deploy import BIN


@dataclass
class RayNode:
    """One `ray start` node: its session id and its temp dir (logs, session dir, cluster record)."""

    sid: int
    leader_ticks: int
    """Start time of `ray start` itself: tells our session from a later one with the same id."""
    temp_dir: Path
    output: str

    def processes(self) -> list[int]:
        """Every running process of this node's session, and their descendants."""
        table = proc_table()
        leader = table.get(self.sid)
        if leader is not None and leader.start_ticks != self.leader_ticks:
            return []
        members = [pid for pid, st in table.items() if st.sid == self.sid and st.running]
        found = set(members)
        for pid in members:
            found.update(descendants(pid))
        return sorted(p for p in found if alive(p))

    def log_files(self, pattern: str) -> list[Path]:
        """This node's log files of its (one) session matching `pattern`."""
        return sorted((self.temp_dir / "session_latest" / "logs").glob(pattern))


@dataclass
class RayCluster:
    """A head (and any workers joined to it) started by a test; `stop()` ends them all."""

    port: int
    nodes: list[RayNode] = field(default_factory=list)
    roots: list[Path] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_node(self, env: Mapping[str, str], num_cpus: int, head: bool) -> RayNode:
        root = Path(tempfile.mkdtemp(prefix="r", dir="/tmp"))  # /tmp/rXXXXXXXX: short socket paths
        self.roots.append(root)
        temp_dir = root / "ray"
        cmd = [str(BIN / "ray"), "start", "--temp-dir", str(temp_dir), "--num-cpus", str(num_cpus)]
        cmd += ["--disable-usage-stats", "--dashboard-agent-listen-port", str(free_port())]
        if head:
            cmd += ["--head", "--node-ip-address", "127.0.0.1", "--port", str(self.port)]
            cmd += ["--include-dashboard=false", "--dashboard-port", str(free_port())]
            cmd += ["--ray-client-server-port", str(free_port())]
        else:
            cmd += ["--address", self.address]
        proc = subprocess.Popen(
            cmd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        # recorded before waiting: a timeout must still leave the node stoppable
        st = proc_stat(proc.pid)
        node = RayNode(proc.pid, st.start_ticks if st else -1, temp_dir, output="")
        self.nodes.append(node)
        node.output, _ = proc.communicate(timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start failed ({proc.returncode}):\n{node.output[-3000:]}")
        return node

    def processes(self) -> list[int]:
        return sorted({p for node in self.nodes for p in node.processes()})

    def stop(self, grace_s: float = 10.0) -> list[int]:
        """SIGTERM every process of every node (workers first) and its group; SIGKILL after `grace_s`.

        Returns what is still alive (empty when all went)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = [p for node in reversed(self.nodes) for p in node.processes()]
            for pid in pids:
                with contextlib.suppress(OSError):
                    if (group := os.getpgid(pid)) != os.getpgrp():
                        os.killpg(group, sig)
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and self.processes():
                time.sleep(0.2)
            if not self.processes():
                break
        return self.processes()

    def remove_temp_dirs(self) -> None:
        for root in self.roots:
            shutil.rmtree(root, ignore_errors=True)
