"""The layout of the paper's Tables 2–4 (Ahmed et al., TMLR 2025) on the simulated Nano and TX2 NX.

Rows: state-of-practice, proxy-batch, ours (Algorithm 1 with the proxy's relation vector), fastest (the
oracle: the feasible (b, f) with the least mean device time on the target itself). Columns: target
dataset × (two power caps, no cap). Cells: mean ± std device seconds to the target accuracy over seeds,
and energy; then ours/fastest and state-of-practice/ours.

How it is made: bench/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from bench_common import ints, read_json, workload_of
from paper_cells import floor_groups, print_summary, print_table, summarise, table
from paper_setup import BOARDS, Task, fresh_head, text_data, vision_data
from vector_floor import shared_vector_floor

from fl_server.relation import ProxyRuns, ranking, seeds_until_stable
from fl_server.relation import run_to_target as proxy_run
from powerctl.cli.util import OneLineParser
from powerctl.devices import open_device
from powerctl.devices.boards import board_model
from powerctl.devices.torchdev import TORCH_SPEC_HELP, torch_device_arg
from powerctl.errors import PowerctlError
from powerctl.records.relation import VECTORS, RelationVector
from powerfed.training.crossing import evaluations_before
from powerfed.training.data import train_test_split
from powerfed.training.finetune import fine_tune
from powerfed.training.finetune_records import FineTuneCallbacks, FineTuneConfig
from powerfed.training.lr import scaled_lr
from powerfed.training.models import build_model, get_model_spec

PAPER = (
    "paper (real boards): ours equals the fastest in most cells, worst 1.083x (TX2 NX, ResNet18, CINIC, "
    "low cap); state-of-practice/ours 1.0-2.33x"
)


# --- training: each (b, seed) once -------------------------------------------------------------------------


def pretrain(task: Task, host: Any) -> dict[str, torch.Tensor]:
    ds = task.data["pretrain"]
    train, test = train_test_split(ds, seed=0)
    model = build_model(task.model, ds.num_classes, seed=0).to(host.torch_device())
    lr = task.pretrain_lr or task.lr_max * 2
    config = FineTuneConfig(
        batch_size=64, lr=lr, target_accuracy=None, max_samples=task.pretrain_samples, eval_every_samples=None
    )
    r = fine_tune(model, train, test, config, device=host, callbacks=FineTuneCallbacks(progress=False))
    print(
        f"  pre-trained {task.model} on {ds.name} ({host.torch_device()}, lr {lr:g}): {r.samples} samples, "
        f"test accuracy {r.final_accuracy:.3f}"
    )
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def run_to_target(
    task: Task,
    weights: dict[str, torch.Tensor],
    ds: Any,
    target: float | None,
    b: int,
    seed: int,
    host: Any,
) -> dict[str, Any]:
    """One run to `target` (None: the calibration budget) by `fl_server.relation.run_to_target`, `ds` split
    by `seed`; samples to target is the interpolated crossing, the steps charged that crossing's."""
    train, test = train_test_split(ds, seed=seed)
    config = FineTuneConfig(
        batch_size=b,
        lr=scaled_lr(task.lr_max, b, task.b_max),
        target_accuracy=target,
        # a run to the target gets twice the calibration budget, so that no run is censored
        max_samples=task.calibration_samples * (1 if target is None else 2),
        eval_every_samples=task.eval_every,
        eval_max_samples=task.eval_max_samples,
        seed=seed,
    )
    runs = ProxyRuns(
        spec=get_model_spec(task.model),
        num_classes=ds.num_classes,
        state=weights,
        train=train,
        test=test,
        workload=task.data["charged_workload"],
    )
    r, crossing, every = proxy_run(runs, config, host=host)
    samples = float(r.samples) if crossing is None else crossing
    return {"b": b, "seed": seed, "steps": samples / b, "samples": samples, "reached": r.reached,
            "samples_at_evaluation": r.samples, "eval_every": every,
            "eval_samples": min(len(test), task.eval_max_samples),
            "evaluations": evaluations_before(r.curve, target) if target is not None else None,
            "accuracy": r.final_accuracy, "wall_s": r.wall_s,
            "curve": [(p.samples, p.accuracy) for p in r.curve]}  # fmt: skip


class TargetInNoise(PowerctlError):
    """A calibrated target the evaluation cannot tell from the starting accuracy: tables on it rank noise."""


NOISE_Z = 2.0
"""Standard errors a plateau must clear: about 95 % of evaluations of an unchanged model fall within."""


