"""Flower source this project reproduces or runs outside Flower's own entry points, and the scripts
that run it.

The simulation's message index (`simulations.linkstate_index`) copies and wraps Flower functions; a
SuperNode's light `flwr-clientapp` (`fl_client.clientapp_entry`) runs a Flower file outside its
package. Each is used only while the installed Flower's source is the one it was written against:
the SHA-256 of that source, as `text_fingerprint` normalises it, is recorded beside each; any other
source gets Flower's own code path. Both are started by a Flower process that finds a command by name
on PATH, so each puts a script of that name (`write_python_script`) in a folder first on that PATH.
"""

from __future__ import annotations

import hashlib
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHEBANG_LIMIT = 127
"""The longest `#!` line some kernels still read whole (Linux before 5.1, a Jetson's L4T)."""


def text_fingerprint(text: str) -> str:
    """SHA-256 of Python source, dedented, trailing spaces and blank lines out (so a reindent or a blank
    line is no change; a changed comment is: the check errs on the side of Flower's own code)."""
    lines = (line.rstrip() for line in textwrap.dedent(text).splitlines())
    return hashlib.sha256("\n".join(line for line in lines if line).encode()).hexdigest()


def source_fingerprint(function: Callable[..., Any]) -> str:
    """`text_fingerprint` of `function`'s source (OSError or TypeError where it has none)."""
    import inspect

    return text_fingerprint(inspect.getsource(function))


def shebang_problem(interpreter: str | None = None) -> str | None:
    """Why a `#!` line cannot start `interpreter` (default: this one), or None: a kernel splits it at
    white space and may cut it after SHEBANG_LIMIT bytes."""
    path = sys.executable if interpreter is None else interpreter
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
