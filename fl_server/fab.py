"""The app folder `flwr run` packs, staged small: `flwr run APP` walks every file under APP before
filtering by `fab-include` (a venv's tens of thousands); a copy of the top-level names `fab-include` can
match gives the same FAB."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

ROOT_FILES = ("pyproject.toml", ".gitignore", "LICENSE", "LICENSE.md")  # read or packed whatever the include
PLAIN_NAME = re.compile(r"[A-Za-z0-9_.-]+")


def fab_roots(app_dir: Path) -> list[str] | None:
    """The top-level names `fab-include` can match; None when it is absent or a pattern starts with a
    wildcard (then only Flower's own walk knows)."""
    try:
        config = tomllib.loads((app_dir / "pyproject.toml").read_text(encoding="utf-8"))
        include = config["tool"]["flwr"]["app"]["fab-include"]
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError):
        return None
    if not isinstance(include, list) or not include:
        return None
    roots = [str(p).lstrip("/").split("/", 1)[0] for p in include]
    if not all(PLAIN_NAME.fullmatch(r) and r not in (".", "..") for r in roots):
        return None
    return sorted(set(roots))


def staged_app(app_dir: Path, into: Path) -> Path:
    """`into` holding a copy of what `app_dir`'s FAB can hold (links kept: Flower skips them), or `app_dir`
    itself when its `fab-include` does not say."""
    roots = fab_roots(app_dir)
    if roots is None:
        return app_dir
    into.mkdir(parents=True, exist_ok=False)
    for name in (*ROOT_FILES, *roots):
        source = app_dir / name
        if source.is_symlink() or not source.exists():
            continue
        if source.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(source, into / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(source, into / name)
    return into
