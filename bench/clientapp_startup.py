"""What each message costs a deployed board's ClientApp process: start-up (interpreter, imports, reading
the message) and work, wall and CPU seconds, per message type (query, train, evaluate). How it is measured,
and results: docs/results/clientapp_startup.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import ROOT

from fl_client.clientapp_entry import write_script
from powerctl.procs import connect_error, search_path
from simulations.local_superlink import FLOWER_ENV, free_port, stop_tree

BIN = Path(sys.executable).parent
NODE_CONFIG = 'device="sim:jetson-nano" power-cap-w=5.0 partition-id=0 num-partitions=1 name="nano"'
RUN_CONFIG = (
    "model='cnn-tiny' relation-seeds='0' min-nodes=1 pretrain-samples=256 relation-max-samples=3000 "
    "batch-sizes='8,32' target-accuracy=0.5 budget-samples=512 eval-every-samples=64 eval-max-samples=200 "
    "profile-samples=1000 profile-steps=1 profile-warmup=0 round-timeout=300.0"
)

RECORDER = r'''
import atexit, json, os, resource, sys

WATCHED = ("sqlalchemy", "alembic", "fastapi", "torch", "flwr.supernode.cli")
OUT = os.environ["POWERFED_BENCH_TIMES"]
TICKS = os.sysconf("SC_CLK_TCK")
with open("/proc/self/stat") as f:
    START = int(f.read().rsplit(")", 1)[1].split()[19]) / TICKS
record = {"pid": os.getpid()}


def now():
    """(wall, CPU) seconds since this process started."""
    with open("/proc/uptime") as f:
        wall = float(f.read().split()[0]) - START
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return round(wall, 3), round(ru.ru_utime + ru.ru_stime, 3)


def hook_torch():
    """The first forward pass of any torch module, once torch is imported (never imports it)."""
    import builtins

    plain = builtins.__import__

    def importing(*args, **kwargs):
        module = plain(*args, **kwargs)
        mod = sys.modules.get("torch.nn.modules.module")
        hook = getattr(mod, "register_module_forward_pre_hook", None)
        if hook is not None and "first_step" not in record:
            builtins.__import__ = plain

            def first(*_):
                record.setdefault("first_step", now())
                handle.remove()

            handle = hook(first)
        return module

    builtins.__import__ = importing


def write():
    record["exit"] = now()
    record["loaded"] = [w for w in WATCHED if any(m == w or m.startswith(w + ".") for m in sys.modules)]
    with open(OUT, "a") as f:
        f.write(json.dumps(record) + "\n")


def record_calls():
    from flwr.clientapp import ClientApp

    plain_call = ClientApp.__call__

    def call(self, message, context):
        record["type"] = message.metadata.message_type.split(".")[0]
        record["startup"] = now()
        try:
            return plain_call(self, message, context)
        finally:
            record["reply"] = now()

    ClientApp.__call__ = call


if os.path.basename(sys.argv[0]) == "flwr-clientapp" and "--help" not in sys.argv:
    hook_torch()
    atexit.register(write)
    record_calls()
'''


def run(app: Path, work: Path, rounds: int, flower_own: bool) -> list[dict[str, Any]]:
    """One deployed run of APP (`flower_own`: `flower-supernode` itself, not the wrapper); the recorded
    ClientApp processes."""
    times = work / "times.jsonl"
    site = work / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(RECORDER, encoding="utf-8")
    port = free_port()
    env = {
        **os.environ,
        **FLOWER_ENV,
        "FLWR_HOME": str(work / "flwr-home"),
        "POWERFED_CACHE": str(work / "cache"),
        "PYTHONUNBUFFERED": "1",
        "NO_COLOR": "1",
        "PATH": search_path(BIN),
        "PYTHONPATH": str(site),
        "POWERFED_BENCH_TIMES": str(times),
    }
    home = work / "flwr-home"
    home.mkdir()
    connection = f'[superlink]\ndefault = "bench"\n\n[superlink.bench]\naddress = "127.0.0.1:{port}"\n'
    (home / "config.toml").write_text(connection + "insecure = true\n", encoding="utf-8")
    procs: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        with (work / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(argv, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        procs.append(proc)
        return proc

    try:
        link = spawn("superlink", [str(BIN / "flower-superlink"), "--host", "127.0.0.1", "--port", str(port),
                                   "--insecure", "--disable-runtime-dependency-installation"])  # fmt: skip
        deadline = time.monotonic() + 60
        while connect_error("127.0.0.1", port, 0.5) is not None:
            if time.monotonic() > deadline or link.poll() is not None:
                raise SystemExit(f"clientapp_startup: nothing listens on 127.0.0.1:{port}; see the logs")
            time.sleep(0.2)
        supernode = (
            [str(BIN / "flower-supernode")] if flower_own else [sys.executable, "-m", "fl_client.supernode"]
        )
        spawn("supernode", [*supernode, "--superlink", f"127.0.0.1:{port}", "--port", str(free_port()),
                            "--insecure", "--node-config", NODE_CONFIG])  # fmt: skip
        run_config = f"{RUN_CONFIG} num-server-rounds={rounds} results-dir='{work / 'results'}'"
        flwr = spawn(
            "flwr-run", [str(BIN / "flwr"), "run", str(app), "bench", "--stream", "--run-config", run_config]
        )
        try:
            rc = flwr.wait(timeout=900)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"clientapp_startup: the run took over 900 s; see {work}/*.log") from None
        if rc != 0 or not (work / "results" / "results.json").is_file():
            raise SystemExit(f"clientapp_startup: the run failed (exit {rc}); see {work}/*.log")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(read(times)) < 1 + 2 * rounds:
            time.sleep(0.5)  # the last process writes its line as it exits
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                stop_tree(proc.pid, grace_s=5.0)
    results = json.loads((work / "results" / "results.json").read_text(encoding="utf-8"))
    reported = [c.get("startup_s") for r in results["rounds"] for c in r["clients"]]
    return [*read(times), {"type": "reported", "startup_s": reported}]


def read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def floor(command: Path, repeats: int = 3) -> tuple[float, float]:
    """The least (wall, CPU) seconds of `command --help`: a `flwr-clientapp` that imports what it
    imports before it loads an app, and stops: the floor no ClientApp under it can go under."""
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([str(command), "--help"], check=True, stdout=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        best = (min(best[0], time.perf_counter() - start), min(best[1], cpu))
    return best


def table(records: list[dict[str, Any]]) -> str:
    """One row per process: start-up, first step, work (start-up to reply) and the whole process."""

    def pair(v: list[float] | None) -> str:
        return f"{v[0]:.2f} / {v[1]:.2f}" if v else "-"

    def diff(a: list[float] | None, b: list[float] | None) -> list[float] | None:
        return [a[0] - b[0], a[1] - b[1]] if a and b else None

    rows = [
        "| message | start-up (wall / CPU s) | first step | work | to reply | process, to exit | imported |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    order = {"query": 0, "train": 1, "evaluate": 2}
    for r in sorted(records, key=lambda r: (order.get(r.get("type", ""), 9), r.get("pid", 0))):
        if r.get("type") == "reported":
            continue
        startup, reply = r.get("startup"), r.get("reply")
        rows.append(
            f"| {r.get('type', '?')} | {pair(startup)} | {pair(r.get('first_step'))} | "
            f"{pair(diff(reply, startup))} | {pair(reply)} | {pair(r.get('exit'))} | "
            f"{', '.join(r.get('loaded', [])) or '-'} |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--app", type=Path, default=ROOT, help="the Flower app folder to run (default: this one)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="server rounds (default 1)")
    parser.add_argument(
        "--flower-clientapp",
        action="store_true",
        help="run flower-supernode itself (Flower's own flwr-clientapp), not python -m fl_client.supernode",
    )
    parser.add_argument("--json", type=Path, help="also write the records here")
    args = parser.parse_args()
    if not (args.app / "pyproject.toml").is_file():
        parser.error(f"--app {args.app}: no pyproject.toml there; give the project's folder")
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: expected 1 or more")
    work = Path(tempfile.mkdtemp(prefix="clientapp-startup-"))
    records = run(args.app.resolve(), work, args.rounds, args.flower_clientapp)  # on failure, logs stay
    light = write_script(work)
    floors = {"Flower's own `flwr-clientapp`": floor(BIN / "flwr-clientapp")}
    if light is not None:
        floors["the light one (fl_client.clientapp_entry)"] = floor(light)
    shutil.rmtree(work, ignore_errors=True)
    print(table(records))
    reported: list[float | None] = next((r["startup_s"] for r in records if r.get("type") == "reported"), [])
    print(f"startup_s in results.json (train): {reported}")
    for name, (wall, cpu) in floors.items():
        print(f"{name} --help: {wall:.2f} s wall, {cpu:.2f} CPU s (least of 3)")
    if args.json:
        args.json.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
