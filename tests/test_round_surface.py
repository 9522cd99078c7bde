"""The client round has a public surface (issue 39): what the project's other modules import of
`fl_client.round` is listed in its `__all__`, and none of it starts with an underscore. Read from every
module's own import statements (ast), the ones inside functions too, as `tests/test_layers.py` does;
the tests themselves may reach inside."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.test_layers import ROOT, _python_files

SURFACES = ("fl_client.round",)
"""Modules whose use from elsewhere goes through their `__all__`."""


def uses_of(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, name) for every name `path` takes from `module`: `from module import name`, and
    `alias.name` where `module` was imported as `alias` (`import a.b as alias`, `from a import b`)."""
    parent, _, leaf = module.rpartition(".")
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == module:
                found += [(node.lineno, alias.name) for alias in node.names]
            elif node.module == parent:
                aliases |= {alias.asname or alias.name for alias in node.names if alias.name == leaf}
        elif isinstance(node, ast.Import):
            aliases |= {alias.asname for alias in node.names if alias.name == module and alias.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.append((node.lineno, node.attr))
    return found


def _outside(module: str) -> list[Path]:
    own = ROOT / (module.replace(".", "/") + ".py")
    return [path for path in _python_files() if path != own]


@pytest.mark.parametrize("module", SURFACES)
def test_what_others_import_is_public_and_listed(module: str) -> None:
    listed = set(importlib.import_module(module).__all__)
    wrong = [
        f"{path.relative_to(ROOT)}:{line} uses {module}.{name}"
        + (" (private)" if name.startswith("_") else " (not in __all__)")
        for path in _outside(module)
        for line, name in uses_of(path, module)
        if name.startswith("_") or name not in listed
    ]
    assert not wrong, "; ".join(wrong)


@pytest.mark.parametrize("module", SURFACES)
def test_the_listed_surface_exists_and_is_public(module: str) -> None:
    mod = importlib.import_module(module)
    assert all(not name.startswith("_") and hasattr(mod, name) for name in mod.__all__), mod.__all__
    assert len(set(mod.__all__)) == len(mod.__all__)


def test_the_check_catches_a_private_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from fl_client.round import run_round, _x\n"
        "import fl_client.round as r\n"
        "from fl_client import round as cr\n\n"
        "def f():\n    return r._y, cr.train_round\n"
    )
    assert sorted(uses_of(module, "fl_client.round")) == [
        (1, "_x"),
        (1, "run_round"),
        (6, "_y"),
        (6, "train_round"),
    ]
