"""Does a relation vector estimated on proxy text predict the batch-size ranking on other text?

The server side's acceptance experiment on real data (../shared/data), by the project's own code
(fl_server.pretrain, fl_server.relation): pre-train a small character transformer on WikiText-2 (valid +
test joined), estimate the relation vector on tiny Shakespeare (the proxy) and on a Jane Austen novel (the
target) from those weights, and print both vectors, whether the proxy's best batch size is the target's,
and the Spearman rank correlation of the sample counts. Results go to OUT/results.json; the estimates are
cached in OUT/cache, so a rerun with the same settings only prints.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from bench_common import ROOT, ints
from scipy.stats import spearmanr

from fl_server.pretrain import PretrainSettings, pretrain
from fl_server.relation import RelationCompute, RelationSettings, estimate_relation
from powerctl.cli.util import OneLineParser, key_value
from powerctl.devices.torchdev import TORCH_SPEC_HELP, torch_device_arg
from powerctl.errors import PowerctlError
from powerctl.files.jsonfile import write_json
from powerctl.records.relation import RelationVector
from powerfed.training.lr import LR_RULES

DATA = ROOT.parent / "shared" / "data"


def best_batch_sizes(rel: RelationVector) -> list[int]:
    """Batch sizes with the fewest samples to the target (several on a tie)."""
    least = min(rel.samples_to_target)
    return [b for b, s in zip(rel.batch_sizes, rel.samples_to_target, strict=True) if s == least]


def pretrained_weights(args: argparse.Namespace, timings: dict[str, float]) -> tuple[Path, dict[str, Any]]:
    """Step 1: pre-train on WikiText-2 (the two files joined: text:PATH takes one file), or --weights."""
    if args.weights is not None:
        return args.weights, {"weights": str(args.weights)}
    out: Path = args.out
    wiki = out / "wikitext-2.valid+test.txt"
    wiki.write_bytes(
        b"".join((args.data / "wikitext-2" / f"wiki.{s}.tokens").read_bytes() for s in ("valid", "test"))
    )
    t0 = time.perf_counter()
    settings = PretrainSettings(samples=args.pretrain_samples, batch_size=args.pretrain_batch_size,
                                lr=args.pretrain_lr, overrides=dict(args.overrides))  # fmt: skip
    weights = out / "pretrained.safetensors"
    made = pretrain(args.model, f"text:{wiki}", out=weights, settings=settings, device=args.device,
                    progress=not args.no_progress)  # fmt: skip
    timings["pretrain_s"] = time.perf_counter() - t0
    return weights, made.data


def relation_vectors(
    args: argparse.Namespace, weights: Path, timings: dict[str, float]
) -> tuple[RelationVector, RelationVector]:
    """Step 2: the relation vector on the proxy text and on the target text, by the product's estimator."""
    settings = RelationSettings(
        seeds=ints(args.seeds),
        lr_max=args.lr_max,
        lr_rule=args.lr_rule,
        max_samples=args.max_samples,
        eval_every_samples=args.eval_every,
        eval_max_samples=args.eval_max_samples,
        data_seed=0,  # the proxy split of the runs its results page quotes
    )
    how = RelationCompute(
        cache_dir=args.out / "cache",
        use_cache=not args.no_cache,
        parallel=not args.serial,
        device=args.device,
        progress=not args.no_progress,
    )
    vectors: dict[str, RelationVector] = {}
    for role, path, target in (
        ("proxy", args.proxy, args.target),
        ("target", args.target_data, args.target_on_target),
    ):
        t0 = time.perf_counter()
        try:
            vectors[role] = estimate_relation(
                args.model,
                weights,
                f"text:{args.data / path}",
                target_accuracy=target,
                batch_sizes=ints(args.batch_sizes),
                settings=settings,
                how=how,
            )
        except PowerctlError as exc:  # RelationError, or an ArgumentError line (a repeated batch size)
            raise SystemExit(f"relation_vs_target: {role} ({path}): {exc}") from None
        timings[f"{role}_s"] = time.perf_counter() - t0
        vectors[role].save(args.out / f"relation_{role}.json")
    return vectors["proxy"], vectors["target"]


