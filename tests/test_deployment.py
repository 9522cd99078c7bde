"""The Flower app deployed on loopback: a SuperLink, two SuperNodes with their own boards and caps.

Three connection modes share one flow (`Deployment` in tests/flower_deploy.py): insecure, TLS with a CA
made by the test, and TLS + SuperNode authentication (registered keys; an unregistered node is refused).
The whole flow runs once, with TLS and authentication, and a second run on the same deployment loses a
SuperNode mid-round: a deployment's start paid once (docs/testing.md). `deploy/loopback.sh`'s test and
the restart test run TLS + authentication as an operator does; an insecure SuperLink answers the
connection check (tests/test_connection_check.py), and every simulation's local SuperLink is insecure.
Every process a test starts, with all its children, is stopped by process id in the fixture's finalizer,
and the finalizer asserts that none of them is left. Logs are under tmp_path; failures quote their tails.
About 1 minute per mode (Flower's 3 s idle polling on each side dominates). The server's weights and
relation vector come from the test run's seeded cache (tests/conftest.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fl_server.results import CLIENT_FIELDS, RESULTS_SCHEMA
from simulations.local_superlink import stop_tree
from tests.flower_deploy import Deployment, Proc, make_ecdsa_key

pytestmark = pytest.mark.slow

NODES = {
    # SuperNode name → (device, power cap in W, partition id); each takes half the run's synthetic data
    "supernode-nano": ("sim:jetson-nano", 3.5, 0),
    "supernode-tx2nx": ("sim:jetson-tx2nx", 6.0, 1),
}
RUN_TIMEOUT_S = 300.0
"""`flwr run` is killed after this (a ~1 minute run; generous for a loaded 2-core CI machine)."""
REFUSAL_TIMEOUT_S = 60.0

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EMPTY_LOG_RECORD = re.compile(r"(DEBUG|INFO|WARNING|ERROR)\s*:\s*")


def node_config(device: str, cap: float, partition: int) -> str:
    return f'device="{device}" power-cap-w={cap} partition-id={partition} num-partitions=2'


def run_config_for(results_dir: Path) -> str:
    """cnn-tiny, one relation seed, one round, on small budgets: about a minute deployed."""
    return " ".join(
        [
            "model='cnn-tiny'",
            "relation-seeds='0'",
            "num-server-rounds=1",
            f"results-dir='{results_dir}'",
            "min-nodes=2",  # both SuperNodes in the round, whichever connects first
            "pretrain-samples=256",
            "relation-max-samples=3000",
            "batch-sizes='8,32'",
            "target-accuracy=0.5",
            "budget-samples=512",
            "eval-every-samples=64",
            "eval-max-samples=200",
            "profile-samples=1000",
            "profile-steps=1",
            "profile-warmup=0",
            "round-timeout=180.0",
        ]
    )


def content_lines(output: str) -> list[str]:
    """The output's lines without colour codes, blank lines, or Flower log records with no message.

    Flower 1.41 streams one empty ``INFO :`` record after the ServerApp returns, so the app's own
    last line is the last line with content, not the stream's last line.
    """
    lines = (_ANSI.sub("", line).rstrip() for line in output.splitlines())
    return [line for line in lines if line.strip() and not _EMPTY_LOG_RECORD.fullmatch(line.strip())]


def seeded_task(seeded_cache: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """$POWERFED_CACHE (which a Deployment passes on to its processes) holds the run's weights and
    relation vector, built once per test run by the server's own code."""
    task = " ".join(p for p in run_config_for(Path("unused")).split() if not p.startswith("results-dir="))
    monkeypatch.setenv("POWERFED_CACHE", str(seeded_cache(task)))


