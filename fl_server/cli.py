"""`fl-server`: the server's offline jobs — pre-train starting weights (safetensors + a JSON report),
estimate relation vectors (`powerctl.relation/2`). User errors are one line and exit status 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from powerctl.cli.util import (
    OneLineParser,
    accuracy,
    add_command,
    bounded_float,
    bounded_int,
    key_value,
    one_line_errors,
    positive_int,
    run_command,
    say,
)
from powerctl.devices.torchdev import resolve_torch_device
from powerctl.files.mapping import MAX_BATCH_SIZE
from powerctl.files.outputs import check_output_dir, check_output_file, output_path
from powerctl.records.relation import VECTORS
from powerfed.training.data import SPECS
from powerfed.training.errors import ModelError
from powerfed.training.finetune_records import DEFAULT_EVAL_MAX_SAMPLES
from powerfed.training.lr import LR_RULES
from powerfed.training.models import MAX_SEQ_LEN, get_model_spec, model_names, option_ranges
from strategies.settings import SETTINGS, key_of
from strategies.settings_derived import flag

PROG = "fl-server"
RAW = argparse.RawDescriptionHelpFormatter  # a command's description and example as written
SEQ_LEN = bounded_int(1, MAX_SEQ_LEN)
EPOCHS = bounded_float(0.0, 1000.0)
THREADS = bounded_int(1, 1024)
DATA_HELP = "dataset spec, one of: " + ", ".join(SPECS) + " (docs/reference/node-config.md)"
RUN_FLAGS: dict[str, tuple[str, str, str | None]] = {
    "--batch-sizes": ("batch_sizes", "batch_sizes", "B,B,..."),
    "--seeds": ("seeds", "relation_seeds", "S,S,..."),
    "--max-seeds": ("max_seeds", "relation_max_seeds", "N"),
    "--lr-rule": ("lr_rule", "lr_rule", "{" + ",".join(LR_RULES) + "}"),
    "--vector": ("vector", "relation_values", "{" + ",".join(VECTORS) + "}"),
    "--lr-max": ("lr_max", "lr_max", None),
    "--max-samples": ("max_samples", "relation_max_samples", None),
    "--eval-every": ("eval_every_samples", "eval_every_samples", "N"),
    "--eval-max-samples": ("eval_max_samples", "eval_max_samples", "N"),
    "--data-seed": ("data_seed", "proxy_seed", None),
}
"""`fl-server relation`'s flags that are run settings: flag → (its `RelationSettings` field or the
call's argument, the run setting it takes its default, check and help from, metavar)."""

PRETRAIN_EPILOG = """\
example (a small character transformer on WikiText-2; a few minutes on 2 CPU cores):
  fl-server pretrain --model chartransformer-small \\
      --data text:../shared/data/wikitext-2/wiki.valid.tokens \\
      --samples 60000 --batch-size 32 --lr 0.002 --threads 1 --out wikitext.safetensors

writes wikitext.safetensors (safetensors; the file alone rebuilds the model) and
wikitext.report.json (final test accuracy, samples, seconds, learning curve). The folder of --out must exist.
"""

