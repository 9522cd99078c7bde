"""Could the client's own data correct the proxy's relation vector, and what would that cost?

On a `paper_tables.py` run (its results.json and pre-trained weights): the gradient noise scale B_simple
(McCandlish et al. 2018, appendix A.1) per source, and the picks it corrects. docs/results/noise_scale.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paper_cells
import paper_setup
import paper_tables as pt
import torch
from bench_common import read_json

from powerctl.cli.util import OneLineParser
from powerctl.devices import open_device
from powerctl.devices.boards import board_model
from powerctl.devices.simulated import predicted_profile, replay_cost
from powerctl.devices.torchdev import TORCH_SPEC_HELP, torch_device_arg
from powerctl.errors import FileFormatError
from powerctl.records.relation import RelationVector, fit_batch_efficiency
from powerctl.selection.baselines import oracle
from powerctl.selection.capsource import cap_text
from powerctl.selection.joint import select
from powerfed.training.data import train_test_split
from powerfed.training.models import build_model
from powerfed.training.tasks import loss_fn


def noise_scale(
    model: torch.nn.Module,
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ds: Any,
    params: dict[str, list[str]],
    *,
    micro: int,
    count: int,
    reps: int,
    seed: int,
) -> tuple[dict[str, float], int]:
    """(B_simple per parameter set, samples used): `reps` draws of `count` micro-batches of `micro`
    samples; |G_small|² is the micro-batches' mean squared gradient norm, |G_big|² that of their mean
    (a batch of micro·count). |G|² and tr(Σ) are summed over draws before their ratio (a ratio of noisy
    estimates is biased). `params` names each set's parameters (the same backward passes serve all)."""
    g = torch.Generator().manual_seed(seed)
    named = dict(model.named_parameters())
    where = next(iter(named.values())).device  # the batches go where the model is (--device)
    b_small, b_big = micro, micro * count
    g2 = dict.fromkeys(params, 0.0)
    trace = dict.fromkeys(params, 0.0)
    model.train()
    for _ in range(reps):
        idx = torch.randperm(len(ds.x), generator=g)[:b_big]
        grads: dict[str, list[torch.Tensor]] = {k: [] for k in params}
        for i in range(count):
            part = idx[i * micro : (i + 1) * micro]
            model.zero_grad()
            loss(model(ds.x[part].to(where)), ds.y[part].to(where)).backward()
            filled = {n: p.grad for n, p in named.items() if p.grad is not None}  # every parameter's
            for k, names in params.items():
                grads[k].append(torch.cat([filled[n].flatten() for n in names]))
        for k, rows in grads.items():
            stacked = torch.stack(rows)
            small_sq = stacked.pow(2).sum(dim=1).mean().item()
            big_sq = stacked.mean(dim=0).pow(2).sum().item()
            g2[k] += (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
            trace[k] += (small_sq - big_sq) / (1 / b_small - 1 / b_big)
    return {k: trace[k] / g2[k] for k in params}, reps * b_big


def parameter_sets(model: torch.nn.Module, vision: bool) -> dict[str, list[str]]:
    """ "all" parameters, and for vision "pre-trained": all but the fresh head's (`paper_setup.fresh_head`
    replaces the last linear layer), whose large starting gradient dominates |G|² on every source."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    if not vision:
        return {"all": names}
    head = paper_setup.head_name(model)
    return {"all": names, "pre-trained": [n for n in names if not n.startswith(f"{head}.")]}


def corrected(raw: RelationVector, b_crit: float | None, ratio: float, name: str) -> RelationVector:
    """The proxy's vector with its critical batch size stretched by `ratio`: every r_b multiplied by
    (1 + b / (ratio·b_crit)) / (1 + b / b_crit), so the proxy's own shape (even where the model does not
    explain it) is kept and only its batch-size penalty changes."""
    if b_crit is None or b_crit <= 0:
        return raw
    samples = {b: s * (1 + b / (ratio * b_crit)) / (1 + b / b_crit) for b, s in raw.samples_map().items()}
    return RelationVector.from_samples(raw.model, name, raw.target_accuracy, samples)


def task_for(results: dict[str, Any], key: str) -> paper_setup.Task:
    """The paper_tables task behind `key` (TASK|MODEL), with its data, as that bench builds it."""
    name, charged = key.split("|")
    args = pt.parse_args(["--task", name, "--vision-models", charged if name == "vision" else "resnet18"])
    task = next(t for t in pt.make_tasks(args) if t.charged == charged)
    pt.prepare_data(task, quick=False)
    task.targets = results[f"{key}|targets"]
    return task


Scales = dict[str, dict[str, list[float]]]
"""Parameter set → source → B_simple per estimator seed."""


def measure(folder: Path, results: dict[str, Any], args: argparse.Namespace, host: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in [k.rsplit("|", 1)[0] for k in results if k.endswith("|relation")]:
        task = task_for(results, key)
        weights = pt.pretrained(task, host, folder)
        sources = {"proxy": task.data["proxy"], **task.data["targets"]}
        print(f"\n== {key}: B_simple at the starting weights (micro-batch {args.micro}, "
              f"{args.count} per draw, {args.reps} draws, {args.estimator_seeds} seeds)")  # fmt: skip
        scales: Scales = {}
        for name, ds in sources.items():
            train, _ = train_test_split(ds, seed=0)
            model = build_model(task.model, ds.num_classes, seed=0).to(host.torch_device())
            sets = parameter_sets(model, task.name == "vision")
            for s in range(args.estimator_seeds):
                model.load_state_dict(copy.deepcopy(weights))
                values, used = noise_scale(model, loss_fn(ds.task), train, sets, micro=args.micro,
                                           count=args.count, reps=args.reps, seed=s)  # fmt: skip
                for k, v in values.items():
                    scales.setdefault(k, {}).setdefault(name, []).append(v)
            print(f"  {name:<22} " + "  ".join(
                f"{k} params: B_simple {statistics.fmean(by[name]):6.1f} "
                f"({', '.join(f'{v:.1f}' for v in by[name])})" for k, by in scales.items())
                + f"  [{used} samples each]")  # fmt: skip
        out[key] = analyse(key, task, results, scales, used, args.micro)
    return out


def analyse(key: str, task: paper_setup.Task, results: dict[str, Any], scales: Scales, used: int, micro: int
            ) -> dict[str, Any]:  # fmt: skip
    """The critical batch sizes the runs show against the noise-scale ratios, and every cell's picks."""
    raw = RelationVector.from_dict(results[f"{key}|relation"], key)
    per_seed = raw.per_seed_samples() or [[s] for s in raw.samples_to_target]
    proxy_fit = fit_batch_efficiency(raw.batch_sizes, per_seed)
    runs = results[f"{key}|runs"]
    seeds = sorted({r["seed"] for rs in runs.values() for r in rs})
    ratio = {
        k: {n: statistics.fmean(v) / statistics.fmean(by["proxy"]) for n, v in by.items()}
        for k, by in scales.items()
    }
    assert proxy_fit.b_crit is not None, "the proxy's runs show no growth with b (b_crit infinite)"
    print(f"  proxy: b_crit {proxy_fit.b_crit:.0f} from its runs (chi2 {proxy_fit.chi2:.1f} on "
          f"{proxy_fit.dof} dof)")  # fmt: skip
    out: dict[str, Any] = {
        "b_simple": scales,
        "samples_per_measurement": used,
        "proxy_b_crit": proxy_fit.b_crit,
    }
    for target, rs in runs.items():
        fit = fit_batch_efficiency(
            raw.batch_sizes, [[r["samples"] for r in rs if r["b"] == b] for b in raw.batch_sizes]
        )
        out[f"{target}|b_crit"] = fit.b_crit
        assert fit.b_crit is not None, f"{target}'s runs show no growth with b (b_crit infinite)"
        print(f"  {target}: b_crit {fit.b_crit:.0f} from its runs = {fit.b_crit / proxy_fit.b_crit:.2f}x the "
              f"proxy's (chi2 {fit.chi2:.1f} on {fit.dof} dof); B_simple "
              + ", ".join(f"{ratio[k][target]:.2f}x ({k} params)" for k in scales))  # fmt: skip
    w = task.data["charged_workload"]
    methods = ["ours", *(f"+noise({k})" for k in scales)]
    worst = dict.fromkeys(methods, 1.0)
    print("  picks (b) and ours/fastest; measuring = the measurement's simulated seconds / ours's fine-tune")
    print(f"  {'board':<13} {'cap':<7} {'target':<22} {'fastest':>7} "
          + " ".join(f"{m:>22}" for m in methods) + f" {'measuring':>9}")  # fmt: skip
    for board_name in paper_setup.BOARDS:
        board = board_model(board_name)
        profile = predicted_profile(board, w, raw.batch_sizes, samples=10_000)
        for cap in (*paper_setup.CAPS_W[board_name], None):
            cap_s = cap_text(cap)
            for target, rs in runs.items():
                by = {(r["b"], r["seed"]): r for r in rs}
                best = oracle(profile, paper_cells.target_relation(task, target, by, seeds), cap)
                fast = paper_cells.cell(board, w, by, best.batch_size, best.frequency_hz, seeds)["s"]
                vectors = {"ours": raw} | {
                    f"+noise({k})": corrected(raw, proxy_fit.b_crit, ratio[k][target], f"proxy+{target}")
                    for k in scales
                }
                picks = {m: select(profile, v, cap) for m, v in vectors.items()}
                secs = {
                    m: paper_cells.cell(board, w, by, p.batch_size, p.frequency_hz, seeds)["s"]
                    for m, p in picks.items()
                }
                cost_s, _ = replay_cost(board, w, micro, used // micro, picks["ours"].frequency_hz)
                for m in methods:
                    worst[m] = max(worst[m], secs[m] / fast)
                shown = [f"b={picks[m].batch_size} {secs[m] / fast:.3f}x" for m in methods]
                print(f"  {board_name:<13} {cap_s:<7} {target:<22} {best.batch_size:>7} "
                      + " ".join(f"{c:>22}" for c in shown) + f" {cost_s / secs['ours']:9.2f}")  # fmt: skip
                cell_out = {m: {"b": picks[m].batch_size, "over_fastest": secs[m] / fast} for m in methods}
                measuring = {"fastest_b": best.batch_size, "measuring_over_ours": cost_s / secs["ours"]}
                out[f"{board_name}|{cap_s}|{target}"] = measuring | cell_out
    print("  worst ours/fastest: " + ", ".join(f"{m} {v:.3f}x" for m, v in worst.items())
          + " (the measurement's own seconds not counted)")  # fmt: skip
    out["worst"] = worst
    return out


def read_results(folder: Path) -> dict[str, Any]:
    """A paper_tables results.json with at least one task's relation; else one line and exit status 2."""
    path, hint = folder / "results.json", "give a folder paper_tables.py --out wrote"
    try:
        results = read_json(path, hint)
        if not (isinstance(results, dict) and any(k.endswith("|relation") for k in results)):
            raise FileFormatError(f"{path} holds no paper_tables run; {hint}")
    except FileFormatError as exc:
        print(f"noise_scale: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return results


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog="noise_scale", description=__doc__.splitlines()[0])
    p.add_argument(
        "folders", type=Path, nargs="+", help="paper_tables.py --out folders (results.json, weights)"
    )
    p.add_argument("--micro", type=int, default=8, help="samples per micro-batch (the small batch)")
    p.add_argument(
        "--count", type=int, default=16, help="micro-batches per draw (the big batch: micro x count)"
    )
    p.add_argument("--reps", type=int, default=12, help="draws per estimate")
    p.add_argument("--estimator-seeds", type=int, default=3, help="independent estimates per source")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--device", type=torch_device_arg, default="auto", help=f"where the models run: {TORCH_SPEC_HELP}"
    )
    p.add_argument("--json", type=Path, help="write every number here")
    args = p.parse_args(argv)
    if min(args.micro, args.count - 1, args.reps, args.estimator_seeds) < 1:
        p.error("--micro, --reps and --estimator-seeds: at least 1; --count: at least 2")
    runs = {folder: read_results(folder) for folder in args.folders}  # all checked before any measuring
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    host = open_device(args.device)
    out: dict[str, Any] = {}
    for folder, results in runs.items():
        out.update(measure(folder, results, args, host))
    print(f"\nwall {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
