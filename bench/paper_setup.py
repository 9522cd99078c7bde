"""What `paper_tables` runs: the boards and their caps, a task (`Task`: model, batch sizes, seeds,
budgets) and its data (CIFAR-10 or the text corpora, pre-training and targets related as the paper's)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from powerfed.training.data import CIFAR10_MEAN, CIFAR10_STD, load_dataset
from powerfed.training.models import build_model

DATA = Path("../shared/data")
BOARDS = ("jetson-nano", "jetson-tx2nx")
CAPS_W = {"jetson-nano": (3.0, 4.0), "jetson-tx2nx": (3.5, 5.0)}
"""Two caps per board: the state-of-practice frequency falls low and mid table (printed)."""


@dataclass
class Task:
    name: str
    model: str
    """What trains on the CPU (accuracy dynamics)."""
    charged: str
    """What the board charges for each step."""
    lr_max: float
    pretrain_samples: int
    batch_sizes: list[int]
    seeds: list[int]
    """Seeds of the target runs."""
    proxy_seeds: list[int]
    """Seeds of the proxy runs; the relation vector uses their mean."""
    calibration_samples: int
    """Budget of the one run per dataset that sets its target accuracy (`calibrate_target`)."""
    eval_every: int
    eval_max_samples: int
    target_fraction: float = 0.8
    """Where the target sits between the starting accuracy (0) and the calibration plateau (1)."""
    proxy_max_seeds: int = 0
    """Proxy seeds, one at a time up to this many, until the ranking is stable (`seeds_until_stable`)."""
    fixed_targets: list[float] | None = None
    """Targets for (proxy, target 1, target 2) given instead of calibrated."""
    pretrain_lr: float | None = None
    """Pre-training's learning rate (None: twice `lr_max`, the small models')."""
    targets: dict[str, float] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def b_max(self) -> int:
        return max(self.batch_sizes)

    @property
    def key(self) -> str:
        """The results' key: task and the model the board charges (vision has two)."""
        return f"{self.name}|{self.charged}"


# --- data ------------------------------------------------------------------------------------------------


PRETRAIN_CLASSES = 5
"""Pre-training sees CIFAR-10's first five classes, then a fresh 10-way head: like the paper's CIFAR-100 →
CIFAR-10, fine-tuning learns a label space pre-training did not have."""


def _luminance(x: torch.Tensor) -> torch.Tensor:
    """Mean brightness of each normalised image in 0..1 (the normalisation undone)."""
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    return (x * std + mean).mean(dim=(1, 2, 3))


def vision_data(n_pretrain_pool: int, n_proxy: int, n_target: int) -> dict[str, Any]:
    """Pre-training, proxy and targets from CIFAR-10, related as the paper's sources: pre-training on the
    first `PRETRAIN_CLASSES` classes of a pool of the train split, the proxy the test split, the targets the
    darker and the brighter half (mean luminance) of the train-split images pre-training did not use."""
    spec = f"cifar10-jpeg:{DATA / 'cifar10_jpeg' / 'cifar10-jpg.tar.gz'}"
    train = load_dataset(spec, split="train", limit=n_pretrain_pool + 2 * n_target)
    perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    pool, rest = train.subset(perm[:n_pretrain_pool]), train.subset(perm[n_pretrain_pool:])
    pre = pool.subset(torch.nonzero(pool.y < PRETRAIN_CLASSES).flatten())
    pre.name = f"cifar10:classes-0-{PRETRAIN_CLASSES - 1}"
    proxy = load_dataset(spec, split="test", limit=n_proxy)
    proxy.name = "cifar10:test"
    order = torch.argsort(_luminance(rest.x), stable=True)
    half = len(order) // 2
    dark, bright = rest.subset(order[:half]), rest.subset(order[half:])
    dark.name, bright.name = "cifar10:dark", "cifar10:bright"
    return {"pretrain": pre, "proxy": proxy, "targets": {dark.name: dark, bright.name: bright}}


FRESH_HEAD_SEED = 1


def head_name(model: torch.nn.Module) -> str:
    """The classifier that `fresh_head` replaces: the model's last linear layer."""
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)][-1]


def fresh_head(
    model_name: str, weights: dict[str, torch.Tensor], num_classes: int
) -> dict[str, torch.Tensor]:
    """`weights` with the last linear layer freshly initialised at `FRESH_HEAD_SEED`, not pre-training's
    seed (the backbone has adapted to that initial head)."""
    fresh = build_model(model_name, num_classes, seed=FRESH_HEAD_SEED)
    head = head_name(fresh)
    new_head = {k: v.clone() for k, v in fresh.state_dict().items() if k.startswith(f"{head}.")}
    return {k: v.clone() for k, v in weights.items()} | new_head


def text_data(limit: int, full: bool = False) -> dict[str, Any]:
    """Pre-training on WikiText-2 (valid; with `full`, valid and test joined, twice the text for the
    full model), the proxy tiny Shakespeare, the targets two novels."""

    def text(path: Path, most: int | None = limit) -> Any:
        return load_dataset(f"text:{path}", split="all", seq_len=64, limit=most)

    wiki = text(DATA / "wikitext-2" / "wiki.valid.tokens", None if full else limit)
    if full:
        more = text(DATA / "wikitext-2" / "wiki.test.tokens", None)
        wiki = dataclasses.replace(
            wiki, name="wikitext-2:valid+test", x=torch.cat([wiki.x, more.x]), y=torch.cat([wiki.y, more.y])
        )
    return {
        "pretrain": wiki,
        "proxy": text(DATA / "tinyshakespeare" / "input.txt"),
        "targets": {
            "austen-emma": text(DATA / "gutenberg_austen" / "austen-emma.txt"),
            "dickens-oliver-twist": text(DATA / "gutenberg_dickens" / "pg730-oliver_twist.txt"),
        },
    }
