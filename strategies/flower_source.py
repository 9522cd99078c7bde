"""Flower source this project reproduces or runs outside Flower's entry points (used only while the
installed source has the recorded `text_fingerprint`), the scripts that run it, and Flower's own config
file ($FLWR_HOME/config.toml), read bounded and checked before `flwr` reads it (it raises a traceback on a
folder or a binary one)."""

from __future__ import annotations

import hashlib
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

from powerctl.errors import PowerctlError

SHEBANG_LIMIT = 127  # the longest `#!` line some kernels read whole (Linux before 5.1, a Jetson's L4T)
CONFIG_LIMIT = 1 << 20  # Flower's config.toml holds a few connections


def text_fingerprint(text: str) -> str:
    """SHA-256 of Python source, dedented, trailing spaces and blank lines out (a changed comment counts)."""
    lines = (line.rstrip() for line in textwrap.dedent(text).splitlines())
    return hashlib.sha256("\n".join(line for line in lines if line).encode()).hexdigest()


def shebang_problem() -> str | None:
    """Why a `#!` line cannot start this interpreter, or None."""
    path = sys.executable
    if not path:
        return "the interpreter's path is unknown"
    if any(c.isspace() for c in path):
        return f"the interpreter's path {path!r} has white space in it"
    if len(f"#!{path}".encode()) > SHEBANG_LIMIT:
        return f"the interpreter's path {path!r} is longer than a #! line may be ({SHEBANG_LIMIT} bytes)"
    return None


def write_python_script(path: Path, body: str) -> Path:
    """Write PATH, executable: this interpreter (`#!` sys.executable) running `body`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!{sys.executable}\n{body}", encoding="utf-8")
    path.chmod(0o755)
    return path


def read_small(path: Path, limit: int, what: str) -> bytes:
    """A file the user names, bounded: anything else is one line naming it."""
    from powerctl.files.readfile import read_bytes

    try:
        return read_bytes(path.expanduser(), limit=limit, what=what, error=PowerctlError)
    except OSError as exc:
        raise PowerctlError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def _check_connection(doc: dict[str, Any], name: str | None, path: Path) -> None:
    """The connection asked for (None: the default) is in config.toml, else one line listing those there."""
    links = doc.get("superlink", {})
    links = links if isinstance(links, dict) else {}
    names = sorted(k for k, v in links.items() if isinstance(v, dict))
    there = f"it has {', '.join(names)}" if names else "it has none"
    if name is None:
        name = links.get("default")
        if not isinstance(name, str):
            raise PowerctlError(
                f'no default flwr connection in {path} ({there}): name one, or set default = "NAME" under '
                "[superlink]"
            )
    if name not in names:
        raise PowerctlError(
            f"no flwr connection {name!r} in {path} ({there}); add a [superlink.{name}] table with its "
            "address (docs/deployment.md, section 5)"
        )


def read_flwr_connection(name: str | None) -> Any:
    """The `flwr` connection `name` (None: the default one) as `flwr` reads it, after the file is read
    bounded and checked; a bad file or no such connection is one PowerctlError line."""
    import click
    import tomli
    from flwr.cli.constant import FLOWER_CONFIG_FILE
    from flwr.cli.flower_config import read_superlink_connection
    from flwr.supercore.utils import get_flwr_home

    path = get_flwr_home() / FLOWER_CONFIG_FILE  # default ~/.flwr/config.toml
    if os.path.lexists(path):
        data = read_small(path, CONFIG_LIMIT, "Flower's config.toml")
        fix = "fix it, or move it away (flwr then writes a fresh one)"
        try:
            doc = tomli.loads(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise PowerctlError(f"{path} is not a text file (UTF-8 TOML); {fix}") from None
        except tomli.TOMLDecodeError as exc:
            raise PowerctlError(f"{path} is not valid TOML ({exc}); {fix}") from None
        _check_connection(doc, name, path)
    try:
        return read_superlink_connection(name)
    except click.ClickException as exc:
        raise PowerctlError(" ".join(str(exc.message).split())) from None
    except (OSError, ValueError) as exc:  # changed under us since it was read
        raise PowerctlError(f"cannot read {path}: {exc}") from None
