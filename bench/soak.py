"""Soak: 20 simulated boards over 10 rounds of `flwr run` (Flower's simulation on Ray), failures injected.

What it checks and prints: bench/README.md. Exit status 1 if a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import ROOT, TreeMemory

from fl_client.faults import parse_faults
from powerctl.devices.simulated import POWER_NOISE
from simulations.local_superlink import flower_env, flwr_run_command, free_port, stop_local_superlink

FLEET = "sim:jetson-nano@3.0, sim:jetson-tx2nx@4.5, sim:jetson-nano@none, sim:jetson-tx2nx@3.5"


def prepare(work: Path) -> tuple[Path, Path]:
    """Starting weights (cnn-tiny pre-trained on 512 synthetic images) and a fixed relation vector."""
    from fl_server.pretrain import PretrainSettings, pretrain
    from powerctl.records.relation import RelationVector

    weights, relation = work / "weights.safetensors", work / "relation.json"
    settings = PretrainSettings(samples=512, seed=0)
    pretrain("cnn-tiny", "synthetic-image", out=weights, settings=settings, progress=False)
    RelationVector.from_samples("cnn-tiny", "synthetic-image", 0.99, {8: 1100.0, 16: 1000.0}).save(relation)
    return weights, relation


def flwr_run(
    env: dict[str, str], run_config: str, nodes: int, actors: int, log: Path, memory: TreeMemory
) -> int:
    federation = f"num-supernodes={nodes} client-resources-num-cpus=1 init-args-num-cpus={actors}"
    cmd = flwr_run_command(".", federation, run_config)
    with log.open("a") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        memory.roots.append(proc.pid)
        return proc.wait(timeout=1800)


def check(results: Path, fault_log: Path, nodes: int) -> dict[str, Any]:
    """Completed rounds, lost reports, cap violations and restores, from results.json and the fault log."""
    data = json.loads(results.read_text())
    faults = [json.loads(line) for line in fault_log.read_text().splitlines()] if fault_log.exists() else []
    lost: list[str] = []
    violations: list[str] = []
    restores = 0
    expected = {"raise": {"error"}, "hang": {"timeout"}, "kill": {"error", "unavailable"}}
    for rnd in data["rounds"]:
        s = rnd["summary"]
        if not s["sampled"] == nodes == s["reported"] + len(rnd["failed"]):
            counts = f"{s['sampled']} sent, {s['reported']} reports, {len(rnd['failed'])} failures"
            lost.append(f"round {rnd['round']}: {counts}")
        failed = {f["node_key"]: f["kind"] for f in rnd["failed"]}
        reported = {c["node_key"] for c in rnd["clients"]}
        for f in faults:
            if f["round"] != rnd["round"]:
                continue
            if f["node"] in reported and f["fault"] == "kill":
                continue  # killed in an earlier attempt of this round (a stopped ServerApp), resumed now
            if failed.get(f["node"]) not in expected[f["fault"]]:
                lost.append(f"round {rnd['round']}: injected {f['fault']} on {f['node']} not named")
        for c in rnd["clients"]:
            cap = c["power_cap_w"]
            if cap is not None and (
                c["profiled_peak_power_w"] > cap or c["peak_power_w"] > cap * (1 + 5 * POWER_NOISE)
            ):
                violations.append(
                    f"round {rnd['round']} {c['node_key']}: peak {c['peak_power_w']:.2f} W, cap {cap}"
                )
            restores += c.get("resumed_at_samples") is not None
    completed = [r["round"] for r in data["rounds"] if "evaluation" in r]
    named = {(r["round"], f["node_key"]) for r in data["rounds"] for f in r["failed"]}
    other = len(named - {(f["round"], f["node"]) for f in faults})
    kinds = {k: sum(f["fault"] == k for f in faults) for k in ("raise", "hang", "kill")}
    return dict(
        completed=completed, lost=lost, violations=violations, restores=restores, faults=kinds, other=other
    )


def first_kill_round(args: argparse.Namespace) -> int:
    """The first round after round 1 in which some node draws a kill (the draws are seeded): stopping
    the ServerApp there leaves a killed node's checkpoint for the restarted one to resume."""
    os.environ["POWERFED_FAULT_INJECTION"] = "1"  # parse_faults checks the switch
    faults = parse_faults({"inject-failures": args.failures, "inject-seed": args.seed})
    for rnd in range(2, args.rounds + 1):
        if faults and any(faults.draw(f"partition-{i}", rnd) == "kill" for i in range(args.nodes)):
            return rnd
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--failures", default="raise:0.1,hang:0.03,kill:0.03")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--round-timeout", type=float, default=60.0)
    ap.add_argument("--hang-s", type=float, default=70.0)
    ap.add_argument(
        "--stop-server-round",
        type=int,
        help="default: the first round after round 1 in which a node draws a kill; 0: never",
    )
    ap.add_argument("--actors", type=int, default=10, help="Ray actors (Flower keeps a dead one in its pool)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    if args.stop_server_round is None:
        args.stop_server_round = first_kill_round(args)
    work = args.out or Path(tempfile.mkdtemp(prefix="powerfed-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    weights, relation = prepare(work)
    port, control = free_port(), free_port()
    fault_log = work / "faults.jsonl"
    fault_log.unlink(missing_ok=True)
    env = flower_env(
        port,
        control,
        PYTHONPATH=str(ROOT),
        FLWR_HOME=str(work / "flwr-home"),
        POWERFED_CACHE=str(work / "cache"),
        POWERFED_FAULT_INJECTION="1",
        POWERFED_FAULT_LOG=str(fault_log),
    )
    results = work / "results"
    base = (
        f"model='cnn-tiny' weights='{weights}' relation='{relation}' num-server-rounds={args.rounds} "
        f"batch-sizes='8,16' target-accuracy=0.99 budget-samples=192 eval-every-samples=32 "
        f"eval-max-samples=64 checkpoint-every-samples=64 profile-samples=512 profile-warmup=0 "
        f"profile-steps=1 round-timeout={args.round_timeout} fleet='{FLEET}' results-dir='{results}' "
        f"inject-failures='{args.failures}' inject-seed={args.seed} inject-hang-s={args.hang_s}"
    )
    log = work / "flwr.log"
    memory = TreeMemory(port, every_s=0.5)
    memory.start()
    try:
        stop = [f"{base} inject-server-stop-round={args.stop_server_round}"] if args.stop_server_round else []
        codes = [flwr_run(env, config, args.nodes, args.actors, log, memory) for config in [*stop, base]]
    finally:
        memory.stop.set()
        stop_local_superlink(port)
    wall = time.monotonic() - started
    out = log.read_text(errors="replace")
    got = check(results / "results.json", fault_log, args.nodes)
    what = f"{args.nodes} simulated boards, {args.rounds} rounds, failures {args.failures}"
    print(f"soak: {what} (seed {args.seed})")
    print(
        f"ServerApp starts: {len(codes)} (stopped on purpose in round {args.stop_server_round or '-'}); "
        f"resumed: {'yes' if 'resume: rounds 1-' in out else 'no'}"
    )
    n = got["faults"]
    print(f"injected: {n['raise']} raise, {n['hang']} hang, {n['kill']} kill")
    print(f"failures not injected but caused by them (messages to a dead actor): {got['other']}")
    print(f"completed rounds: {len(got['completed'])} of {args.rounds}")
    print(f"lost reports: {len(got['lost'])}" + "".join(f"\n  {x}" for x in got["lost"]))
    print(f"cap violations: {len(got['violations'])}" + "".join(f"\n  {x}" for x in got["violations"]))
    print(f"restores (resumed or finished checkpoints answering a resent round): {got['restores']}")
    print(f"peak memory (process tree RSS): {memory.peak / 2**30:.2f} GiB")
    print(f"wall time: {wall:.0f} s  (log: {log}, results: {results / 'results.json'})")
    ok = not got["lost"] and not got["violations"] and len(got["completed"]) == args.rounds
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