def print_comparison(
    args: argparse.Namespace, report: dict[str, Any], proxy: RelationVector, target: RelationVector
) -> None:
    """The table: per batch size, samples to target (± sd over seeds) and r_b on both texts."""
    overrides = dict(args.overrides)
    model_text = f"{args.model} {overrides}" if overrides else args.model
    if args.weights is None:
        print(
            f"model {model_text}; pre-trained on WikiText-2 valid+test: {report['samples']} samples, "
            f"test accuracy {report.get('final_test_accuracy'):.4f}"
        )
    else:
        print(f"model {model_text}; weights {args.weights}")
    print(f"proxy  {args.proxy}: target accuracy {proxy.target_accuracy}")
    print(f"target {args.target_data}: target accuracy {target.target_accuracy}")
    print(
        f"lr_max {args.lr_max} ({args.lr_rule} rule), seeds {ints(args.seeds)}, "
        f"eval every ≤ {args.eval_every} "
        f"samples on {args.eval_max_samples} test windows, budget {args.max_samples} samples"
    )
    print(
        f"{'batch':>5} {'lr':>9} | {'proxy samples ± sd':>19} {'r_b':>6} | "
        f"{'target samples ± sd':>20} {'r_b':>6}"
    )
    p_sd, t_sd = proxy.extra["samples_sd"], target.extra["samples_sd"]
    for i, b in enumerate(proxy.batch_sizes):
        lr = proxy.extra["lr"][i]
        p_s, p_r = proxy.samples_to_target[i], proxy.relation[i]
        t_s, t_r = target.samples_to_target[i], target.relation[i]
        print(
            f"{b:>5} {lr:>9.2e} | {p_s:>11.0f} ± {p_sd[i]:>5.0f} {p_r:>6.3f} | "
            f"{t_s:>12.0f} ± {t_sd[i]:>5.0f} {t_r:>6.3f}"
        )


def main() -> None:
    ap = OneLineParser(
        prog="relation_vs_target", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # fmt: off
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "relation_vs_target")
    ap.add_argument("--data", type=Path, default=DATA, help="the shared data folder (default ../shared/data)")
    ap.add_argument("--model", default="chartransformer-small")
    ap.add_argument("--set", dest="overrides", action="append", type=key_value, default=[],
                    metavar="KEY=VALUE", help="model option, e.g. --set n_embd=96")
    ap.add_argument("--pretrain-samples", type=int, default=60_000)
    ap.add_argument("--pretrain-batch-size", type=int, default=32)
    ap.add_argument("--pretrain-lr", type=float, default=2e-3)
    ap.add_argument("--weights", type=Path, help="use these pre-trained weights instead of step 1")
    ap.add_argument("--proxy", default="tinyshakespeare/input.txt", help="proxy text, relative to --data")
    ap.add_argument("--target-data", default="gutenberg_austen/austen-emma.txt", help="relative to --data")
    ap.add_argument("--target", type=float, default=0.42, help="target accuracy on the proxy (default 0.42)")
    ap.add_argument("--target-on-target", type=float, default=0.49,
                    help="target accuracy on the target text (default 0.49: Austen is easier to predict)")
    ap.add_argument("--batch-sizes", default="4,8,16,32,64")
    ap.add_argument("--seeds", default="0,1,2,3,4", help="mean over these (default 0,1,2,3,4)")
    ap.add_argument("--lr-max", type=float, default=2e-3, help="learning rate of the largest batch size")
    ap.add_argument("--lr-rule", choices=LR_RULES, default="sqrt", help="learning-rate scaling across b")
    ap.add_argument("--max-samples", type=int, default=20_000)
    ap.add_argument("--eval-every", type=int, default=128, help="resolution of samples-to-target")
    ap.add_argument("--eval-max-samples", type=int, default=256)
    ap.add_argument("--serial", action="store_true", help="no Ray: run the batch sizes one after another")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for pre-training (default 1: fastest on a small shared machine)")
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--device", type=torch_device_arg, default="auto",
                    help=f"where the models train: {TORCH_SPEC_HELP}")
    ap.add_argument("--no-progress", action="store_true")
    # fmt: on
    args = ap.parse_args()
    started = time.perf_counter()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    weights, report = pretrained_weights(args, timings)
    proxy, target = relation_vectors(args, weights, timings)

    rho = float(spearmanr(proxy.samples_to_target, target.samples_to_target).statistic)  # nan if constant
    proxy_best, target_best = best_batch_sizes(proxy), best_batch_sizes(target)
    match = bool(set(proxy_best) & set(target_best))
    timings["total_s"] = time.perf_counter() - started

    print_comparison(args, report, proxy, target)
    print(
        f"best batch size (fewest samples): proxy {proxy_best}, target {target_best} -> "
        f"{'MATCH' if match else 'NO MATCH'}"
    )
    print(f"Spearman rank correlation (samples to target, proxy vs target): {rho:.3f}")
    print("wall time: " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))

    write_json(
        out / "results.json",
        {
            "schema": "bench.relation_vs_target/1",
            "model": args.model,
            "overrides": dict(args.overrides),
            "pretrain": {k: v for k, v in report.items() if k != "curve"},
            "proxy": proxy.to_dict(),
            "target": target.to_dict(),
            "proxy_best_batch_sizes": proxy_best,
            "target_best_batch_sizes": target_best,
            "best_match": match,
            "spearman": rho if rho == rho else None,
            "timings_s": timings,
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        },
    )
    print(f"wrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
