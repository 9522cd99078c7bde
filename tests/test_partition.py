"""Client partitions: every sample in exactly one client, sizes as promised, skew as alpha says."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from powerfed.training.data import Dataset
from powerfed.training.errors import DataError
from powerfed.training.partition import partition, partition_indices
from powerfed.training.synthetic import synthetic_text


def labelled(labels: list[int] | np.ndarray, num_classes: int = 10) -> Dataset:
    """A dataset whose inputs record their own index, so parts can be traced back."""
    y = torch.as_tensor(np.asarray(labels, dtype=np.int64))
    x = torch.arange(len(y), dtype=torch.float32).view(-1, 1, 1, 1).expand(-1, 3, 2, 2).contiguous()
    return Dataset("toy", "image", x, y, num_classes)


def origin(part: Dataset) -> list[int]:
    return part.x[:, 0, 0, 0].long().tolist()


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    joined = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    assert len(joined) == n and np.array_equal(np.sort(joined), np.arange(n))


problems = st.integers(1, 300).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 9), min_size=n, max_size=n),
        st.integers(1, min(n, 12)),
        st.sampled_from(["iid", "dirichlet"]),
        st.floats(0.05, 50.0),
        st.integers(0, 2**31 - 1),
    )
)


@settings(max_examples=60, deadline=None)
@given(problems)
def test_every_sample_in_exactly_one_part(problem) -> None:
    labels, k, scheme, alpha, seed = problem
    parts = partition_indices(np.array(labels), k, scheme=scheme, alpha=alpha, seed=seed, min_size=0)
    assert len(parts) == k
    assert_exact_cover(parts, len(labels))
    again = partition_indices(np.array(labels), k, scheme=scheme, alpha=alpha, seed=seed, min_size=0)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 500), st.integers(1, 20), st.integers(0, 1000))
def test_iid_sizes_differ_by_at_most_one(n: int, k: int, seed: int) -> None:
    k = min(k, n)
    sizes = [len(p) for p in partition_indices(np.zeros(n, np.int64), k, seed=seed)]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.1, 0.5, 1.0]), st.integers(2, 10), st.integers(1, 8))
def test_dirichlet_respects_min_size(seed: int, alpha: float, k: int, min_size: int) -> None:
    labels = np.repeat(np.arange(10), 30)
    parts = partition_indices(labels, k, scheme="dirichlet", alpha=alpha, seed=seed, min_size=min_size)
    assert min(len(p) for p in parts) >= min_size
    assert_exact_cover(parts, len(labels))


def test_partition_returns_traceable_datasets() -> None:
    ds = labelled(np.arange(40) % 10)
    parts = partition(ds, 4, seed=3)
    assert [p.name for p in parts] == [f"toy#client{i}" for i in range(4)]
    assert parts[2].info["client"] == 2 and parts[2].info["scheme"] == "iid"
    seen = sorted(i for p in parts for i in origin(p))
    assert seen == list(range(40))
    for p in parts:
        assert p.y.tolist() == [int(ds.y[i]) for i in origin(p)]  # inputs stay with their labels
        assert origin(p) == sorted(origin(p))  # original order kept
    different = partition(ds, 4, seed=4)
    assert any(origin(a) != origin(b) for a, b in zip(parts, different, strict=True))


def label_skew(parts: list[Dataset] | list[np.ndarray], num_classes: int | None = None) -> float:
    """Mean total-variation distance between each part's label mix and the overall mix (0 = IID)."""
    labels = [p.labels() if isinstance(p, Dataset) else np.asarray(p) for p in parts]
    k = num_classes or int(max((int(lab.max()) for lab in labels if len(lab)), default=0)) + 1
    counts = np.stack([np.bincount(lab, minlength=k) for lab in labels]).astype(float)
    overall = counts.sum(0) / counts.sum()
    sizes = counts.sum(1, keepdims=True)
    mixes = np.divide(counts, sizes, out=np.zeros_like(counts), where=sizes > 0)
    return float(0.5 * np.abs(mixes - overall).sum(1)[sizes[:, 0] > 0].mean())


def test_small_alpha_skews_more() -> None:
    labels = np.repeat(np.arange(10), 200)

    def skew(scheme: str, alpha: float = 0.5) -> float:
        runs = [partition_indices(labels, 10, scheme=scheme, alpha=alpha, seed=s) for s in range(3)]
        return float(np.mean([label_skew([labels[p] for p in parts], 10) for parts in runs]))

    by_alpha = {a: skew("dirichlet", a) for a in (0.1, 1.0, 100.0)}
    assert by_alpha[0.1] > by_alpha[1.0] > by_alpha[100.0]
    assert by_alpha[0.1] > 0.5 and skew("iid") < 0.1


def test_text_is_partitioned_by_first_target_character() -> None:
    ds = synthetic_text(20_000, seq_len=16)
    parts = partition(ds, 5, scheme="dirichlet", alpha=0.1, seed=0, min_size=5)
    assert sum(len(p) for p in parts) == len(ds)
    firsts = [set(p.y[:, 0].tolist()) for p in parts]
    assert min(len(f) for f in firsts) < len(set(ds.y[:, 0].tolist()))  # some client misses some labels
    assert label_skew(parts) > 0.3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_clients": 0}, "positive integer"),
        ({"num_clients": 11}, "fewer clients"),
        ({"num_clients": 2, "scheme": "shards"}, "unknown partition scheme"),
        ({"num_clients": 2, "scheme": "dirichlet", "alpha": 0.0}, "alpha"),
        ({"num_clients": 2, "scheme": "dirichlet", "alpha": float("nan")}, "alpha"),
        ({"num_clients": 2, "min_size": -1}, "min_size"),
        ({"num_clients": 5, "scheme": "dirichlet", "min_size": 3}, "lower min_size"),
    ],
)
def test_bad_arguments_are_data_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(DataError, match=message) as err:
        partition(labelled(np.arange(10) % 10), **kwargs)
    assert "\n" not in str(err.value)


def test_unreachable_min_size_gives_up_with_advice() -> None:
    labels = np.zeros(12, np.int64)  # one class: each draw gives most samples to few clients
    with pytest.raises(DataError, match="raise alpha"):
        partition_indices(labels, 4, scheme="dirichlet", alpha=0.01, seed=0, min_size=3)
