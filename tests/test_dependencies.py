"""Every distribution the packages import is one pyproject.toml declares: an import that works only
because another dependency happens to pull it in breaks when that one stops."""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("powerctl", "powerfed", "strategies", "fl_server", "fl_client", "simulations")


def imported_top_levels() -> dict[str, str]:
    """Top-level module → the first file importing it, for every absolute import in the packages
    (those inside functions included)."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    return found


def declared() -> set[str]:
    """The distributions [project].dependencies names, and those their named extras add
    (`flwr[simulation]`: ray)."""
    names: set[str] = set()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for line in project["dependencies"]:
        req = Requirement(line)
        names.add(canonicalize_name(req.name))
        for extra in req.extras:
            for sub in importlib.metadata.requires(req.name) or []:
                sub_req = Requirement(sub)
                if sub_req.marker is not None and sub_req.marker.evaluate({"extra": extra}):
                    names.add(canonicalize_name(sub_req.name))
    return names


def test_every_imported_distribution_is_declared() -> None:
    """The standard library, the project's own packages and typeshed's (type checking only) aside."""
    own = set(PACKAGES)
    dists = importlib.metadata.packages_distributions()
    allowed = declared()
    missing = []
    for module, where in sorted(imported_top_levels().items()):
        if module in own or module in sys.stdlib_module_names or module in ("__future__", "_typeshed"):
            continue
        owners = {canonicalize_name(d) for d in dists.get(module, [])}
        if not owners & allowed:
            missing.append(f"{module} ({where}; from {sorted(owners) or 'no installed distribution'})")
    assert not missing, f"imported, not in pyproject's dependencies: {missing}"