RELATION_EPILOG = """\
example (relation vector on tiny Shakespeare from the weights above; about two minutes):
  fl-server relation --model chartransformer-small --weights wikitext.safetensors \\
      --proxy text:../shared/data/tinyshakespeare/input.txt --target 0.42 \\
      --batch-sizes 4,8,16,32,64 --lr-max 0.002 --seeds 0,1,2 \\
      --eval-every 256 --eval-max-samples 256 --parallel --out relation.json

Every batch size and seed trains from the same weights until the target accuracy on the proxy's test
split; relation = mean samples to target / the largest batch size's (docs/design/method.md). A batch
size that does not reach the target within --max-samples is an error (lower --target or raise
--max-samples); so is a target the starting weights already meet. Results are cached (--cache-dir):
the same inputs again return at once.
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        required=True,
        choices=model_names(),
        metavar="NAME",
        help=f"model name: {', '.join(model_names())}",
    )
    SEQ_LEN.add(p, "--seq-len", "text only: characters per sample (default: the model's context, 64)")
    positive_int.add(p, "--limit", "use at most this many samples of the dataset (default: all)")
    THREADS.add(
        p, "--threads", "torch CPU threads (default: torch's choice; 1 is often fastest on a busy machine)"
    )
    where = "where to train: auto (a GPU where torch sees one), cpu, cuda, cuda:INDEX"
    p.add_argument("--device", metavar="DEVICE", **flag("server_device", where))
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")


def _add_pretrain(sub: Any) -> None:
    pre = add_command(sub, "pretrain", _pretrain, epilog=PRETRAIN_EPILOG, formatter_class=RAW)
    _common(pre)
    pre.add_argument("--data", required=True, metavar="SPEC", help=DATA_HELP)
    pre.add_argument(
        "--out",
        required=True,
        type=output_path,
        metavar="PATH",
        help="weights file to write (e.g. weights.safetensors); the report goes to PATH's "
        "stem + .report.json",
    )
    budget = pre.add_mutually_exclusive_group()
    positive_int.add(budget, "--samples", "training samples to process")
    EPOCHS.add(budget, "--epochs", "passes over the train split, at least one batch (default: 1)")
    bounded_int(1, MAX_BATCH_SIZE).add(pre, "--batch-size", "default: %(default)s", default=64)
    lr = bounded_float(0.0, 10.0)  # above 10 diverges with Adam and with SGD alike
    lr.add(pre, "--lr", "learning rate, Adam (images) / AdamW (text) (default: %(default)s)", default=1e-3)
    fixed = "evaluate on at most this many test samples, a fixed subset (default: %(default)s)"
    positive_int.add(pre, "--eval-max-samples", fixed, default=DEFAULT_EVAL_MAX_SAMPLES)
    pre.add_argument("--seed", **flag("pretrain_seed", "initialisation, split and order seed"))
    pre.add_argument(
        "--set",
        dest="overrides",
        action="append",
        type=key_value,
        default=[],
        metavar="KEY=VALUE",
        help="model size option, repeatable, e.g. --set n_embd=128 --set n_layer=4 "
        f"(chartransformer), --set width=32 (resnet18, cnn-tiny); ranges: {option_ranges()}",
    )


def _add_relation(sub: Any) -> None:
    rel = add_command(sub, "relation", _relation, epilog=RELATION_EPILOG, formatter_class=RAW)
    _common(rel)
    rel.add_argument(
        "--weights",
        type=Path,
        metavar="PATH",
        help="starting weights from 'fl-server pretrain' (default: a fresh seeded init)",
    )
    rel.add_argument("--proxy", required=True, metavar="SPEC", help=f"proxy {DATA_HELP}")
    rel.add_argument(
        "--target",
        required=True,
        type=accuracy,
        metavar="ACC",
        help="target test accuracy on the proxy, in (0, 1], e.g. 0.45",
    )
    rel.add_argument("--out", required=True, type=output_path, metavar="PATH", help="relation JSON to write")
    # the flags that are run settings take the run's default and check (strategies.settings): with
    # none given, this writes the vector the ServerApp estimates on the same proxy and target
    for name, (dest, setting, metavar) in RUN_FLAGS.items():
        help = SETTINGS[key_of(setting)].help.rstrip(".")
        rel.add_argument(name, dest=dest, metavar=metavar, **flag(setting, help))  # None: argparse's
    rel.add_argument(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="cache folder (default: $POWERFED_CACHE/relation or $XDG_CACHE_HOME/powerfed/relation)",
    )
    rel.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    rel.add_argument("--parallel", action="store_true", help="run batch sizes as parallel Ray tasks")
    THREADS.add(rel, "--cpus", "CPUs for --parallel (default: one per run, at most the machine's)")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Server-side jobs of power-aware federated fine-tuning: pre-train the starting "
        "weights on a public dataset, and estimate the relation vector (samples to a target accuracy "
        "per batch size) on a proxy dataset. Run 'fl-server COMMAND --help' for each.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_pretrain(sub)
    _add_relation(sub)
    return parser


def _pretrain(args: argparse.Namespace) -> int:
    """train a model on a public dataset; write weights + report

    Train MODEL from a seeded initialisation on a dataset (split into train/test,
    80/20 for images, 90/10 for text) for a sample or epoch budget; save the weights (safetensors)
    and a JSON report with the final test accuracy. The weights are the starting point of
    'fl-server relation' and of the devices' fine-tuning.
    """
    _prepare(args)
    from fl_server.pretrain import PretrainSettings, pretrain, report_path_for

    check_output_file(args.out, beside=[report_path_for(args.out)])
    given = {f.name: getattr(args, f.name) for f in fields(PretrainSettings)}  # flags named as its fields
    settings = PretrainSettings(**{**given, "overrides": dict(args.overrides)})
    report = pretrain(
        args.model,
        args.data,
        out=args.out,
        settings=settings,
        device=args.device,
        progress=not args.no_progress,
    )
    d = report.data
    say(
        f"pre-trained {d['model']} on {d['dataset']}: {d['samples']} samples ({d['epochs']:.2f} epochs), "
        f"test accuracy {d['final_test_accuracy']:.4f}, {d['wall_s']:.1f} s"
    )
    say(f"wrote {report.weights_path} and {report.report_path}")
    return 0


def _relation(args: argparse.Namespace) -> int:
    """estimate the relation vector on a proxy dataset; write relation JSON

    Fine-tune the same starting weights on a proxy dataset once per batch size (and seed)
    until the target accuracy, and write the relation vector (powerctl.relation/2) that devices use
    to choose their batch size.
    """
    _prepare(args)
    from fl_server.relation import RelationCompute, RelationSettings, estimate_relation

    check_output_file(args.out)
    if args.cache_dir is not None and not args.no_cache:
        check_output_dir(args.cache_dir, "--cache-dir")
    given = {dest: getattr(args, dest) for dest, *_ in RUN_FLAGS.values() if dest != "batch_sizes"}
    settings = RelationSettings(**given, seq_len=args.seq_len, limit=args.limit)
    how = RelationCompute(
        cache_dir=args.cache_dir,
        use_cache=not args.no_cache,
        parallel=args.parallel,
        num_cpus=args.cpus,
        device=args.device,
        progress=not args.no_progress,
    )
    rel = estimate_relation(
        args.model,
        args.weights,
        args.proxy,
        target_accuracy=args.target,
        batch_sizes=args.batch_sizes,
        settings=settings,
        how=how,
    )
    rel.save(args.out)
    if warning := rel.coarse_warning():
        say(f"{PROG} relation: warning: {warning}", file=sys.stderr)
    say(f"relation vector of {rel.model} on {rel.proxy_dataset}, target accuracy {rel.target_accuracy}:")
    say(f"{'batch':>6} {'lr':>10} {'samples':>10} {'relation':>9}")
    lrs = rel.extra.get("lr") or [float("nan")] * len(rel.batch_sizes)
    for b, lr, s, r in zip(rel.batch_sizes, lrs, rel.samples_to_target, rel.relation, strict=True):
        say(f"{b:>6} {lr:>10.3g} {s:>10.0f} {r:>9.3f}")
    say(f"wrote {args.out}")
    return 0


def _prepare(args: argparse.Namespace) -> None:
    """The flags' checks that need the model registry or torch, before any work; --threads set."""
    if args.seq_len is not None and get_model_spec(args.model).task != "text":
        raise ModelError(f"--seq-len is for text models; {args.model!r} is an image model: drop --seq-len")
    resolve_torch_device(args.device)  # a GPU this torch does not have: one line before any work
    if args.threads:
        torch.set_num_threads(args.threads)


@one_line_errors(PROG)
def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `fl-server` and `python -m fl_server`; returns the exit status."""
    return run_command(build_parser(), argv)
