"""Flower source this project reproduces or runs outside Flower's entry points (used only while the
installed source has the recorded `text_fingerprint`), and the scripts that run it."""

from __future__ import annotations

import hashlib
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

SHEBANG_LIMIT = 127  # the longest `#!` line some kernels read whole (Linux before 5.1, a Jetson's L4T)


def text_fingerprint(text: str) -> str:
    """SHA-256 of Python source, dedented, trailing spaces and blank lines out (a changed comment counts)."""
    lines = (line.rstrip() for line in textwrap.dedent(text).splitlines())
    return hashlib.sha256("\n".join(line for line in lines if line).encode()).hexdigest()


def source_fingerprint(function: Callable[..., Any]) -> str:
    """`text_fingerprint` of `function`'s source (OSError or TypeError where it has none)."""
    import inspect

    return text_fingerprint(inspect.getsource(function))


def shebang_problem(interpreter: str | None = None) -> str | None:
    """Why a `#!` line cannot start `interpreter` (default: this one), or None."""
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
