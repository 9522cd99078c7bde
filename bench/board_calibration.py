"""The simulated boards next to the paper's shape facts (Ahmed et al., TMLR 2025).

From the board model (noise-free, no training); what it prints: docs/results/board_calibration.md.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from bench_common import workload_of

from powerctl.devices.boards import BoardModel, board_model
from powerctl.devices.simulated import step_cost, top_clock_time_ratio
from powerctl.records.workload import Workload

BATCHES = (4, 8, 16, 32, 64, 128)
PAPER_SLOWDOWN = {"jetson-nano": (2.32, 1.95), "jetson-tx2nx": (2.43, 1.80)}
"""ResNet18, no cap → low cap: (at batch 128, at the proxy-best batch) — the paper's Tables 2–4."""
LOW_CLOCK = {"jetson-nano": 384_000_000, "jetson-tx2nx": 522_750_000}
"""Nano: 921.6 → 384 MHz, boards.yaml's calibration step; TX2 NX: the step at the same share of the top
clock (0.40 vs 0.42)."""
CAPS_W = {"jetson-nano": (2.5, 3.0, 3.5, 4.0, 5.0, 6.0), "jetson-tx2nx": (3.0, 3.5, 4.0, 5.0, 6.0, 8.0)}


def fits(board: BoardModel, w: Workload, b: int) -> bool:
    return w.memory_bytes(b) <= board.training_memory_bytes


def slowdowns(boards: list[BoardModel], ws: dict[str, Workload]) -> None:
    print("1. Slowdown, top clock → low clock, per batch size (time per step ratio)")
    for board in boards:
        hi, lo = board.frequencies_hz[-1], LOW_CLOCK[board.name]
        big, proxy = PAPER_SLOWDOWN[board.name]
        print(f"  {board.name}: {hi / 1e6:.1f} → {lo / 1e6:.1f} MHz (clock ratio {hi / lo:.2f})")
        print(f"    {'model':<22}" + "".join(f"{'b=' + str(b):>8}" for b in BATCHES) + f"{'128/16':>9}")
        for name in ("resnet18", "mobilenetv2", "chartransformer"):
            w = ws[name]
            s = {b: step_cost(board, w, b, lo).seconds / step_cost(board, w, b, hi).seconds for b in BATCHES}
            cells = "".join(f"{s[b]:>7.2f}x" if fits(board, w, b) else f"{'-':>8}" for b in BATCHES)
            print(f"    {name:<22}{cells}{s[128] / s[16]:>8.2f}x")
        print(
            f"    paper, ResNet18: {big:.2f}x at b=128, {proxy:.2f}x at the proxy-best batch "
            f"({big / proxy:.2f}x)"
        )


def _row(label: str, cells: list[str]) -> str:
    return f"    {label:<24}" + "".join(f"{c:>8}" for c in cells)


def speeds(boards: list[BoardModel], ws: dict[str, Workload]) -> None:
    nano, tx2 = boards
    print("\n2. Speed at the top clocks: time per sample, Nano / TX2 NX, by batch size")
    print(_row("model", [f"b={b}" for b in BATCHES]))
    for name, w in ws.items():
        ratios = [
            f"{top_clock_time_ratio(nano, tx2, w, b):.2f}x" if fits(nano, w, b) and fits(tx2, w, b) else "-"
            for b in BATCHES
        ]
        print(_row(name, ratios))
    for board in boards:
        if board.calibration is not None:
            calibration(board, ws[board.calibration.model])
    small_batch_end(nano, tx2, ws["resnet18"])


def calibration(board: BoardModel, w: Workload) -> None:
    """The board's calibrated time ratio against the paper's (its acceptance band: within 10%)."""
    cal = board.calibration
    assert cal is not None
    model = top_clock_time_ratio(board_model(cal.reference), board, w, cal.batch_size)
    paper = cal.paper_time_ratio()
    runs = ", ".join(f"{ref:g}/{own:g} s {target}" for target, (ref, own) in cal.seconds.items())
    tuned = ", ".join(k for k in board.sources if "calibrated" in board.source_kind(k))
    off = model / paper - 1
    print(
        f"  calibrated ({board.name}: {tuned}): {cal.model} at b={cal.batch_size}, {cal.reference} / "
        f"{board.name}:\n    model {model:.2f}x, paper {paper:.2f}x ({runs}): off by {off:+.1%}, "
        f"within 10%: {'yes' if abs(off) <= 0.10 else 'NO'}"
    )