@pytest.fixture
def deployment(
    tmp_path: Path, seeded_cache: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str], Deployment]]:
    """Makes Deployments (on the seeded cache); the finalizer stops every process they started and
    asserts none is left."""
    seeded_task(seeded_cache, monkeypatch)
    made: list[Deployment] = []

    def make(mode: str) -> Deployment:
        d = Deployment(tmp_path / mode, mode=mode)
        made.append(d)
        return d

    started = time.monotonic()
    try:
        yield make
    finally:
        leftovers = {d.mode: d.stop() for d in made}
        wall = time.monotonic() - started
        for d in made:
            print(f"\ndeployment wall time [{d.mode}]: {wall:.1f} s ({len(d.seen)} processes seen)")
    for d in made:
        assert d.seen, "the deployment started no process"
        assert not leftovers[d.mode], f"processes left after stop ({d.mode}): {leftovers[d.mode]}"
        assert not d.remaining(), f"processes still running ({d.mode}): {d.remaining()}"


def deploy_and_run(
    d: Deployment, keys: dict[str, Path] | None = None, extra_env: dict[str, str] | None = None
) -> dict[str, Proc]:
    """SuperLink, connection, the two SuperNodes, `flwr run`; checks the output and the results, returns
    the SuperNodes (by name), still running."""
    if d.superlink is None:
        d.start_superlink()
        d.write_connection()
    for name, key in (keys or {}).items():
        d.register(key.with_name(key.name + ".pub"))
        print(f"registered {name}: {key}.pub")
    nodes = {
        name: d.start_supernode(name, node_config(*NODES[name]), (keys or {}).get(name), extra_env)
        for name in NODES
    }
    results_dir = d.root / "results"
    rc, output = d.run_app(run_config_for(results_dir), RUN_TIMEOUT_S)
    context = f"\n--- flwr run (exit {rc}) ---\n{output[-6000:]}\n{d.tails()}"
    assert rc == 0, f"flwr run failed{context}"
    assert all(n.alive() for n in nodes.values()), f"a SuperNode died during the run{context}"
    check_output(output, results_dir, context)
    check_results(results_dir / "results.json", context)
    return nodes


def check_output(output: str, results_dir: Path, context: str) -> None:
    lines = content_lines(output)
    header = [i for i, line in enumerate(lines) if line.split()[:3] == ["node", "device", "cap"]]
    assert len(header) == 1, f"expected one per-client table (one round){context}"
    rows = lines[header[0] + 2 : header[0] + 2 + len(NODES)]
    for device, cap, partition in NODES.values():
        row = next((r for r in rows if r.startswith(f"partition-{partition} ")), None)
        assert row is not None, f"no table row for partition-{partition}{context}"
        assert row.split()[1:3] == [device, f"{cap:.2f}"], f"row {row!r}{context}"
    assert lines[-1].startswith("results: "), f"the last line is {lines[-1]!r}, not 'results: ...'{context}"
    named = Path(lines[-1].removeprefix("results: ").strip())
    assert named == (results_dir / "results.json").resolve(), f"{named}{context}"
    assert named.is_file(), f"{named} does not exist{context}"


def check_results(path: Path, context: str) -> dict:
    results = json.loads(path.read_text(encoding="utf-8"))
    assert results["schema"] == RESULTS_SCHEMA
    assert [r["round"] for r in results["rounds"]] == [1], results["rounds"]
    rnd = results["rounds"][0]
    assert rnd["failed"] == [] and rnd["summary"]["failed"] == [], f"{rnd['summary']}{context}"
    clients = rnd["clients"]
    assert len(clients) == len(NODES), f"{clients}{context}"
    for c in clients:
        missing = [k for k in CLIENT_FIELDS if k not in c]
        assert not missing, f"client report lacks {missing}: {c}"
    got = sorted((c["device"], c["power_cap_w"]) for c in clients)
    assert got == sorted((device, cap) for device, cap, _ in NODES.values()), got
    for c in clients:
        assert c["peak_power_w"] is not None and c["peak_power_w"] <= c["power_cap_w"], c
        assert c["batch_size"] in (8, 32) and c["frequency_hz"] > 0 and c["samples"] > 0, c
        assert c["device_seconds"] > 0 and c["energy_j"] > 0 and 0.0 <= c["accuracy"] <= 1.0, c
    assert rnd["summary"]["over_cap"] == [], rnd["summary"]
    assert (path.parent / "global.safetensors").is_file()
    return results


