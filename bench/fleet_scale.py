"""How a fleet run grows with the fleet: wall time and peak memory per round for 10, 100, 1,000 boards.

    .venv/bin/python bench/fleet_scale.py [--sizes 10,100,1000] [--rounds 2] [--out runs/bench/fleet-scale]

Each size runs `python -m simulations run`'s runner (`flwr run` on Ray, 1 CPU per client) on a generated
fleet in scale mode: predicted profiles, and every client a stand-in (real-share 0), so what is measured
is the framework — selection, the Flower round trip (query, train, evaluate), aggregation and
reporting for every client — not CPU training. One method (ours). Wall time per round is measured
between the ServerApp's own lines (the end of the previous round's evaluation → the end of this
round's); memory is the summed RSS of the SuperLink's process tree (SuperLink, simulation process with
the ServerApp, Ray and its actors), sampled every 0.25 s. The growth exponent k is fitted by least
squares on log(value) = k·log(boards) + c: k ≈ 1 is linear.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulations.fleet import load_fleet_spec  # noqa: E402
from simulations.local_superlink import descendants, free_port, pids_listening_on  # noqa: E402
from simulations.runner import run_fleet  # noqa: E402

FLEET = """\
name: scale-{n}
groups:
  - {{device: sim:jetson-nano, power-cap-w: 3.0, count: {a}}}
  - {{device: sim:jetson-nano, power-cap-w: none, count: {b}}}
  - {{device: sim:jetson-tx2nx, power-cap-w: 4.5, count: {c}}}
  - {{device: sim:jetson-tx2nx, power-cap-w: 3.5, count: {d}}}
task: {{model: cnn-tiny, target-accuracy: 0.7, batch-sizes: [8, 16, 32]}}
rounds: {rounds}
seeds: {{relation: [0, 1, 2]}}
budget: {{samples: 2000}}
scale: {{profiles: predicted, real-share: 0.0}}
methods: [ours]
"""
ROUND_END = re.compile(r"^round (\d+) evaluation")


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """Summed RSS of the SuperLink's tree on `port`, and of its largest process, every `every_s`."""

    def __init__(self, port: int, every_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.port, self.every_s = port, every_s
        self.samples: list[tuple[float, int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            pids = []
            for pid in pids_listening_on(self.port):
                pids += [pid, *descendants(pid)]
            sizes = [rss_bytes(p) for p in pids]
            self.samples.append((time.perf_counter(), sum(sizes), max(sizes, default=0)))
            self.stop.wait(self.every_s)


def run_size(n: int, rounds: int, out: Path) -> list[dict]:
    a = n // 4
    fleet = out / f"fleet-{n}.yaml"
    out.mkdir(parents=True, exist_ok=True)
    fleet.write_text(FLEET.format(n=n, a=n - 3 * a, b=a, c=a, d=a, rounds=rounds))
    port = free_port()
    marks: list[tuple[float, str]] = []

    def echo(line: str) -> None:
        marks.append((time.perf_counter(), line))

    sampler = Sampler(port)
    sampler.start()
    try:
        run_fleet(load_fleet_spec(fleet), out / f"run-{n}", ["ours"], echo=echo, plots=False, port=port)
    finally:
        sampler.stop.set()
        sampler.join()
    start = next(t for t, line in marks if line.startswith("relation vector r_b"))  # rounds start next
    rows, last = [], start
    for t, line in marks:
        m = ROUND_END.match(line)
        if m:
            window = [s for s in sampler.samples if last <= s[0] <= t]
            rows.append(
                {
                    "boards": n,
                    "round": int(m.group(1)),
                    "wall_s": t - last,
                    "peak_tree_mib": max((s[1] for s in window), default=0) / 2**20,
                    "peak_process_mib": max((s[2] for s in window), default=0) / 2**20,
                }
            )
            last = t
    return rows


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10,100,1000")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "fleet-scale")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    rows: list[dict] = []
    for n in sizes:
        started = time.perf_counter()
        got = run_size(n, args.rounds, args.out)
        rows += got
        print(
            f"{n} boards: {time.perf_counter() - started:.0f} s for the whole run (Ray start included)",
            flush=True,
        )
    head = (
        f"{'boards':>7} {'round':>5} {'wall s':>8} {'s/board':>8} {'peak tree MiB':>14} {'largest MiB':>12}"
    )
    print("\n" + head)
    for r in rows:
        print(
            f"{r['boards']:>7} {r['round']:>5} {r['wall_s']:>8.1f} {r['wall_s'] / r['boards']:>8.3f} "
            f"{r['peak_tree_mib']:>14.0f} {r['peak_process_mib']:>12.0f}"
        )
    for rnd in sorted({r["round"] for r in rows}):
        sel = [r for r in rows if r["round"] == rnd]
        if len(sel) < 2:
            continue
        xs = [r["boards"] for r in sel]
        k_t = fit_exponent(xs, [r["wall_s"] for r in sel])
        k_m = fit_exponent(xs, [r["peak_tree_mib"] for r in sel])
        k_p = fit_exponent(xs, [r["peak_process_mib"] for r in sel])
        print(
            f"round {rnd}: wall time grows as boards^{k_t:.2f}; peak memory of the tree as boards^{k_m:.2f}, "
            f"of the largest process as boards^{k_p:.2f} (1.00 = linear)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