def evaluation_noise(start: float, plateau: float, n: int, plateau_evaluations: Sequence[float]) -> float:
    """What the plateau's gain over the start must exceed: `NOISE_Z` standard errors of the difference of
    two accuracies on `n` evaluated samples (binomial), the plateau's the larger of the binomial one and
    the spread of its own evaluations (training noise)."""

    def binomial(p: float) -> float:
        return math.sqrt(max(p * (1 - p), 0.0) / max(n, 1))

    spread = statistics.stdev(plateau_evaluations) if len(plateau_evaluations) > 1 else 0.0
    return NOISE_Z * math.hypot(binomial(start), max(binomial(plateau), spread))


def calibrate_target(
    task: Task, weights: dict[str, torch.Tensor], ds: Any, host: Any
) -> tuple[float, float, float]:
    """A target every batch size reaches on the rising part of its curve (where the crossing is steep):
    `target_fraction` of the way from the start to the plateau (the median accuracy over the second half)
    of one run at the largest batch size, seed 0. A plateau within the evaluation's noise of the start is
    refused in one line (`TargetInNoise`)."""
    run = run_to_target(task, weights, ds, None, task.b_max, 0, host)
    half = [acc for samples, acc in run["curve"] if samples >= task.calibration_samples / 2]
    plateau = statistics.median(half)
    start = run["curve"][0][1]
    noise = evaluation_noise(start, plateau, run["eval_samples"], half)
    if plateau - start <= noise:
        raise TargetInNoise(
            f"{task.name} {task.model} on {ds.name}: the calibration plateau {plateau:.3f} is "
            f"{plateau - start:+.3f} from the start {start:.3f}, within the evaluation's noise {noise:.3f} "
            f"({NOISE_Z:g} standard errors on {run['eval_samples']} evaluated samples and the plateau's "
            f"spread): a target there ranks noise; pre-train the model better or longer, raise "
            f"--{task.name}-calibration-samples, or give --{task.name}-targets"
        )
    return round(start + task.target_fraction * (plateau - start), 3), plateau, start


# --- main --------------------------------------------------------------------------------------------------


def _floats(text: str) -> list[float]:
    values = [float(v) for v in text.split(",")]
    if len(values) != 3 or not all(0.0 < v <= 1.0 for v in values):
        raise argparse.ArgumentTypeError("give three accuracies in (0, 1]: proxy, target 1, target 2")
    return values


