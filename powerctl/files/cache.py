"""The XDG base folders (cache, data, state) and the cache of what is costly to make (profiles, weights)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from powerctl.errors import PowerctlError

CACHE_ENV = "POWERFED_CACHE"  # the root of every cache (default $XDG_CACHE_HOME/powerfed)
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


def cache_root() -> Path:
    """$POWERFED_CACHE, else $XDG_CACHE_HOME/powerfed, checked at every use (before the work it keeps)."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        return xdg_home("cache") / "powerfed"
    hint = f"set {CACHE_ENV} to an absolute folder, or unset it for $XDG_CACHE_HOME/powerfed"
    if "\0" in root:
        raise PowerctlError(f"{CACHE_ENV}={root!r}: not a path (it holds a NUL character); {hint}")
    path = Path(root).expanduser()
    if not path.is_absolute():
        raise PowerctlError(f"{CACHE_ENV}={root}: a relative path (Flower's processes run elsewhere); {hint}")
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise PowerctlError(f"{CACHE_ENV}={root}: cannot be used ({exc.strerror}); {hint}") from None
    if not stat.S_ISDIR(mode):
        raise PowerctlError(f"{CACHE_ENV}={root}: exists and is not a folder; {hint}")
    return path


def cache_dir(kind: str) -> Path:
    """$POWERFED_CACHE/KIND, else $XDG_CACHE_HOME/powerfed/KIND (profile, relation, weights)."""
    return cache_root() / kind
