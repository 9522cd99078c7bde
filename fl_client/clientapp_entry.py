"""A lighter `flwr-clientapp` for a deployed SuperNode's per-message processes: Flower's own
`flwr_clientapp.py` run as the script itself, without the package its console script imports first
(docs/results/clientapp_startup.md), only while that file's text is the one checked here."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from strategies.flower_source import shebang_problem, text_fingerprint, write_python_script

log = logging.getLogger(__name__)

COMMAND = "flwr-clientapp"  # what Flower's SuperExec starts for each ClientApp message
FLOWER_FILE = ("supernode", "cli", "flwr_clientapp.py")  # in the installed `flwr` package
# FLOWER_FILE's text as `text_fingerprint` normalises it, read and found to import nothing of its package
FLWR_CLIENTAPP_SHA256 = "e23a68d4dc23949e498c74b1661b7c53358492a3bc9c606af4485e8859a6283b"
# what Flower's console script does with the same function
TRAILER = '\n\nif __name__ == "__main__":\n    import sys\n\n    sys.exit(flwr_clientapp())\n'


def flower_source() -> tuple[Path, str | None]:
    """The installed Flower's `flwr_clientapp.py` and its text (None: none), found without importing it."""
    from importlib.util import find_spec

    spec = find_spec("flwr")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    path = Path(folders[0] if folders else "flwr").joinpath(*FLOWER_FILE)
    try:
        return path, path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return path, None


def write_script(folder: Path) -> Path | None:
    """FOLDER/flwr-clientapp running the installed Flower's `flwr_clientapp.py` text, or None (and one
    logged line) where that is not the text checked here or the script could not run from FOLDER."""
    path, text = flower_source()
    if text is None:
        reason: str | None = f"there is no {path} to read"
    elif text_fingerprint(text) != FLWR_CLIENTAPP_SHA256:
        reason = f"{path} is not the source fl_client.clientapp_entry was checked against"
    else:
        reason = shebang_problem()
        if reason is None and os.statvfs(folder).f_flag & getattr(os, "ST_NOEXEC", 0):  # Linux; 0 elsewhere
            reason = f"{folder} is on a file system mounted noexec (set TMPDIR to another)"
    if reason is not None or text is None:
        log.warning("each message's flwr-clientapp is Flower's own: %s", reason)
        return None
    header = f"# Flower's {path}, run without its package (written by fl_client.clientapp_entry)\n"
    return write_python_script(folder / COMMAND, header + text.rstrip("\n") + TRAILER)


@contextlib.contextmanager
def light_clientapp() -> Iterator[Path | None]:
    """A temporary folder holding the light `flwr-clientapp` (None: Flower's own is used)."""
    with contextlib.ExitStack() as stack:
        try:
            temporary = tempfile.TemporaryDirectory(prefix="powerfed-clientapp-", ignore_cleanup_errors=True)
            folder = Path(stack.enter_context(temporary))
            script = write_script(folder)
        except OSError as exc:  # no temporary folder, or none it can write in
            log.warning("each message's flwr-clientapp is Flower's own: cannot write it (%s)", exc)
            script = None
        yield None if script is None else folder
