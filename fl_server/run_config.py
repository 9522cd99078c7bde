"""The ServerApp's run config (`[tool.flwr.app.config]` + `--run-config`), checked whole before any
expensive work (one line for the first problem); `check_before_start` also checks what it names, where a
run is submitted. Paths are absolute or relative to the app folder."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from powerctl.errors import PowerctlError
from powerctl.files.outputs import check_output_dir
from powerctl.records.relation import RelationVector
from strategies.fleet import NodeConfigError, app_path_of, fleet_file
from strategies.settings import RunSettings, SettingsError, read_settings

ServerConfig = RunSettings  # the run, as the server runs it
FAULT_SWITCH = "POWERFED_FAULT_INJECTION"
RESULTS_DIR = "run config: 'results-dir'"  # how a results folder that cannot be written is named
RUN_CONFIG_EXAMPLE = "'num-server-rounds=3 model=\"cnn-tiny\"'"
# a shell word (`shlex.split`'s, found in linear time: shlex is quadratic on a large fleet table)
_WORD = re.compile(r"""(?:[^\s'"]+|'[^']*'|"(?:[^"\\]|\\.)*")+""")


class RunConfigError(SettingsError):
    """A run config key is unknown or holds a value that cannot be used."""


FleetFileLoader = Callable[[Path], Sequence[Any]]  # reads a fleet file's boards (a launcher passes one)


def parse_server_config(run_config: Any, *, load_fleet_file: FleetFileLoader | None = None) -> ServerConfig:
    """Check the whole run config; the first problem is one RunConfigError line. A fleet file must
    exist, and is parsed too by `load_fleet_file`, where given."""
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


def given_relation(cfg: ServerConfig) -> RelationVector:
    """The relation vector file the run config names, checked against the run's model."""
    relation = RelationVector.load(app_path_of(cfg.relation))
    if relation.model != cfg.model:
        raise PowerctlError(
            f"run config 'relation': the vector is for model {relation.model!r}, the run trains {cfg.model!r}"
        )
    return relation


# --- the run config as Flower reads it ---------------------------------------------------------------
def app_config(app_dir: Path) -> dict[str, Any]:
    """The app's `[tool.flwr.app.config]`, flattened as Flower flattens it: the keys a run may set."""
    from flwr.common.config import flatten_dict, get_project_config

    try:
        project = get_project_config(app_dir)
    except (ValueError, OSError) as exc:  # no pyproject.toml, or not a Flower app's
        raise RunConfigError(f"{app_dir}: not a Flower app ({' '.join(str(exc).split())})") from None
    return flatten_dict(project["tool"]["flwr"]["app"].get("config", {}))


def parse_run_config(text: str) -> dict[str, Any]:
    """`--run-config TEXT` as `flwr run` parses it (Flower's own parser); one line when it cannot."""
    import click
    from flwr.common.config import parse_config_args

    try:
        parsed = dict(parse_config_args([text]))
    except (click.ClickException, ValueError, OSError) as exc:
        for pair in text.split():  # name the pair Flower cannot read, when one alone is the problem
            key, eq, value = pair.partition("=")
            try:
                parse_config_args([pair])
            except (click.ClickException, ValueError, OSError):
                if eq and key and value and value[0] not in "'\"":
                    raise RunConfigError(
                        f"run config {pair!r}: {value!r} is not a number or true/false, and a string "
                        f'is quoted: {key}="{value}"'
                    ) from None
                raise RunConfigError(
                    f"run config {pair!r} is not key=value as Flower reads it; e.g. {RUN_CONFIG_EXAMPLE}"
                ) from None
        detail = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        raise RunConfigError(f"run config {text!r}: {detail.splitlines()[0]}") from None
    if _WORD.sub("", text).strip():
        return parsed  # an open quote: Flower's parser above read it as it reads it
    for word in _WORD.findall(text):  # Flower skips what is not key=value: a typo must not pass
        if word.partition("=")[0] not in parsed:
            raise RunConfigError(
                f"run config {word!r} is not key=value (Flower would ignore it); e.g. {RUN_CONFIG_EXAMPLE}"
            )
    return parsed


def toml_value(value: Any, key: str) -> str:
    """One run config value as Flower's `--run-config` parser reads it back unchanged."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if not isinstance(value, str):
        raise RunConfigError(
            f"run config {key!r}: a value must be a string, number or boolean, got {value!r}"
        )
    if "'" not in value:
        return f"'{value}'"  # a TOML literal string: backslashes and double quotes as they are
    if '"' not in value and "\\" not in value:
        return f'"{value}"'
    raise RunConfigError(f"run config {key!r}: a string cannot hold both quote kinds, got {value!r}")


def run_config_text(config: dict[str, Any]) -> str:
    """`--run-config` text: key=value pairs, strings quoted as TOML strings."""
    return " ".join(f"{k}={toml_value(v, k)}" for k, v in config.items())


# --- what the config names, checked where the run is submitted ---------------------------------------
def check_task_files(
    cfg: ServerConfig,
    where: Callable[[str], str] = lambda key: f"run config: {key!r}",
    error: type[PowerctlError] = RunConfigError,
) -> None:
    """The weights and relation files named, read as the ServerApp reads them; the first problem is one
    `error` line starting with `where(key)`."""

    def weights() -> None:
        from fl_server.weights import load_model

        load_model(app_path_of(cfg.weights), expect_model=cfg.model)

    for key, check in (("weights", weights), ("relation", partial(given_relation, cfg))):
        if getattr(cfg, key):
            try:
                check()
            except PowerctlError as exc:
                raise error(f"{where(key)}: {exc}") from None


def check_before_start(
    overrides: dict[str, Any], app_dir: Path, *, load_fleet_file: FleetFileLoader | None = None
) -> tuple[ServerConfig, dict[str, Any]]:
    """Every check a submitted run allows before Flower starts (the overrides merged as Flower does, every
    value, the results folder, the task's files): the checked config and the merged run config."""
    from flwr.common.config import fuse_dicts

    known = app_config(app_dir)
    cfg = parse_server_config({**known, **overrides}, load_fleet_file=load_fleet_file)
    try:
        merged = fuse_dicts(known, overrides)
    except ValueError as exc:  # a declared key pyproject.toml lacks: Flower would refuse the run
        raise RunConfigError(
            f"run config: {exc} (keys of [tool.flwr.app.config] in pyproject.toml)"
        ) from None
    if cfg.results_dir:
        check_output_dir(Path(cfg.results_dir).expanduser(), RESULTS_DIR)
    check_task_files(cfg)
    return cfg, merged