def make_tasks(args: argparse.Namespace) -> list[Task]:
    both: dict[str, Any] = dict(seeds=list(range(args.seeds)), proxy_seeds=list(range(args.proxy_seeds)),
                proxy_max_seeds=args.proxy_max_seeds, eval_every=args.eval_every, eval_max_samples=500,
                target_fraction=args.target_fraction)  # fmt: skip
    tasks = []
    if args.task in ("vision", "both"):
        # the paper's two vision models; MobileNetV2 does not fit b=128 on either board (its rows stop at 64)
        small = [b for b in args.batch_sizes if b <= 64]
        for trained, bs in (("resnet18", args.batch_sizes), ("mobilenetv2", small)):
            if trained in args.vision_models:
                tasks.append(Task(
                    "vision", trained if args.full else f"{trained}-small", trained, lr_max=5e-4,
                    pretrain_samples=args.vision_pretrain_samples, batch_sizes=bs,
                    calibration_samples=args.vision_calibration_samples, fixed_targets=args.vision_targets,
                    **both,
                ))  # fmt: skip
    if args.task in ("text", "both"):
        # the full char GPT: nanoGPT's rate for a character model of this size, 1e-3, and half to fine-tune
        tasks.append(Task(
            "text", "chartransformer" if args.full else "chartransformer-small", "chartransformer",
            lr_max=5e-4 if args.full else 3e-3, pretrain_lr=1e-3 if args.full else None,
            pretrain_samples=args.text_pretrain_samples, batch_sizes=args.batch_sizes,
            calibration_samples=args.text_calibration_samples, fixed_targets=args.text_targets, **both,
        ))  # fmt: skip
    return tasks


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(prog="paper_tables", description=__doc__.splitlines()[0])
    p.add_argument("--task", choices=["vision", "text", "both"], default="both")
    p.add_argument(
        "--seeds", type=int, default=10,
        help="truth seeds per (b, target), both tasks (the paper: 5 images, 3 text; more: tighter intervals)",
    )  # fmt: skip
    p.add_argument("--proxy-seeds", type=int, default=3, help="proxy runs per batch size (mean)")
    p.add_argument(
        "--proxy-max-seeds", type=int, default=0,
        help="add proxy seeds until the batch sizes' ranking is stable, up to this many (relation-max-seeds)",
    )  # fmt: skip
    p.add_argument("--batch-sizes", type=ints, default=[4, 8, 16, 32, 64, 128])
    p.add_argument(
        "--vision-calibration-samples", type=int, default=3000,
        help="budget of the run that sets each vision target; a run to the target gets twice this",
    )  # fmt: skip
    p.add_argument("--text-calibration-samples", type=int, default=12_000, help="the same, text")
    p.add_argument("--vision-targets", type=_floats, help="proxy,target1,target2 instead of calibrating")
    p.add_argument("--text-targets", type=_floats, help="proxy,target1,target2 instead of calibrating")
    p.add_argument(
        "--eval-every", type=int, default=256,
        help="evaluate at most every this many samples (runs that cross sooner are evaluated more often)",
    )  # fmt: skip
    p.add_argument(
        "--target-fraction", type=float, default=0.8,
        help="the calibrated target's place between the starting accuracy (0) and the plateau (1)",
    )  # fmt: skip
    p.add_argument("--vision-pretrain-samples", type=int, default=32_000)
    p.add_argument(
        "--vision-models", type=lambda s: s.split(","), default=["resnet18", "mobilenetv2"],
        help="which of the paper's vision models (comma-separated; two processes can share the work)",
    )  # fmt: skip
    p.add_argument(
        "--text-pretrain-samples", type=int, default=None,
        help="default 80000; with --full 300000 (the full model at its lower rate needs more steps)",
    )  # fmt: skip
    p.add_argument(
        "--quick", action="store_true",
        help="2 seeds, 2 proxy seeds, batch sizes 16..128, less vision data (a smoke run, ~15 min)",
    )  # fmt: skip
    p.add_argument("--full", action="store_true", help="train the full models (GPU machine: --device cuda)")
    p.add_argument(
        "--device", type=torch_device_arg, default="auto", help=f"where the models train: {TORCH_SPEC_HELP}"
    )
    p.add_argument(
        "--retable", type=Path, nargs="+", metavar="RESULTS",
        help="no training: the tables again from results.json files' recorded runs (a recalibrated board; "
        "several files, e.g. one per model, give one summary)",
    )  # fmt: skip
    p.add_argument("--out", type=Path, default=Path("runs/paper_tables"))
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: steady on a shared machine)")
    args = p.parse_args(argv)
    if unknown := set(args.vision_models) - {"resnet18", "mobilenetv2"}:
        p.error(f"--vision-models: unknown {', '.join(sorted(unknown))}; give resnet18 and/or mobilenetv2")
    if args.seeds < 1 or args.proxy_seeds < 1:
        p.error("--seeds and --proxy-seeds: give at least 1")
    if args.text_pretrain_samples is None:
        args.text_pretrain_samples = 300_000 if args.full else 80_000
    if args.quick:
        args.seeds, args.proxy_seeds, args.batch_sizes = 2, 2, [16, 32, 64, 128]
        args.vision_pretrain_samples, args.vision_calibration_samples = 16_000, 2000
    return args


def prepare_data(task: Task, quick: bool) -> None:
    if task.name == "vision":
        task.data.update(vision_data(20_000, 3000 if quick else 6000, 3000 if quick else 6000))
    else:
        task.data.update(text_data(8000 if quick else 16_000, full=task.model == "chartransformer"))
    task.data["charged_workload"] = workload_of(task.charged)


def set_targets(task: Task, weights: dict[str, torch.Tensor], host: Any) -> None:
    sets = {"proxy": task.data["proxy"], **task.data["targets"]}
    for i, (name, ds) in enumerate(sets.items()):
        if task.fixed_targets:
            task.targets[name] = task.fixed_targets[i]
            print(f"  target for {name} ({ds.name}): {task.targets[name]:.3f} (given)")
            continue
        task.targets[name], plateau, start = calibrate_target(task, weights, ds, host)
        print(
            f"  target for {name} ({ds.name}): {task.targets[name]:.3f} = start {start:.3f} + "
            f"{task.target_fraction} x (plateau {plateau:.3f} - start) "
            f"(b={task.b_max}, plateau: median of the second half of {task.calibration_samples} samples)"
        )


