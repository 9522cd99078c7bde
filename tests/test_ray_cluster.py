"""The Ray preflight (a dead cluster is one line, not a hang) and `flwr run` on an existing Ray cluster.

The fast tests never read the machine's own /tmp/ray: every environment they resolve names its own
RAY_TMPDIR (other people run Ray here at the same time). The slow test starts its own two-node cluster
on 127.0.0.1 (tests.ray_local) and stops it by session id.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fl_server.fab import staged_app
from powerctl.procs import alive
from simulations.__main__ import main
from simulations.local_superlink import descendants, free_port, pids_listening_on, stop_local_superlink
from simulations.ray_cluster import (
    RayClusterError,
    find_target,
    preflight,
    raylet_gcs_addresses,
    record_file,
    split_address,
)
from tests.flower_deploy import BIN
from tests.ray_local import RayCluster

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def listening() -> Iterator[int]:
    """A port something answers on (a plain TCP listener standing in for a GCS)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def write_record(tmp: Path, address: str) -> Path:
    path = tmp / "ray" / "ray_current_cluster"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(address)
    return path


def one_line_error(env: dict[str, str]) -> str:
    with pytest.raises(RayClusterError) as caught:
        preflight(env)
    message = str(caught.value)
    assert "\n" not in message
    return message


# -------------------------------------------------------------------------------- where Ray looks


def test_the_record_lives_where_ray_2_55_looks_for_it(tmp_path: Path) -> None:
    assert record_file({}) == Path("/tmp/ray/ray_current_cluster")
    assert record_file({"TMPDIR": "/x"}) == Path("/x/ray/ray_current_cluster")
    assert record_file({"TMPDIR": "/x", "RAY_TMPDIR": "/y"}) == Path("/y/ray/ray_current_cluster")
    from ray._common.utils import get_ray_address_file  # the installed Ray agrees (with its own env)

    assert Path(get_ray_address_file(None)) == record_file(os.environ)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:6379", ("127.0.0.1", 6379)),
        ("head.example:6380", ("head.example", 6380)),
        ("ray://10.0.0.1:10001", ("10.0.0.1", 10001)),
        ("[::1]:6379", ("::1", 6379)),
        ("nonsense", None),
        ("host:", None),
        (":6379", None),
        ("host:99999", None),
    ],
)
def test_addresses_are_host_and_port(text: str, expected: tuple[str, int] | None) -> None:
    assert split_address(text) == expected


# ------------------------------------------------------------------------------------- preflight


def test_nothing_set_starts_a_new_local_cluster(tmp_path: Path) -> None:
    preflight({"RAY_TMPDIR": str(tmp_path)})
    target = find_target({"RAY_TMPDIR": str(tmp_path)})
    assert target.address is None
    assert "new local cluster" in target.describe() and str(tmp_path) in target.describe()


def test_ray_address_to_a_closed_port_is_one_line(tmp_path: Path) -> None:
    port = free_port()  # bound and closed again: nothing listens there
    message = one_line_error({"RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": f"127.0.0.1:{port}"})
    assert message.startswith(f"RAY_ADDRESS is 127.0.0.1:{port} but nothing answers there")
    assert "unset it" in message


def test_a_stale_record_is_one_line_naming_the_file(tmp_path: Path) -> None:
    port = free_port()
    record = write_record(tmp_path, f"127.0.0.1:{port}\n")
    message = one_line_error({"RAY_TMPDIR": str(tmp_path)})
    assert message.startswith(
        f"a Ray cluster is recorded in {record} at 127.0.0.1:{port} but nothing answers"
    )
    assert "remove that file" in message and "RAY_ADDRESS" in message
    # TMPDIR is where Ray looks when RAY_TMPDIR is unset (Linux)
    assert str(record) in one_line_error({"TMPDIR": str(tmp_path)})


def test_a_live_cluster_passes(tmp_path: Path, listening: int) -> None:
    address = f"127.0.0.1:{listening}"
    target = find_target({"RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": address})
    assert target.address == address and target.source == "RAY_ADDRESS"
    record = write_record(tmp_path, address)
    target = find_target({"RAY_TMPDIR": str(tmp_path)})
    assert target.address == address and str(record) in target.source
    assert target.describe() == f"Ray: the live cluster at {address} will be used (recorded in {record})"


def test_ray_address_wins_over_the_record_and_local_ignores_it(tmp_path: Path, listening: int) -> None:
    write_record(tmp_path, f"127.0.0.1:{free_port()}")  # stale
    env = {"RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": f"127.0.0.1:{listening}"}
    assert find_target(env).address == f"127.0.0.1:{listening}"
    assert find_target({**env, "RAY_ADDRESS": "local"}).address is None
    assert "nothing answers" in one_line_error({**env, "RAY_ADDRESS": ""})  # empty = unset, as in Ray


