"""Does a fleet's choice flip with torch's thread count? (a stand-in for another CPU)

The fleet prepared on 1 and on 2 threads; per board, the two vectors' picks pass when the same or each
within the other's interval (docs/results/fleets.md). Exit status 0: every board passes; 1: some board's
picks are apart; 2: bad input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench_common import ROOT, predicted_s, workload_of

from powerctl.cli.util import OneLineParser
from powerctl.devices.simulated import predicted_profile
from powerctl.records.pick import Pick
from powerctl.records.profile import Profile
from powerctl.records.relation import (
    DEFAULT_RELATION_RULE,
    INTERVAL_STANDARD_ERRORS,
    RELATION_RULES,
    RelationVector,
)
from powerctl.selection.joint import indistinguishable, rank, select
from simulations.fleet import FleetFileError, load_fleet_spec

DEFAULT_FLEET = ROOT / "simulations" / "fleets" / "default.yaml"

PREPARE = """
import json, sys
from pathlib import Path
from fl_server.app import prepare
from fl_server.run_config import app_config, parse_server_config
from simulations.fleet import load_fleet_spec

spec = load_fleet_spec(Path(sys.argv[1]))
out = Path(sys.argv[2])
run = spec.run_config(out / "results", spec.settings.methods, out / "profiles")
cfg = parse_server_config({**app_config(Path(sys.argv[3])), **run})
_, relation = prepare(cfg)
print(json.dumps(relation))
"""


def prepared_relation(fleet: Path, threads: int, cache: Path) -> RelationVector:
    """The fleet's relation vector, prepared (or read from `cache`) with torch on `threads` threads."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "POWERFED_CACHE": str(cache),
        "PYTHONPATH": str(ROOT),
    }
    argv = [sys.executable, "-c", PREPARE, str(fleet), str(cache.parent), str(ROOT)]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"preparing with {threads} thread(s) failed: {proc.stderr.strip()[-2000:]}")
    return RelationVector.from_dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def board_profiles(fleet: Path) -> list[tuple[str, float | None, Profile]]:
    """Each board of the fleet: its label, its power cap and its board model's noise-free profile."""
    spec = load_fleet_spec(fleet)
    workload = workload_of(spec.settings.model)
    sizes = spec.settings.batch_sizes
    return [
        (b.label(), b.power_cap_w, predicted_profile(b.device.removeprefix("sim:"), workload, sizes, 1000))
        for b in spec.boards
    ]


def within_interval(profile: Profile, relation: RelationVector, cap: float | None, pick: Pick) -> bool:
    """Under `relation`, `pick` is one of the pairs the vector cannot tell from the mean rule's best
    (`powerctl.selection.joint.indistinguishable`, what the interval rule chooses among)."""
    ranked = rank(profile, relation, cap, rule="mean")
    return (pick.batch_size, pick.frequency_hz) in {
        (s.batch_size, s.frequency_hz) for s in indistinguishable(ranked, relation)
    }


@dataclass(frozen=True)
class BoardPicks:
    label: str
    one: Pick
    two: Pick
    same: bool
    within: bool  # the same pair, or each within the other's interval under both vectors


def compare(
    one: RelationVector, two: RelationVector, boards: list[tuple[str, float | None, Profile]], rule: str
) -> list[BoardPicks]:
    """Per board: the pick under each vector, and whether they pass (see the module's docstring)."""
    out = []
    for label, cap, profile in boards:
        a, b = select(profile, one, cap, rule=rule), select(profile, two, cap, rule=rule)
        same = (a.batch_size, a.frequency_hz) == (b.batch_size, b.frequency_hz)
        within = same or all(within_interval(profile, r, cap, p) for r in (one, two) for p in (a, b))
        out.append(BoardPicks(label, a, b, same, within))
    return out


def vector_line(name: str, r: RelationVector) -> str:
    half = r.interval_halfwidths()
    return f"  {name}: " + ", ".join(
        f"{b}: {v:.3f} ±{100 * half[b]:.0f}%" for b, v in zip(r.batch_sizes, r.relation, strict=True)
    )


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="bench/thread_picks.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--fleet", type=Path, default=DEFAULT_FLEET, help="the fleet file (default: the default fleet)"
    )
    p.add_argument("--rule", choices=RELATION_RULES, default=DEFAULT_RELATION_RULE, help="the relation rule")
    p.add_argument("--out", type=Path, default=Path("runs/thread_picks"), help="caches: OUT/threads-K/cache")
    args = p.parse_args(argv)
    try:
        boards = board_profiles(args.fleet)
    except FleetFileError as exc:
        print(f"bench/thread_picks.py: {exc}", file=sys.stderr)
        return 2
    vectors = {}
    for threads in (2, 1):  # 2 first: its cache is the one a fleet run reads
        started = time.perf_counter()
        vectors[threads] = prepared_relation(
            args.fleet, threads, args.out.resolve() / f"threads-{threads}" / "cache"
        )
        print(f"prepared with {threads} thread(s) in {time.perf_counter() - started:.0f} s", flush=True)
    one, two = vectors[1], vectors[2]
    z = f"{INTERVAL_STANDARD_ERRORS:g}"
    head = f"fleet {args.fleet}, rule {args.rule}; relation vectors"
    print(f"{head} (r_b, ± {z} standard errors of the seeds):")
    print(vector_line("1 thread ", one))
    print(vector_line("2 threads", two))
    rows = compare(one, two, boards, args.rule)
    for rule in RELATION_RULES:
        if rule != args.rule:
            other = compare(one, two, boards, rule)
            print(f"  (rule {rule}: {sum(r.same for r in other)} of {len(other)} boards the same pair, "
                  f"{sum(r.within for r in other)} pass)")  # fmt: skip
    for r in rows:
        verdict = "same" if r.same else ("within each other's interval" if r.within else "APART")
        print(
            f"  {r.label:<26} 1 thread b={r.one.batch_size}@{r.one.frequency_hz / 1e6:.1f} MHz "
            f"{predicted_s(r.one):8.1f} s   2 threads "
            f"b={r.two.batch_size}@{r.two.frequency_hz / 1e6:.1f} MHz {predicted_s(r.two):8.1f} s   {verdict}"
        )
    passed = sum(r.within for r in rows)
    print(
        f"{passed} of {len(rows)} boards pass ({sum(r.same for r in rows)} the same pair), rule {args.rule}"
    )
    return 0 if passed == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
