"""Where the project caches what is expensive to make: profiles, relation vectors, pre-trained weights."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "POWERFED_CACHE"
"""Environment variable: root of every cache (default ~/.cache/powerfed)."""


def cache_dir(kind: str) -> Path:
    """$POWERFED_CACHE/KIND, else ~/.cache/powerfed/KIND (profile, relation, weights)."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root) if root else Path.home() / ".cache" / "powerfed") / kind