def test_malformed_addresses_are_one_line(tmp_path: Path) -> None:
    assert "not HOST:PORT" in one_line_error({"RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": "nonsense"})
    write_record(tmp_path, "garbage")
    assert "not HOST:PORT" in one_line_error({"RAY_TMPDIR": str(tmp_path)})


def test_auto_uses_the_record_or_a_raylet_here(
    tmp_path: Path, listening: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"RAY_TMPDIR": str(tmp_path), "RAY_ADDRESS": "auto"}
    monkeypatch.setattr("simulations.ray_cluster.raylet_gcs_addresses", set)
    assert "RAY_ADDRESS is auto but no Ray cluster runs on this machine" in one_line_error(env)
    write_record(tmp_path, f"127.0.0.1:{listening}")
    assert find_target(env).address == f"127.0.0.1:{listening}"
    # one raylet running here wins over the record, as in Ray's get_ray_address_from_environment
    dead = f"127.0.0.1:{free_port()}"
    monkeypatch.setattr("simulations.ray_cluster.raylet_gcs_addresses", lambda: {dead})
    assert f"a raylet here names {dead} but nothing answers" in one_line_error(env)


def test_raylets_are_found_in_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for pid, argv in {
        "11": [
            "/venv/ray/core/src/ray/raylet/raylet",
            "--node_ip_address=10.0.0.2",
            "--gcs-address=10.0.0.1:6379",
        ],
        "12": ["/usr/bin/python", "--gcs-address=10.0.0.9:1"],  # not a raylet
        "13": ["raylet", "--gcs-address=None"],
    }.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
    (tmp_path / "self").mkdir()
    monkeypatch.setattr("powerctl.procs.PROC", tmp_path)
    assert raylet_gcs_addresses() == {"10.0.0.1:6379"}


# ------------------------------------------------------------------------------------ ray-check


