"""Splitting one dataset among federated clients: IID, or Dirichlet label skew (Hsu et al. 2019): per
class, the clients' shares drawn from Dir(alpha); small alpha gives each client few classes."""

from __future__ import annotations

import numpy as np

from powerfed.training.data.dataset import Dataset
from powerfed.training.errors import DataError

SCHEMES = ("iid", "dirichlet")
MAX_DRAWS = 1000
"""Dirichlet re-draws before giving up on `min_size` (it is then unreachable in practice)."""


def partition(
    ds: Dataset,
    num_clients: int,
    *,
    scheme: str = "iid",
    alpha: float = 0.5,
    seed: int = 0,
    min_size: int = 1,
) -> list[Dataset]:
    """Split `ds` into `num_clients` disjoint parts holding every sample once, each in the original order:
    iid, a seeded shuffle cut into near-equal parts; dirichlet, re-drawn until every client has at least
    `min_size` samples (text windows labelled by their first target). Same arguments, same parts."""
    parts = partition_indices(
        ds.labels(), num_clients, scheme=scheme, alpha=alpha, seed=seed, min_size=min_size
    )
    out = []
    for i, idx in enumerate(parts):
        part = ds.subset(idx)
        part.name = f"{ds.name}#client{i}"
        part.info.update(client=i, num_clients=num_clients, scheme=scheme, seed=seed)
        if scheme == "dirichlet":
            part.info["alpha"] = alpha
        out.append(part)
    return out


def partition_indices(
    labels: np.ndarray,
    num_clients: int,
    *,
    scheme: str = "iid",
    alpha: float = 0.5,
    seed: int = 0,
    min_size: int = 1,
) -> list[np.ndarray]:
    """The index arrays behind `partition`, for a label per sample (sorted within each part)."""
    labels = np.asarray(labels)
    n = len(labels)
    if scheme not in SCHEMES:
        raise DataError(f"unknown partition scheme {scheme!r}; use one of: {', '.join(SCHEMES)}")
    if not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise DataError(f"num_clients must be a positive integer, got {num_clients!r}")
    if min_size < 0:
        raise DataError(f"min_size must be ≥ 0, got {min_size}")
    if num_clients * max(min_size, 1 if scheme == "iid" else 0) > n:
        raise DataError(
            f"cannot give {num_clients} clients ≥ {max(min_size, 1)} sample(s) each from {n}; "
            "use fewer clients or a lower min_size"
        )
    if scheme == "dirichlet" and not (np.isfinite(alpha) and alpha > 0):
        raise DataError(f"Dirichlet alpha must be a positive number, got {alpha}")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        parts = np.array_split(rng.permutation(n), num_clients)
    else:
        parts = _dirichlet(labels, num_clients, alpha, min_size, rng)
    return [np.sort(p).astype(np.int64) for p in parts]


def _dirichlet(
    labels: np.ndarray, num_clients: int, alpha: float, min_size: int, rng: np.random.Generator
) -> list[np.ndarray]:
    """The standard recipe: per class, Dir(alpha) shares, skipping clients already above N/K."""
    n = len(labels)
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(MAX_DRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        sizes = np.zeros(num_clients, dtype=np.int64)
        for members in by_class:
            idx = rng.permutation(members)
            shares = rng.dirichlet(np.full(num_clients, alpha))
            capped = shares * (sizes < n / num_clients)  # keep parts from growing far beyond N/K
            shares = capped / capped.sum() if capped.sum() > 0 else shares / shares.sum()
            cuts = (np.cumsum(shares) * len(idx)).astype(np.int64)[:-1]
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
                sizes[client] += len(chunk)
        if sizes.min() >= min_size:
            return [np.concatenate(p) for p in parts]
    raise DataError(
        f"no Dirichlet(alpha={alpha}) split of {n} samples gives all {num_clients} clients ≥ {min_size} "
        f"samples in {MAX_DRAWS} draws; raise alpha, lower min_size or use fewer clients"
    )
