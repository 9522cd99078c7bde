"""Estimate the relation vector on proxy data (docs/design/method.md): for every batch size and seed the
same starting weights fine-tuned until the target accuracy; `relation[b]` is the mean samples to target
divided by the largest batch size's. What is estimated is one record (`request.RelationRequest`, its
hash the cache key, with what the floats depend on: torch, thread count, CPU); how it is made is
`RelationCompute` (cache, device, Ray, progress); the runs are `runs`, the cache `cache`.
"""

from fl_server.relation.cache import default_cache_dir
from fl_server.relation.estimate import estimate_relation, ranking, seeds_until_stable
from fl_server.relation.parallel import gpu_share
from fl_server.relation.request import (
    CACHE_VERSION,
    NotCached,
    RelationCompute,
    RelationError,
    RelationRequest,
    RelationSettings,
)
from fl_server.relation.runs import ProxyRuns, run_to_target

__all__ = [
    "CACHE_VERSION",
    "NotCached",
    "ProxyRuns",
    "RelationCompute",
    "RelationError",
    "RelationRequest",
    "RelationSettings",
    "default_cache_dir",
    "estimate_relation",
    "gpu_share",
    "ranking",
    "run_to_target",
    "seeds_until_stable",
]