def small_batch_end(nano: BoardModel, tx2: BoardModel, w: Workload) -> None:
    """Not tuned: the Nano / TX2 NX ratio per phase of the step, so its fall at small batches is explained."""
    cpu = nano.launch_s / tx2.launch_s
    dram = (tx2.memory_bandwidth_gbs * tx2.memory_efficiency) / (
        nano.memory_bandwidth_gbs * nano.memory_efficiency
    )
    peak = (tx2.gflops_per_ghz * tx2.frequencies_hz[-1]) / (nano.gflops_per_ghz * nano.frequencies_hz[-1])
    print(
        f"  the small-batch end (not tuned), Nano / TX2 NX per phase: CPU side (launches, step overhead) "
        f"{cpu:.2f}x,\n  DRAM {dram:.2f}x, GPU peak {peak:.2f}x times the utilisations' ratio; {w.model}:"
    )
    costs = [
        (step_cost(nano, w, b, nano.frequencies_hz[-1]), step_cost(tx2, w, b, tx2.frequencies_hz[-1]))
        for b in BATCHES
    ]
    print(_row("phase", [f"b={b}" for b in BATCHES]))
    for label, part in (("GPU compute", "compute_s"), ("CPU + DRAM (fixed)", "fixed_s"), ("step", "seconds")):
        print(_row(label, [f"{getattr(n, part) / getattr(t, part):.2f}x" for n, t in costs]))
    print(_row("CPU + DRAM share, Nano", [f"{n.fixed_s / n.seconds:.0%}" for n, _ in costs]))
    print(
        "    small steps are launch- and CPU-bound and gain about the CPU's ratio (PyTorch's launch path\n"
        "    runs on one core: a Cortex-A57 at 2.0 vs 1.43 GHz; on a Denver2 core it would gain more, not\n"
        "    measured); large steps gain the GPU's"
    )


def memory(boards: list[BoardModel], ws: dict[str, Workload]) -> None:
    print("\n3. Memory: training memory at b=128 (GiB) and the largest batch size (of 4..128) that fits")
    for board in boards:
        print(f"  {board.name}: {board.training_memory_bytes / 2**30:.2f} GiB for training")
        for name, w in ws.items():
            ok = [b for b in BATCHES if fits(board, w, b)]
            print(
                f"    {name:<22} {w.activation_bytes_per_sample / 2**20:6.2f} MiB/sample, "
                f"{w.memory_bytes(128) / 2**30:5.2f} GiB at 128 → largest {ok[-1] if ok else '-'}"
            )
    print("    paper: ResNet18 trains at 128 on the Nano; MobileNetV2 is omitted at 128 for memory")


def caps(boards: list[BoardModel]) -> None:
    print(
        "\n4. State-of-practice frequency per cap (MHz): the paper's rule vs full-load SGEMM (the old rule)"
    )
    for board in boards:
        sgemm = replace(board, state_of_practice=None)  # the rule on the full-load table
        cells = []
        for cap in CAPS_W[board.name]:
            r, s = (
                "-" if f is None else f"{f / 1e6:.1f}"
                for f in (board.fixed_frequency_cap(cap), sgemm.fixed_frequency_cap(cap))
            )
            cells.append(f"{cap:g} W: {r} (SGEMM {s})")
        print(f"  {board.name}: " + "; ".join(cells))


def trade_off(boards: list[BoardModel], ws: dict[str, Workload]) -> None:
    print("\n5. Trade-off at the top clock: peak W and ms/sample at b=4 → b=128 (or the largest that fits)")
    for board in boards:
        print(f"  {board.name}")
        hz = board.frequencies_hz[-1]
        for name, w in ws.items():
            b_max = max(b for b in BATCHES if fits(board, w, b))
            a, z = step_cost(board, w, 4, hz), step_cost(board, w, b_max, hz)
            print(
                f"    {name:<22} peak {a.peak_w:5.2f} → {z.peak_w:5.2f} W (b={b_max}); "
                f"{a.seconds / 4 * 1e3:6.1f} → {z.seconds / b_max * 1e3:5.1f} ms/sample"
            )


def sources(boards: list[BoardModel]) -> None:
    print("\n6. Where each constant comes from (boards.yaml sources; the loader refuses one without)")
    for board in boards:
        kinds: dict[str, list[str]] = {}
        for key in board.sources:
            kinds.setdefault(board.source_kind(key), []).append(key)
        print(f"  {board.name}")
        for kind, keys in sorted(kinds.items()):
            print(f"    {kind + ':':<23}{', '.join(keys)}")


def main() -> int:
    started = time.perf_counter()
    from powerfed.training.models import model_names

    ws = {n: workload_of(n) for n in model_names()}
    boards = [board_model("jetson-nano"), board_model("jetson-tx2nx")]
    slowdowns(boards, ws)
    speeds(boards, ws)
    memory(boards, ws)
    caps(boards)
    trade_off(boards, ws)
    sources(boards)
    print(f"\n(wall {time.perf_counter() - started:.1f} s, workloads measured on this machine's CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
