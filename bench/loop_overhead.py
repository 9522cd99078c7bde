"""How much does `fine_tune` cost over a bare PyTorch loop doing the same work? Repeats interleave; medians
are printed. What each loop does: docs/results/loop_overhead.md.
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
import time
from collections.abc import Callable

import torch

from powerctl.devices import Device, open_device
from powerctl.devices.host import HostDevice
from powerfed.training.data import load_dataset
from powerfed.training.finetune import fine_tune, step_workload
from powerfed.training.finetune_records import FineTuneCallbacks, FineTuneConfig
from powerfed.training.models import build_model
from powerfed.training.tasks import loss_fn


def bare_loop(
    model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, task: str, b: int, samples: int, lr: float
) -> tuple[float, float]:
    """(wall, CPU) seconds for `samples` training samples with the plainest loop there is (seed 0)."""
    criterion = loss_fn(task)
    start, cpu = time.perf_counter(), time.process_time()
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(0)
    n, done = len(x), 0
    model.train()
    while done < samples:
        perm = torch.randperm(n, generator=gen)
        for s in range(0, n - b + 1, b):
            idx = perm[s : s + b]
            xb, yb = x.index_select(0, idx), y.index_select(0, idx)
            opt.zero_grad(set_to_none=True)
            criterion(model(xb), yb).backward()
            opt.step()
            done += b
            if done >= samples:
                break
    return time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cnn-tiny", help="default: cnn-tiny (try resnet18-small)")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--samples", type=int, default=3200, help="training samples per timed run (default 3200)")
    ap.add_argument("--repeats", type=int, default=7, help="interleaved repeats, median reported (default 7)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: CPU time then measures work even on a busy machine; "
                    "0 = torch's choice)")  # fmt: skip
    ap.add_argument("--no-sim", action="store_true", help="skip the simulated board")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    ds = load_dataset("synthetic-image", split="train", limit=4000)
    test = ds.subset(list(range(32)))  # the one final evaluation: a few samples
    init = build_model(args.model, ds.num_classes, seed=0)
    workload = step_workload(copy.deepcopy(init), ds.task, ds.x, ds.y)
    b, lr = args.batch_size, 1e-3
    quiet = FineTuneCallbacks(progress=False)

    devices: dict[str, Device] = {"fine_tune/host": HostDevice()}
    if not args.no_sim:
        devices["fine_tune/sim:jetson-nano"] = open_device("sim:jetson-nano")

    def run_ft(device: Device, samples: int) -> tuple[float, float]:
        model = copy.deepcopy(init)
        start, cpu = time.perf_counter(), time.process_time()
        config = FineTuneConfig(batch_size=b, lr=lr, target_accuracy=None, max_samples=samples,
                                eval_every_samples=None, eval_max_samples=32, seed=0)  # fmt: skip
        fine_tune(model, ds, test, config, device=device, workload=workload, callbacks=quiet)
        return time.perf_counter() - start, time.process_time() - cpu

    def run_bare(samples: int) -> tuple[float, float]:
        return bare_loop(copy.deepcopy(init), ds.x, ds.y, ds.task, b, samples, lr)

    runners: dict[str, Callable[[int], tuple[float, float]]] = {"bare": run_bare}
    runners.update({name: functools.partial(run_ft, dev) for name, dev in devices.items()})
    for warm_up in runners.values():
        warm_up(4 * b)  # allocator, kernels, lazy imports
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in runners}
    names = list(runners)
    for r in range(args.repeats):  # interleaved, and the order rotates: no loop always runs first
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(runners[name](args.samples))

    steps = args.samples // b
    print(
        f"model {args.model}, batch {b}, {args.samples} samples ({steps} steps) per run, {args.repeats} "
        f"interleaved repeats, torch threads {torch.get_num_threads()}, medians"
    )
    medians = {name: [statistics.median(col) for col in zip(*ts, strict=True)] for name, ts in times.items()}
    base_wall, base_cpu = medians["bare"]
    head = f"  {'loop':<28} {'wall samples/s':>14} {'ms/step':>8} {'ratio':>6}"
    print(f"{head}   {'CPU samples/s':>13} {'ratio':>6}")
    for name, (wall, cpu) in medians.items():
        print(
            f"  {name:<28} {args.samples / wall:14.1f} {1e3 * wall / steps:8.2f} {base_wall / wall:6.3f}"
            f"   {args.samples / cpu:13.1f} {base_cpu / cpu:6.3f}"
        )
    print("ratio = throughput of the loop / throughput of the bare loop (1.000 = no overhead)")


if __name__ == "__main__":
    main()