def _samples_line(task: Task, runs: dict[tuple[int, int], dict[str, Any]], seeds: list[int]) -> str:
    def mark(b: int) -> str:
        return "" if all(runs[(b, s)]["reached"] for s in seeds) else "*"

    return ", ".join(
        f"b={b}: {statistics.fmean(runs[(b, s)]['samples'] for s in seeds):.0f}{mark(b)}"
        f" (evals ≥ {min(runs[(b, s)]['evaluations'] or 0 for s in seeds)})"
        for b in task.batch_sizes
    )


def raw_and_fitted(
    charged: str, target: float, per_seed: dict[int, Sequence[float]], **extra: Any
) -> dict[str, RelationVector]:
    """The proxy's two relation vectors from its seeds: "raw" (the means) and "fitted" (batch efficiency)."""
    return {
        v: RelationVector.from_seeds(charged, "proxy", target, per_seed, vector=v, **extra) for v in VECTORS
    }


def proxy_relation(task: Task, weights: dict[str, torch.Tensor], host: Any) -> dict[str, RelationVector]:
    """The proxy's relation vectors (`raw_and_fitted`) from its seeds, run until the ranking is stable."""
    target = task.targets["proxy"]

    def run_seeds(seeds: Sequence[int]) -> list[dict[str, Any]]:
        return [
            {**run_to_target(task, weights, task.data["proxy"], target, b, s, host), "batch_size": b}
            for s in seeds
            for b in task.batch_sizes
        ]

    # the ServerApp's stopping rule (relation-max-seeds); without a budget, the proxy seeds alone
    found, task.proxy_seeds, stable = seeds_until_stable(
        task.batch_sizes, task.proxy_seeds, task.proxy_max_seeds, run_seeds
    )
    runs = {(r["b"], r["seed"]): r for r in found}
    if task.proxy_max_seeds:
        verdict = "stable" if stable else "not stable"
        print(f"  proxy seeds needed: {len(task.proxy_seeds)} of at most {task.proxy_max_seeds} "
              f"(ranking {verdict}: {ranking(task.batch_sizes, found)})")  # fmt: skip
    print(f"  proxy samples to target (mean of {len(task.proxy_seeds)} seeds): "
          + _samples_line(task, runs, task.proxy_seeds))  # fmt: skip
    censored = [b for b in task.batch_sizes if not all(runs[(b, s)]["reached"] for s in task.proxy_seeds)]
    if censored:
        print(
            f"  WARNING: proxy runs at b={censored} hit the budget before the target: the relation vector "
            f"is censored there (too small), which biases ours towards those batch sizes; raise "
            f"--{task.name}-calibration-samples or lower the targets"
        )
    per_seed: dict[int, Sequence[float]] = {
        b: [runs[(b, s)]["samples"] for s in task.proxy_seeds] for b in task.batch_sizes
    }
    seeds = task.proxy_seeds
    relations = raw_and_fitted(
        task.charged, target, per_seed, seeds=seeds, seeds_needed=len(seeds), ranking_stable=stable
    )
    fit = relations["raw"].extra["batch_efficiency"]
    for v, rel in relations.items():
        print(f"  relation vector ({v}): " + ", ".join(
            f"{b}: {r:.3f}" for b, r in zip(rel.batch_sizes, rel.relation, strict=True)))  # fmt: skip
    b_crit = "inf" if fit["b_crit"] is None else f"{fit['b_crit']:.0f}"
    print(f"  batch-efficiency fit: b_crit {b_crit}, chi2 {fit['chi2']:.1f} on {fit['dof']} dof "
          f"({'explains' if fit['explains'] else 'does not explain'} the seeds' means)")  # fmt: skip
    return relations


def pretrained(task: Task, host: Any, out: Path) -> dict[str, torch.Tensor]:
    """Pre-trained weights, kept in OUT so that a second run of the same settings skips pre-training
    (same seed, same data: the same weights); vision's then get a fresh head (`fresh_head`)."""
    data = task.data["pretrain"].name.replace(":", "-").replace("/", "-")
    rate = f"-lr{task.pretrain_lr:g}" if task.pretrain_lr is not None else ""  # the small regime's names stay
    path = out / f"pretrained-{task.model}-{data}-{task.pretrain_samples}{rate}.pt"
    if path.is_file():
        print(f"  pre-trained {task.model}: {path} (kept from an earlier run)")
        weights = torch.load(path, map_location="cpu")
    else:
        weights = pretrain(task, host)
        out.mkdir(parents=True, exist_ok=True)
        torch.save(weights, path)
    if task.name == "vision":
        weights = fresh_head(task.model, weights, task.data["proxy"].num_classes)
        print(f"  fine-tuning starts from it with a fresh {task.data['proxy'].num_classes}-way head")
    return weights


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return retable(args.retable, args.out) if args.retable else tables(args)
    except PowerctlError as exc:  # a target inside the noise, an unreadable file: one line, nothing written
        print(f"paper_tables: error: {exc}", file=sys.stderr)
        return 2


