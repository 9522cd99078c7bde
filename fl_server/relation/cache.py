"""The relation cache: one file per request, named by its key, for every kind of estimate."""

from __future__ import annotations

from pathlib import Path

from fl_server.relation.parallel import log
from fl_server.relation.request import RelationCompute, RelationRequest
from powerctl.errors import FileFormatError
from powerctl.files.cache import cache_dir
from powerctl.records.relation import RelationVector


def lookup(
    request: RelationRequest, how: RelationCompute, user_code: bool
) -> tuple[Path | None, RelationVector | None]:
    """Where it is cached (None: not asked, or user code without a `cache_key`) and the vector there."""
    if not how.use_cache:
        return None, None
    if user_code and not request.user_key:
        log.info("relation vector of %s not cached: user code needs a cache_key to be cached", request.model)
        return None, None
    key = request.cache_key()
    path = Path(how.cache_dir or cache_dir("relation")) / f"relation-{key[:40]}.json"
    if path.is_file():
        try:
            cached = RelationVector.load(path)
            if cached.extra.get("cache_key") == key:
                return path, cached
        except FileFormatError:
            pass  # a damaged cache entry is recomputed and overwritten
    return path, None


def store(relation: RelationVector, path: Path | None) -> None:
    """The vector into its cache file, if any; an unwritable cache is a warning, not a lost result."""
    if path is None:
        return
    try:
        relation.save(path)
    except OSError as exc:
        log.warning("warning: relation cache not written (%s: %s)", path, exc.strerror or exc)