def test_supernode_authentication_and_a_node_killed_mid_round(
    deployment: Callable[[str], Deployment],
) -> None:
    """TLS + SuperNode authentication: an unregistered node is refused in one line; the registered ones
    run a round, the whole table and results checked. Then a second run on the same deployment:
    partition-1's ClientApp hangs (injected), its SuperNode is stopped (SIGTERM, as a service manager
    stops it): the SuperLink answers for it (Flower error 5) and the round ends without it."""
    d = deployment("auth")
    keys = {name: make_ecdsa_key(d.root / "keys" / name)[0] for name in NODES}
    stranger, _ = make_ecdsa_key(d.root / "keys" / "unregistered")

    d.start_superlink()
    d.write_connection()
    refused = d.start_supernode("supernode-unregistered", node_config("sim:jetson-nano", 3.5, 0), stranger)
    started = time.monotonic()
    try:
        rc = refused.popen.wait(timeout=REFUSAL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        rc = None
    waited = time.monotonic() - started
    log = refused.log.read_text(errors="replace")
    assert rc is not None, (
        f"an unregistered SuperNode still runs after {REFUSAL_TIMEOUT_S} s\n{refused.tail()}"
    )
    assert rc != 0, f"an unregistered SuperNode exited 0\n{refused.tail()}"
    # What Flower 1.41 says for an unknown key (not "All SuperNodes must be registered": that is the reply
    # to a SuperNode that asks the Fleet API to register itself): the SuperNode logs "Exit Code: 305" and
    # "[code: 2004] Failed to activate SuperNode" and exits with status 1; the SuperLink answers 412.
    assert "Exit Code: 305" in log and "Failed to activate SuperNode" in log, refused.tail()
    superlink_log = (d.logs / "superlink.log").read_text(errors="replace")
    assert "No SuperNode found with the given public key" in superlink_log, d.superlink.tail()
    print(f"unregistered SuperNode refused: exit status {rc} after {waited:.1f} s")

    # the registered ones join, on the same SuperLink, and the run goes as without authentication, over TLS;
    # their ClientApps may be told to fail (POWERFED_FAULT_INJECTION): the first run tells none to
    fault_log = d.root / "faults.jsonl"
    inject = {"POWERFED_FAULT_INJECTION": "1", "POWERFED_FAULT_LOG": str(fault_log)}
    nodes = deploy_and_run(d, keys, inject)
    superlink_log = (d.logs / "superlink.log").read_text(errors="replace")
    assert "--insecure" not in d.superlink.argv and "--ssl-certfile" in d.superlink.argv
    assert all("--root-certificates" in p.argv for p in d.procs if p.name.startswith("supernode"))
    assert "Traceback" not in superlink_log, superlink_log[-4000:]
    assert not fault_log.exists()

    # a second run: seed 4 draws, for round 1, partition-0 nothing, partition-1 a hang (far longer than
    # the test); partition-1's SuperNode is stopped while it hangs
    results_dir = d.root / "results-killed"
    run_config = run_config_for(results_dir) + " inject-failures='hang:0.5' inject-seed=4 inject-hang-s=900.0"
    ran: dict[str, object] = {}

    def run() -> None:
        ran["rc"], ran["out"] = d.run_app(run_config, RUN_TIMEOUT_S)

    runner = threading.Thread(target=run)
    runner.start()
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline and not (fault_log.exists() and "hang" in fault_log.read_text()):
        time.sleep(0.5)
    assert fault_log.exists(), f"partition-1 never started its round\n{d.tails()}"
    stop_tree(nodes["supernode-tx2nx"].pid)
    runner.join(RUN_TIMEOUT_S + 30)
    context = f"\n--- flwr run (exit {ran.get('rc')}) ---\n{str(ran.get('out'))[-6000:]}\n{d.tails()}"
    assert ran.get("rc") == 0, f"flwr run failed{context}"
    (rnd,) = json.loads((results_dir / "results.json").read_text())["rounds"]
    assert [c["node_key"] for c in rnd["clients"]] == ["partition-0"], context
    assert [(f["node_key"], f["kind"]) for f in rnd["failed"]] == [("partition-1", "unavailable")], context
    assert rnd["evaluation"]["clients"] and (results_dir / "global.safetensors").is_file()