def tables(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    host = open_device(args.device)
    print(__doc__.split("\n\n")[1])
    print(f"\nbatch sizes {args.batch_sizes}, proxy seeds {args.proxy_seeds}, torch threads {args.threads}, "
          f"device {host.torch_device()}")  # fmt: skip
    results: dict[str, Any] = {}
    for task in make_tasks(args):
        t0 = time.perf_counter()
        prepare_data(task, args.quick)
        print(f"\n== {task.name}: {task.model} (charged as {task.charged}), batch sizes {task.batch_sizes}, "
              f"seeds {task.seeds}")  # fmt: skip
        weights = pretrained(task, host, args.out)
        set_targets(task, weights, host)
        relations = proxy_relation(task, weights, host)
        runs: dict[str, dict[tuple[int, int], dict[str, Any]]] = {}
        for name, ds in task.data["targets"].items():
            runs[name] = {(b, s): run_to_target(task, weights, ds, task.targets[name], b, s, host)
                          for b in task.batch_sizes for s in task.seeds}  # fmt: skip
            print(
                f"  {name}: samples to target (mean over seeds) "
                + _samples_line(task, runs[name], task.seeds)
            )
        print(f"  (training: {time.perf_counter() - t0:.0f} s wall; * = some run hit the budget; "
              "evals = the fewest evaluations any seed took to cross)")  # fmt: skip
        tabulate(task, relations, runs, results)
    return finish(results, args.out, started)


def tabulate(
    task: Task, relations: dict[str, RelationVector], runs: dict[str, dict[tuple[int, int], dict[str, Any]]],
    results: dict[str, Any],
) -> None:  # fmt: skip
    """Charge the runs on every board, print the tables, and keep everything a retable needs."""
    for board_name in BOARDS:
        board = board_model(board_name)
        tab = table(task, board, relations, runs, task.seeds)
        print_table(task, board, tab)
        results[f"{task.key}|{board_name}"] = tab
    floor = shared_vector_floor(floor_groups(results, task.key))
    print(
        f"\n{task.key}: the best any one relation vector can do on these runs: worst {floor.worst:.3f}x "
        f"({floor.cell}), picking " + ", ".join(f"b={b} on {g}" for g, b in floor.picks.items())
    )
    results[f"{task.key}|vector-floor"] = dataclasses.asdict(floor)
    results[f"{task.key}|targets"] = task.targets
    results[f"{task.key}|relation"] = relations["raw"].to_dict()
    results[f"{task.key}|runs"] = {
        n: [{k: v for k, v in r.items() if k != "curve"} for r in rs.values()] for n, rs in runs.items()
    }


def retable(paths: list[Path], out: Path) -> int:
    """The tables again from results.json files' recorded runs and proxy relations, without training (the
    sample counts do not depend on the board)."""
    started = time.perf_counter()
    results: dict[str, Any] = {}
    for path in paths:
        old = read_json(path, "give a results.json this bench wrote")
        for key in [k for k in old if k.endswith("|relation")]:
            name, charged, _ = key.split("|")
            raw = RelationVector.from_dict(old[key], f"{path}: {key}")
            recorded = old[f"{name}|{charged}|runs"]
            seeds = sorted({r["seed"] for rs in recorded.values() for r in rs})
            task = Task(name, "(recorded runs)", charged, 0.0, 0, list(raw.batch_sizes), seeds, [], 0, 0, 0)
            task.targets = old[f"{name}|{charged}|targets"]
            task.data["charged_workload"] = workload_of(charged)
            per_seed: dict[int, Sequence[float]] = dict(
                zip(raw.batch_sizes, raw.per_seed_samples() or [], strict=True)
            )
            relations = raw_and_fitted(charged, raw.target_accuracy, per_seed)
            runs = {n: {(r["b"], r["seed"]): r for r in rs} for n, rs in recorded.items()}
            print(f"\n== {name}: {charged}, recorded runs from {path}")
            tabulate(task, relations, runs, results)
    return finish(results, out, started)


def finish(results: dict[str, Any], out: Path, started: float) -> int:
    summary = summarise(results)
    print_summary(summary)
    results["summary"] = summary
    print(f"\n{PAPER}")
    print(f"wall {time.perf_counter() - started:.0f} s")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
