"""The ServerApp's settings: the run config (`[tool.flwr.app.config]` + `--run-config`), checked whole.

Every key is declared once in `strategies.settings`, with its kind, default and help. `parse_server_config`
checks every key before any expensive work starts — the ones only the clients read (`fleet`,
`client-data`, `partitioning`, `inject-failures`, ...) included, so a bad one fails the run at once
rather than every client in every round — and a launcher can call it before Flower starts. A bad key
is one line naming it, its value and what it must be; an unknown one is named with the nearest known
key. Paths must be absolute (or relative to the app folder): the ServerApp runs from Flower's copy of
the app, not from the folder `flwr run` was started in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from strategies.fleet import NodeConfigError, app_path_of, fleet_file
from strategies.settings import RunSettings, SettingsError, read_settings

ServerConfig = RunSettings
"""The run, as the server runs it (and as it checked what its clients will read)."""
FAULT_SWITCH = "POWERFED_FAULT_INJECTION"


class RunConfigError(SettingsError):
    """A run config key is unknown or holds a value that cannot be used."""


FleetFileLoader = Callable[[Path], Sequence[Any]]
"""Reads a fleet file's boards (`fl_client.node.load_fleet_file`: the YAML reader lives with the
ClientApp, which a ServerApp does not import; a launcher passes it)."""


def parse_server_config(run_config: Any, *, load_fleet_file: FleetFileLoader | None = None) -> ServerConfig:
    """Check the whole run config (every key the server or the clients read); the first problem is one
    RunConfigError line. A fleet table is parsed and its caps checked against their boards; a fleet
    file must exist, and is parsed too when `load_fleet_file` is given."""
    cfg = read_settings(run_config, RunConfigError)
    stop = cfg.inject_server_stop_round
    if stop and os.environ.get(FAULT_SWITCH) != "1":
        raise RunConfigError(
            f"run config: 'inject-server-stop-round' is for soak tests only ({FAULT_SWITCH}=1), got {stop!r}"
        )
    path = fleet_file(cfg.fleet)
    if path is not None and load_fleet_file is not None:
        try:
            load_fleet_file(path)
        except NodeConfigError as exc:
            raise RunConfigError(f"run config: 'fleet': {exc}") from None
    return cfg


def app_path(value: str, key: str) -> Path:
    """A file named in the run config: absolute, or relative to the app folder; it must exist."""
    path = app_path_of(value)
    if not path.is_file():
        raise RunConfigError(f"run config: {key!r}: no such file {path} (give an absolute path)")
    return path
