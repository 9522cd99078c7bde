"""Energy-under-deadline rounds vs everyone-fastest on a heterogeneous fleet, over seeds.

What it runs and prints: docs/results/deadline_rounds.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench_common import ROOT, line_buffered, mean_pm

from powerctl.selection.methods import ENERGY_UNDER_DEADLINE, run_method_named
from powerctl.selection.names import OURS, OURS_DEADLINE
from simulations.fleet import load_fleet_spec
from simulations.runner import run_fleet

METHODS = [OURS, OURS_DEADLINE]


def main(argv: list[str] | None = None) -> int:
    line_buffered()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fleet", type=Path, default=ROOT / "simulations" / "fleets" / "deadline.yaml")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "deadline")
    args = p.parse_args(argv)
    started = time.perf_counter()
    spec = load_fleet_spec(args.fleet)
    per: dict[str, dict[str, list[float]]] = {m: {"energy": [], "train": [], "round": []} for m in METHODS}
    met = 0
    for seed in range(args.seeds):
        results = run_fleet(
            spec.for_seed(seed), args.out / f"seed-{seed}", METHODS, echo=lambda _: None, plots=seed == 0
        )
        for s in results["summary"]:
            per[s["method"]]["round"].append(statistics.mean(s["makespans_s"]))
        for method in METHODS:
            rounds: dict[int, list[dict[str, Any]]] = {}
            for r in results["records"]:
                if r["method"] == method:
                    rounds.setdefault(r["round"], []).append(r)
            per[method]["energy"].append(
                statistics.mean(sum(c["energy_j"] or 0.0 for c in cs) for cs in rounds.values())
            )
            per[method]["train"].append(
                statistics.mean(max(c["device_s"] + (c.get("paused_s") or 0) for c in cs)
                                for cs in rounds.values())
            )  # fmt: skip
            if run_method_named(method).objective(spec.settings.round_objective) == ENERGY_UNDER_DEADLINE:
                clients = [c for cs in rounds.values() for c in cs]
                met += sum(bool(c.get("meets_deadline_predicted")) for c in clients)
        print(f"seed {seed}: {args.out / f'seed-{seed}' / 'summary.txt'}", flush=True)
    print(
        f"\nfleet {spec.name}: {len(spec.boards)} boards ({', '.join(b.label() for b in spec.boards)}), "
        f"{spec.settings.num_server_rounds} rounds, {args.seeds} seeds"
    )
    head = f"{'method':<15} {'fleet energy J/round':>22} {'training makespan s':>21} {'round makespan s':>19}"
    print(head + "\n" + "-" * len(head))
    for m in METHODS:
        d = per[m]
        print(f"{m:<15} {mean_pm(d['energy']):>22} {mean_pm(d['train']):>21} {mean_pm(d['round']):>19}")
    e = [a / b for a, b in zip(per["ours-deadline"]["energy"], per["ours"]["energy"], strict=True)]
    t = [a / b for a, b in zip(per["ours-deadline"]["train"], per["ours"]["train"], strict=True)]
    print(
        f"\nours-deadline / ours: energy {mean_pm(e)}, training makespan {mean_pm(t)} "
        f"(per seed, then mean ± std); client-rounds predicted to meet the deadline: {met}"
        f"\nplots of seed 0: {args.out / 'seed-0' / 'plots'} ({time.perf_counter() - started:.0f} s wall)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
