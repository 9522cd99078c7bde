"""The XDG base folders (cache, data, state) the project's caches, results and pin records live under."""

from __future__ import annotations

import os
from pathlib import Path

XDG_HOMES = {
    "cache": ("XDG_CACHE_HOME", (".cache",)),
    "data": ("XDG_DATA_HOME", (".local", "share")),
    "state": ("XDG_STATE_HOME", (".local", "state")),
}


def xdg_home(kind: str) -> Path:
    """$XDG_{KIND}_HOME, else its default under ~ (a relative value is ignored, as the spec says)."""
    variable, default = XDG_HOMES[kind]
    value = os.environ.get(variable, "")
    usable = value and "\0" not in value and Path(value).is_absolute()
    return Path(value) if usable else Path.home().joinpath(*default)
