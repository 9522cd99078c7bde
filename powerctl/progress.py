"""The one progress bar of the library: the profiler's, the fine-tune's and the relation runs'."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

Say = Callable[[str], None]
"""Hears a progress line (a ServerApp's log, a command's stderr)."""


def progress_bar(progress: bool, total: int | None, desc: str, unit: str, initial: int = 0) -> Any:
    """A tqdm bar on stderr, drawn only when asked for and stderr is a terminal (else disabled)."""
    from tqdm import tqdm

    shown = progress and sys.stderr.isatty()
    return tqdm(
        total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, leave=False, disable=not shown
    )
