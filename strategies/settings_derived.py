"""What derives from the run settings' declarations: a command-line flag (`flag`), pyproject.toml's
``[tool.flwr.app.config]`` table and docs/reference/run-config.md's tables (both `make docs`)."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

from powerctl.cli.util import kind_type
from strategies.settings import BOTH, CLIENT, SERVER, SETTINGS, Setting, key_of

READ_BY = {SERVER: "server", CLIENT: "client app", BOTH: "server, clients"}  # as the docs name them


def flag(name: str, help: str) -> dict[str, Any]:
    """`add_argument` keywords for a flag that is run setting `name`: its kind, default and key, so the
    flag checks and defaults as the run does."""
    s = SETTINGS[key_of(name)]
    return {
        "type": kind_type(s.kind, s.key),
        "default": s.typed_default(),
        "help": f"{help} (run config {s.key}; default: {s.default})",
    }


def app_config_toml() -> str:
    """The ``[tool.flwr.app.config]`` table pyproject.toml must hold, each key under its help."""
    lines = ["[tool.flwr.app.config]"]
    for s in SETTINGS.values():
        lines += textwrap.wrap(
            s.help, 100, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False
        )
        lines.append(f"{s.key} = {_toml(s.default)}")
    return "\n".join(lines) + "\n"


def markdown_table(settings: Iterable[Setting] | None = None, text: Callable[[str], str] = str) -> str:
    """The settings as a Markdown table for the docs; `text` turns a help text into its cell."""
    lines = ["| key | default | takes | what it is | read by |", "|---|---|---|---|---|"]
    for s in settings if settings is not None else SETTINGS.values():
        cells = [f"`{s.key}`", f"`{_toml(s.default)}`", s.kind.expected, text(s.help), READ_BY[s.readers]]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def _toml(value: bool | int | float | str) -> str:
    """A default as TOML writes it: a JSON scalar is one."""
    return json.dumps(value, ensure_ascii=False)
