"""Generated datasets, the defaults when no data is given, seeded. They behave like real fine-tuning data:
accuracy rises with training but not at once, has a ceiling below 100%, and the batch size changes how
many samples reach a target (the relation vector is not flat)."""

from __future__ import annotations

import bisect

import numpy as np
import torch
import torch.nn.functional as F

from powerfed.training.data.dataset import Dataset
from powerfed.training.data.text import split_ids, text_dataset
from powerfed.training.errors import DataError
from powerfed.training.tasks import VOCAB

SPLIT_OFFSETS = {"train": 1, "test": 2}
"""Samples of each split come from their own stream, so train and test never share a sample (`load_dataset`
checked the split)."""


def class_templates(num_classes: int, seed: int, size: int = 40, grid: int = 5) -> torch.Tensor:
    """One smooth random colour pattern per class, [C, 3, size, size], unit variance: a coarse random
    grid upsampled bicubically, so classes differ in shape and colour rather than in single pixels."""
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(num_classes, 3, grid, grid, generator=g)
    t = F.interpolate(coarse, size=(size, size), mode="bicubic", align_corners=True)
    t = t - t.mean(dim=(1, 2, 3), keepdim=True)
    return t / t.std(dim=(1, 2, 3), keepdim=True)


def synthetic_image(n: int = 4000, *, seed: int = 0, split: str = "train") -> Dataset:
    """`n` standardised 3×32×32 images of `num_classes` smooth templates (from `seed` alone), each made
    harder by a random crop (±`shift` px), a per-channel gain and offset, a share (up to `distractor`)
    of another class's template, a smooth background of std `clutter` (pooling cannot average it away)
    and pixel noise of std `noise`. Tuned so that cnn-tiny (Adam, lr 1e-3) is at ~30-40% after 256
    samples, ~80% after ~3000 and levels off at ~85%; larger batches need more samples to get there."""
    num_classes, shift = 10, 4
    noise, distractor, clutter = 1.0, 0.6, 1.5
    size = 32 + 2 * shift
    templates = class_templates(num_classes, seed, size)
    g = torch.Generator().manual_seed(seed * 1009 + SPLIT_OFFSETS[split])
    labels = torch.arange(n) % num_classes
    labels = labels[torch.randperm(n, generator=g)]
    other = (labels + torch.randint(1, num_classes, (n,), generator=g)) % num_classes
    mix = distractor * torch.rand(n, 1, 1, 1, generator=g)
    big = templates[labels] + mix * templates[other]
    x = _random_crops(big, shift, g)
    gain = 1.0 + 0.3 * torch.randn(n, 3, 1, 1, generator=g)
    offset = 0.3 * torch.randn(n, 3, 1, 1, generator=g)
    background = class_templates(n, int(torch.randint(0, 2**31 - 1, (1,), generator=g)), 32)
    x = gain * x + offset + clutter * background + noise * torch.randn(x.shape, generator=g)
    # expected variance of the sum above: rescale to unit variance, like normalised real images
    var = (1 + 0.3**2) * (1 + distractor**2 / 3) + 0.3**2 + clutter**2 + noise**2
    x = x / var**0.5
    return Dataset(
        name="synthetic-image",
        task="image",
        x=x.contiguous(),
        y=labels.to(torch.int64),
        num_classes=num_classes,
        classes=tuple(f"class{c}" for c in range(num_classes)),
        info={
            "seed": seed,
            "split": split,
            "noise": noise,
            "shift": shift,
            "distractor": distractor,
            "clutter": clutter,
        },
    )


def _random_crops(big: torch.Tensor, shift: int, g: torch.Generator) -> torch.Tensor:
    """A 32×32 crop of each [3, 32 + 2·shift, ...] image at its own random offset (vectorised)."""
    n = big.shape[0]
    dy = torch.randint(0, 2 * shift + 1, (n,), generator=g)
    dx = torch.randint(0, 2 * shift + 1, (n,), generator=g)
    ar = torch.arange(32)
    rows = (dy[:, None] + ar).view(n, 1, 32, 1).expand(n, 3, 32, big.shape[3])
    x = torch.gather(big, 2, rows)
    cols = (dx[:, None] + ar).view(n, 1, 1, 32).expand(n, 3, 32, 32)
    return torch.gather(x, 3, cols)


TEXT_ALPHABET = "etaoinshrdlcumwf" + " ,.\n"
"""Sixteen common letters, space, comma, full stop and newline: a subset of VOCAB that reads like text."""
_LETTERS = 16


def markov_table(seed: int, successors: int = 5, concentration: float = 0.5) -> np.ndarray:
    """Order-2 transition probabilities P[a, b, c] over TEXT_ALPHABET, seeded: the previous symbol b
    fixes which `successors` may follow (after a space or punctuation only letters), the one before it
    sets their weights (Dirichlet(`concentration`)), so one character of context helps, two a lot more."""
    rng = np.random.default_rng(seed)
    k = len(TEXT_ALPHABET)
    table = np.zeros((k, k, k))
    for b in range(k):
        pool = _LETTERS if b >= _LETTERS else k
        allowed = rng.choice(pool, size=successors, replace=False)
        table[:, b, allowed] = rng.dirichlet(np.full(successors, concentration), size=k)
    return table


def _markov_chain(table: np.ndarray, n_chars: int, rng: np.random.Generator) -> np.ndarray:
    """Sample n_chars symbols (alphabet indices) from the order-2 chain (plain lists: ~1 µs a step)."""
    k = table.shape[0]
    cum = np.cumsum(table.reshape(k * k, k), axis=1)
    cum /= cum[:, -1:]  # exactly 1 at the end of each row: every u in [0, 1) finds a symbol
    rows = cum.tolist()
    out = [0] * n_chars
    a, b = 0, 1
    for i, u in enumerate(rng.random(n_chars).tolist()):
        c = bisect.bisect_right(rows[a * k + b], u)
        out[i] = c
        a, b = b, c
    return np.asarray(out, dtype=np.int64)


def synthetic_text(
    n_chars: int = 200_000, *, seq_len: int = 64, seed: int = 0, split: str = "train"
) -> Dataset:
    """Character windows of `n_chars` of a seeded order-2 Markov chain over TEXT_ALPHABET, split 90/10
    like a text file; the Bayes predictor's accuracy is info["accuracy_ceiling"] (about 0.55)."""
    if n_chars < 2 * (seq_len + 1) * 10:
        raise DataError(
            f"synthetic_text: n_chars={n_chars} too small for seq_len={seq_len}; use ≥ {20 * (seq_len + 1)}"
        )
    table = markov_table(seed)
    symbols = _markov_chain(table, n_chars, np.random.default_rng([seed, 7]))
    alphabet_ids = np.array([VOCAB.index(c) for c in TEXT_ALPHABET], dtype=np.int64)
    part = split_ids(symbols, split)  # the Bayes predictor: the likeliest symbol after the previous two
    ceiling = float(table.max(axis=2)[part[:-2], part[1:-1]].mean())
    return text_dataset(
        "synthetic-text",
        alphabet_ids[symbols],
        split=split,
        seq_len=seq_len,
        limit=None,
        seed=seed,
        accuracy_ceiling=ceiling,
    )
