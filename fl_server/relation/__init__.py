"""Estimate the relation vector on proxy data (docs/design/method.md, docs/reference/files.md).

For every batch size (and seed), the SAME starting weights are fine-tuned on a proxy dataset until the
target accuracy, the learning rate scaled from the largest batch size by the run's rule; samples to
target is the interpolated crossing (`powerfed.training.crossing`) and `relation[b]` its mean over seeds
divided by the largest batch size's (`estimate.estimate_relation` says it whole). What is estimated is
one record, `request.RelationRequest`, whose hash is the cache key (`cache`): model, weights, proxy and
its bytes, target, batch sizes, the runs' `RelationSettings`, the code version, and what the floats
depend on (torch's version and thread count, the CPU). How it is made is `RelationCompute`: the cache's
folder and use, the torch device (not in the key: a GPU differs only by nondeterminism), Ray tasks of
one thread each (`parallel`), progress. One run is `runs.run_to_target`. User code (a factory, a loss,
a metric, a step, a whole loop) is cached only under a `cache_key` the user gives.
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
