"""A node's own data (its `data` spec, else its share of the run's `client-data`), split into train and
test; read and partitioned once per process (one process serves many rounds and virtual nodes)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache, partial
from typing import TYPE_CHECKING, Any

from fl_client.node import NodeSettings
from powerfed.training.errors import DataError
from strategies.fleet import NodeConfigError
from strategies.settings import client_setting

if TYPE_CHECKING:
    from powerfed.training.data import Dataset


@dataclass(frozen=True)
class DataPlan:
    """Where a node's data comes from; hashable, so the loaded splits can be cached per plan."""

    spec: str
    seed: int
    seq_len: int
    partition_id: int | None = None
    num_partitions: int | None = None
    scheme: str = "iid"
    alpha: float = 0.5


def data_plan(settings: NodeSettings, run_config: Any, seq_len: int) -> DataPlan:
    """The node's own `data`, else its partition of the run's `client-data`."""
    setting = partial(client_setting, run_config, error=NodeConfigError)
    seed = setting("client_data_seed")
    if settings.data is not None:
        return DataPlan(settings.data, seed, seq_len)
    share = (
        settings.partition_id,
        settings.num_partitions or 1,
        setting("partitioning"),
        setting("dirichlet_alpha"),
    )
    return DataPlan(setting("client_data"), seed, seq_len, *share)


@lru_cache(maxsize=2)
def _dataset(spec: str, seq_len: int, seed: int) -> Dataset:
    from powerfed.training.data import load_dataset

    return load_dataset(spec, split="all", seq_len=seq_len, seed=seed)


@lru_cache(maxsize=2)
def _shares(spec: str, seq_len: int, seed: int, num: int, scheme: str, alpha: float) -> list[Dataset]:
    from powerfed.training.partition import partition

    return partition(_dataset(spec, seq_len, seed), num, scheme=scheme, alpha=alpha, seed=seed, min_size=2)


@cache
def load_local_data(plan: DataPlan) -> tuple[Dataset, Dataset]:
    """(train, test) of the node; a missing file or an empty share is one DataError line."""
    from powerfed.training.data import train_test_split

    if plan.partition_id is None:
        data = _dataset(plan.spec, plan.seq_len, plan.seed)
    else:
        share = plan.num_partitions or 1, plan.scheme, plan.alpha
        data = _shares(plan.spec, plan.seq_len, plan.seed, *share)[plan.partition_id]
    if len(data) < 2:
        raise DataError(f"{data.name}: {len(data)} sample(s), too few for a train/test split")
    return train_test_split(data, seed=plan.seed)
