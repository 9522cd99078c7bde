"""The relation vector estimated on proxy data (docs/design/method.md): what is estimated is
`request.RelationRequest` (its hash the cache key), how it is made `RelationCompute`; the runs are `runs`,
the cache `cache`."""

from fl_server.relation.estimate import estimate_relation as estimate_relation
from fl_server.relation.estimate import ranking as ranking
from fl_server.relation.estimate import seeds_until_stable as seeds_until_stable
from fl_server.relation.request import CACHE_VERSION as CACHE_VERSION
from fl_server.relation.request import NotCached as NotCached
from fl_server.relation.request import RelationCompute as RelationCompute
from fl_server.relation.request import RelationError as RelationError
from fl_server.relation.request import RelationSettings as RelationSettings
from fl_server.relation.runs import ProxyRuns as ProxyRuns
from fl_server.relation.runs import run_to_target as run_to_target
