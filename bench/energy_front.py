"""The time–energy front, measured: is the fastest pair also the most frugal, and does fine-tuning agree?

On simulated boards: the demo's task profiled over the grid, its front under a few caps, the fine-tune run
at both ends over seeds. Results: docs/results/energy_front.md.
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import replace

from bench_common import demo_boards, mean_std, predicted_s

from fl_client.round import fine_tune_step, measured_profile_step, usable_relation
from powerctl.cli.plot import write_front
from powerctl.records.pick import Pick
from powerctl.selection.pareto import pareto_front
from simulations.bench_steps import PinnedRule

CAPS_W = {"jetson-nano": (None, 4.0, 3.0), "jetson-tx2nx": (None, 5.5, 4.0)}


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args, settings, works = demo_boards(__doc__, "energy-front", argv)
    print(
        f"model {settings.model}, target accuracy {settings.target_accuracy}, "
        f"{args.seeds} seeds per measured pair"
    )
    head = (
        f"{'board':<13} {'cap W':>5} {'front':>5} {'end':<12} {'b':>3} {'MHz':>6} {'pred s':>7} "
        f"{'meas s':>12} {'pred J':>7} {'meas J':>13}"
    )
    print(head + "\n" + "-" * len(head))
    summary = []
    for board, work in works.items():  # the client round's own steps: the grid profiled, pinned fine-tunes
        relation = usable_relation(work.instr, len(work.split()[0]))
        profile = measured_profile_step(work, relation).profile
        runs: dict[tuple[int, int, int], tuple[float, float]] = {}  # (b, Hz, seed) → (s, J), per board
        for cap in CAPS_W.get(board, (None,)):
            front = pareto_front(profile, relation, cap)
            cap_s = "none" if cap is None else f"{cap:g}"
            write_front(front, profile, relation, args.out / f"{board}-cap-{cap_s}")
            measured: dict[str, tuple[list[float], list[float]]] = {}
            ends: dict[str, Pick] = {"time-optimal": front.fastest, "energy-optimal": front.most_frugal}
            for end, s in ends.items():
                secs, joules = [], []
                for seed in range(args.seeds):
                    key = (s.batch_size, s.frequency_hz, seed)
                    if key not in runs:  # a pair at both ends, or under two caps: the same seeded run
                        seeded = replace(work, instr=replace(work.instr, seed=seed), device_seed=seed)
                        run = fine_tune_step(seeded, PinnedRule(*key[:2], profile, relation)).result
                        runs[key] = (run.device_s, run.energy_j or 0.0)
                    secs.append(runs[key][0])
                    joules.append(runs[key][1])
                measured[end] = (secs, joules)
                (ms, ss), (mj, sj) = mean_std(secs), mean_std(joules)
                print(
                    f"{board:<13} {cap_s:>5} {len(front.front):>5} {end:<12} {s.batch_size:>3} "
                    f"{s.frequency_hz / 1e6:>6.1f} {s.predicted_s:>7.1f} {ms:>6.1f} ± {ss:>4.1f} "
                    f"{s.predicted_energy_j:>7.1f} {mj:>6.1f} ± {sj:>5.1f}"
                )
            (t_fast, e_fast), (t_frugal, e_frugal) = (map(statistics.mean, measured[end]) for end in ends)
            fastest_j, frugal_j = front.fastest.predicted_energy_j, front.most_frugal.predicted_energy_j
            fastest_s, frugal_s = predicted_s(front.fastest), predicted_s(front.most_frugal)
            assert fastest_j is not None and frugal_j is not None, "a front's ends predict their energy"
            differ = front.fastest != front.most_frugal
            ratios = (frugal_j / fastest_j, e_frugal / e_fast, frugal_s / fastest_s, t_frugal / t_fast)
            summary.append((board, cap_s, differ, *ratios))
    print(
        f"\n{'board':<13} {'cap W':>5} {'ends differ':>11} {'energy frugal/fast':>26} "
        f"{'time frugal/fast':>24} {'measured agrees':>16}\n{'':<31} {'predicted':>12} {'measured':>9} "
        f"{'predicted':>12} {'measured':>9}"
    )
    for board, cap_s, differ, pe, me, pt, mt in summary:
        # where the front's ends differ: does fine-tuning measure the frugal end using less energy?
        agrees = ("yes" if me < 1.0 else "no") if differ else "(same pair)"
        print(
            f"{board:<13} {cap_s:>5} {'yes' if differ else 'no':>11} {pe:>12.3f} {me:>9.3f} "
            f"{pt:>12.3f} {mt:>9.3f} {agrees:>16}"
        )
    print(
        "\nmeasured: device seconds of training and energy to the first evaluation at the target (mean ± std "
        f"over seeds); predicted: T_N·r_b and E_N·r_b of the profile and relation vector.\n"
        f"fronts: {args.out}/BOARD-cap-CAP/pareto.png ({time.perf_counter() - started:.0f} s wall)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