def test_ray_check_says_which_cluster(
    tmp_path: Path, listening: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert main(["ray-check"]) == 0
    assert capsys.readouterr().out.startswith("Ray: a new local cluster will be started (RAY_ADDRESS unset")
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{listening}")
    assert main(["ray-check"]) == 0
    live = f"Ray: the live cluster at 127.0.0.1:{listening} will be used (RAY_ADDRESS)\n"
    assert capsys.readouterr().out == live


def test_ray_check_notes_a_running_local_superlink(
    tmp_path: Path, listening: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", str(free_port()))
    assert main(["ray-check"]) == 0
    assert "note:" not in capsys.readouterr().out
    monkeypatch.setenv("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", str(listening))  # "a SuperLink": this process
    assert main(["ray-check"]) == 0
    note = capsys.readouterr().out.splitlines()[1]
    assert note.startswith(f"note: a local SuperLink already listens on port {listening} (pid {os.getpid()})")
    assert note.endswith(f"`python -m simulations stop-superlink --port {listening}` first")


def test_ray_check_on_a_dead_cluster_is_one_line_and_exit_2(tmp_path: Path) -> None:
    port = free_port()
    env = dict(os.environ, RAY_TMPDIR=str(tmp_path), PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    write_record(tmp_path, f"127.0.0.1:{port}")
    done = subprocess.run(
        [sys.executable, "-m", "simulations", "ray-check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"python -m simulations: error: a Ray cluster is recorded in {tmp_path}/ray/ray_current_cluster "
        f"at 127.0.0.1:{port} but nothing answers there: remove that file (`ray stop` removes it too, but "
        "stops every Ray cluster on this machine), or set RAY_ADDRESS to a live cluster, or "
        "RAY_ADDRESS=local for a new local one"
    ]


def test_make_run_checks_ray_before_flwr_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make run`'s launcher (and the fleet runner, through the same `run_flwr`) refuses a dead cluster
    in one line before `flwr run` starts anything."""
    from simulations.launcher import check_launch, launch

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("flwr run was started before Ray was checked")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")  # nothing listens there
    with pytest.raises(RayClusterError, match="nothing answers there"):
        launch(check_launch(2, "", tmp_path / "flwr", tmp_path / "flwr.log"))


# ------------------------------------------------------------------------- an existing Ray cluster

RUN_CONFIG = (
    "model='cnn-tiny' num-server-rounds=1 relation-seeds='0' batch-sizes='8,16' pretrain-samples=256 "
    "target-accuracy=0.3 budget-samples=96 eval-every-samples=32 eval-max-samples=64 "
    "profile-samples=512 profile-warmup=0 profile-steps=1"
)
ACTOR_LINE = re.compile(r"\(ClientAppActor pid=(\d+)\)")


@pytest.mark.slow
def test_flwr_run_runs_its_clients_on_a_joined_ray_worker(
    tmp_path: Path, seeded_cache: Callable[[str], Path]
) -> None:
    """A head with no CPUs on the SuperLink host and one worker joined to it (`ray start --address`):
    `flwr run` with RAY_ADDRESS joins as a driver and every ClientApp actor runs on the worker node."""
    env = dict(
        os.environ,
        PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(ROOT),  # the nodes' workers and the FAB (built from ROOT) both import this tree
        FLWR_DISABLE_UPDATE_CHECK="1",
        RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0",
    )
    env.pop("RAY_ADDRESS", None)
    cluster = RayCluster(port=free_port())
    port: int | None = None
    results = tmp_path / "results"
    superlink: list[int] = []
    try:
        head = cluster.start_node(env, num_cpus=0, head=True)
        # a ClientApp sees its node's `ray start` environment (Flower passes on only PYTHONPATH)
        worker = cluster.start_node(dict(env, POWERFED_CACHE=str(tmp_path / "worker-cache")), 2, head=False)
        # the SuperLink's ports are picked once Ray's nodes hold theirs: a free port picked before and not
        # yet bound can be handed out again, to Ray's client server (seen in CI)
        port, control = free_port(), free_port()
        recorded = (head.temp_dir / "ray_current_cluster").read_text().strip()
        assert recorded.endswith(f":{cluster.port}")
        # the head's record is where Ray looks when RAY_TMPDIR names the folder above it
        assert find_target({"RAY_TMPDIR": str(head.temp_dir.parent)}).address == recorded
        run_env = dict(
            env,
            POWERFED_CACHE=str(run_cache := seeded_cache(RUN_CONFIG)),  # the run's weights, prepared
            RAY_ADDRESS=cluster.address,
            FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(port),
            FLWR_LOCAL_CONTROL_API_PORT=str(control),
        )
        assert find_target(run_env).describe() == (
            f"Ray: the live cluster at {cluster.address} will be used (RAY_ADDRESS)"
        )
        app = staged_app(ROOT, tmp_path / "app")  # as the launcher runs it (tests/test_flwr_run.py)
        cmd = [str(BIN / "flwr"), "run", str(app), "--stream", "--federation-config"]
        cmd += ["num-supernodes=2 client-resources-num-cpus=1", "--run-config"]
        cmd += [f"{RUN_CONFIG} results-dir='{results}'"]
        proc = subprocess.run(cmd, cwd=ROOT, env=run_env, capture_output=True, text=True, timeout=420)
        for pid in pids_listening_on(port):
            superlink += [pid, *descendants(pid)]
    finally:
        try:
            if port is not None:
                stop_local_superlink(port)
        finally:  # the cluster is stopped even when the SuperLink's stop refuses (a port not its own)
            left = cluster.stop()
    try:
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-4000:]
        assert f"results: {results / 'results.json'}" in proc.stdout.splitlines(), out[-4000:]
        assert superlink and not [p for p in superlink if alive(p)], "the SuperLink's processes are alive"
        assert left == [], f"processes of the Ray cluster survived: {left}"

        # the ServerApp's simulation joined the cluster as a driver (its core log is in the head's session)
        assert head.log_files("python-core-driver-*.log"), "no driver joined the head"
        # every actor the run names ran on the joined worker node: its log is in that node's session
        actors = {int(pid) for pid in ACTOR_LINE.findall(proc.stdout + proc.stderr)}
        assert actors, out[-3000:]
        for pid in actors:
            (log,) = worker.log_files(f"worker-*-{pid}.out")
            assert ":actor_name:ClientAppActor" in log.read_text()
            assert not head.log_files(f"worker-*-{pid}.out")
        # the clients profiled under the worker node's cache; the ServerApp read its weights from the run's
        assert list((tmp_path / "worker-cache" / "profile").glob("profile-*.json"))
        assert not (tmp_path / "worker-cache" / "weights").exists()
        assert not (run_cache / "profile").exists()
        # the cluster is gone, its record stays: exactly the stale record the preflight refuses
        with pytest.raises(RayClusterError, match="nothing answers there"):
            preflight({"RAY_TMPDIR": str(head.temp_dir.parent)})
    finally:
        cluster.remove_temp_dirs()
