"""Knob state saved by `powerctl freq --set` so that `--restore` (another process) can put it back."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from powerctl.jsonfile import read_json, write_json

STATE_SCHEMA = "powerctl.freqstate/1"


def state_dir() -> Path:
    """`POWERCTL_STATE_DIR`, else `$XDG_STATE_HOME/powerctl`, else `~/.local/state/powerctl`."""
    if d := os.environ.get("POWERCTL_STATE_DIR"):
        return Path(d)
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "powerctl"


def state_path(spec: str) -> Path:
    return state_dir() / (re.sub(r"[^A-Za-z0-9_.-]", "_", spec) + ".json")


def save_state(spec: str, state: dict[str, Any]) -> Path:
    """Keep the first saved state: a second `--set` must not overwrite the original settings."""
    path = state_path(spec)
    if not path.exists():
        write_json(path, {"schema": STATE_SCHEMA, "spec": spec, "state": state})
    return path


def load_state(spec: str) -> dict[str, Any] | None:
    path = state_path(spec)
    if not path.exists():
        return None
    return dict(read_json(path, STATE_SCHEMA)["state"])


def clear_state(spec: str) -> None:
    state_path(spec).unlink(missing_ok=True)
