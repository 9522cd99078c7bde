"""The oldest Python the project declares (pyproject's requires-python) is one its dependencies install on,
the one its checkers read, and one its module entry points run on.

`make test-torch-floor` runs this file in the floor's venv, built with that Python (FLOOR_PYTHON).
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def declared_floor() -> str:
    """X.Y of requires-python's `>=X.Y`."""
    found = re.fullmatch(r">=\s*(\d+\.\d+)", PYPROJECT["project"]["requires-python"].strip())
    assert found, PYPROJECT["project"]["requires-python"]
    return found.group(1)


def test_every_dependency_installs_on_the_declared_floor() -> None:
    """pip refuses a distribution whose Requires-Python excludes the interpreter: a floor below a
    dependency's (Flower 1.41-1.42 declare >=3.11) is a promise no install keeps."""
    floor = declared_floor()
    refusing = []
    for line in PYPROJECT["project"]["dependencies"]:
        name = Requirement(line).name
        needs = importlib.metadata.metadata(name).get("Requires-Python") or ""
        if not SpecifierSet(needs).contains(floor, prereleases=True):
            refusing.append(f"{name} needs Python {needs}")
    assert not refusing, f"requires-python >={floor}, but {refusing}"


def test_the_checkers_read_the_declared_floor() -> None:
    """mypy types and ruff lints as the oldest Python the project runs on."""
    floor = declared_floor()
    assert PYPROJECT["tool"]["mypy"]["python_version"] == floor
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py" + floor.replace(".", "")


def test_the_module_entry_points_run(tmp_path: Path) -> None:
    """`python -m fl_server.supervise` and `python -m simulations run` start on this interpreter: the
    supervisor prints its usage, the fleet runner refuses a broken fleet file in one line."""
    supervise = subprocess.run(
        [sys.executable, "-m", "fl_server.supervise", "--help"], capture_output=True, text=True, timeout=120
    )
    assert supervise.returncode == 0, supervise.stderr
    assert supervise.stdout.startswith("usage: python -m fl_server.supervise")
    bad = tmp_path / "fleet.yaml"
    bad.write_text("boards: [a fleet\n", encoding="utf-8")
    fleet = subprocess.run(
        [sys.executable, "-m", "simulations", "run", str(bad)], capture_output=True, text=True, timeout=120
    )
    assert fleet.returncode == 2, fleet.stderr
    assert fleet.stderr.strip().splitlines() == [
        f"python -m simulations: error: {bad}: not valid YAML (while parsing a flow sequence)"
    ]
