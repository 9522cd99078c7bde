"""Imports point one way: `bench`, `simulations` → `fl_server`, `fl_client` → `strategies` →
`powerfed.training` → `powerctl`. `powerctl` (the device side) imports no Flower and no training;
nothing outside `tests` imports `tests`. Read from every module's own import statements (ast), the
ones inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TRAINING = "powerfed.training"
LOWER = {
    "powerctl": set(),
    TRAINING: {"powerctl"},
    "strategies": {TRAINING, "powerctl"},
    "fl_server": {"strategies", TRAINING, "powerctl"},
    "fl_client": {"strategies", TRAINING, "powerctl"},
    "simulations": {"fl_server", "fl_client", "strategies", TRAINING, "powerctl"},
    "powerfed": {"fl_server", "fl_client", "strategies", TRAINING, "powerctl"},
    "bench": {"powerfed", "simulations", "fl_server", "fl_client", "strategies", TRAINING, "powerctl"},
}
"""What each part of the project may import of the others (bench may use what simulations builds; `powerfed`,
the public face, sits on top of the library and below nothing of ours but bench). The training core lives
under the project's name (`powerfed.training`) but is a layer of its own, below the face."""
FLOWER_FREE = {"powerctl", TRAINING}
OURS = {*LOWER, "tests"}


def part_of(dotted: str) -> str:
    """The part a dotted module name belongs to: `powerfed.training.x` is the training core, any other
    `powerfed...` the public face."""
    return TRAINING if (dotted + ".").startswith(TRAINING + ".") else dotted.split(".")[0]


def imported_parts(path: Path, part: str) -> dict[str, int]:
    """Top-level names `path` imports (relative imports are of its own part), with a line of each."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [part] if node.level else [node.module or ""]
        else:
            continue
        for name in names:
            found.setdefault(part_of(name), node.lineno)
    return found


def _modules() -> list[tuple[str, Path]]:
    paths = {path: part_of(".".join(path.relative_to(ROOT).parts)) for path in _python_files()}
    return [(part, path) for path, part in sorted(paths.items()) if part in LOWER]


def _python_files() -> list[Path]:
    tops = {part.split(".")[0] for part in LOWER}
    return [path for top in sorted(tops) for path in sorted((ROOT / top).rglob("*.py"))]


def test_every_part_is_found() -> None:
    counts = {part: sum(p == part for p, _ in _modules()) for part in LOWER}
    assert all(counts.values()), counts


@pytest.mark.parametrize(
    ("part", "path"), _modules(), ids=lambda v: str(v.relative_to(ROOT)) if isinstance(v, Path) else v
)
def test_imports_point_down(part: str, path: Path) -> None:
    imports = imported_parts(path, part)
    wrong = {
        name: line
        for name, line in imports.items()
        if (name in OURS and name != part and name not in LOWER[part])
        or (part in FLOWER_FREE and name == "flwr")
    }
    where = ", ".join(f"{path.relative_to(ROOT)}:{line} imports {name}" for name, line in wrong.items())
    assert not wrong, f"{where} (allowed for {part}: {sorted(LOWER[part]) or 'nothing of ours'})"


def test_the_check_catches_a_wrong_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import os\n\ndef f():\n    from powerfed.training.models import build_model\n    from . import x\n"
        "import powerfed\n"
    )
    assert imported_parts(module, "powerctl") == {"os": 1, TRAINING: 4, "powerctl": 5, "powerfed": 6}


LIBRARY = ("powerfed", "powerctl", "strategies", "fl_server", "fl_client")
"""The packages a user imports (simulations and bench are programs): they log, and what a command line
or an app writes as its own output goes through one helper, `powerctl.cli.util.say`."""


def prints_in(path: Path) -> list[int]:
    """The lines where `path` names the builtin `print` (a call, or `say=print` handed on)."""
    tree = ast.parse(path.read_text(), str(path))
    return [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "print"]


def test_library_code_never_prints() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for top in LIBRARY
        for path in sorted((ROOT / top).rglob("*.py"))
        for line in prints_in(path)
    ]
    assert not found, f"print in library code (log, or powerctl.cli.util.say for a command's output): {found}"


def test_the_print_check_sees_a_call_and_a_default(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f(say=print):\n    print('x')\n    say('y')\n\n# print('no')\n")
    assert prints_in(module) == [1, 2]


POWERCTL_ROOMS = ("cli", "profiling", "selection", "devices", "pinning", "records", "files")
"""powerctl's rooms from the top (its package docstring says what each holds): a room imports only
rooms after it here, and `errors`/`procs`, the ground (`__main__` is the command's entry)."""
GROUND = {"errors", "procs", "progress"}


def powerctl_room(dotted: str) -> str | None:
    """The room of a `powerctl.<room>...` module name; None outside powerctl."""
    parts = dotted.split(".")
    return parts[1] if parts[0] == "powerctl" and len(parts) > 1 else None


def room_imports(path: Path) -> dict[str, int]:
    """The powerctl rooms `path` imports (absolute imports: the house has none relative), a line of each."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        for name in names:
            if (room := powerctl_room(name)) is not None:
                found.setdefault(room, node.lineno)
    return found


def test_powerctl_rooms_are_the_listed_ones() -> None:
    rooms = {p.parent.name for p in (ROOT / "powerctl").glob("*/__init__.py")} - {"data"}  # data: boards.yaml
    top = {p.stem for p in (ROOT / "powerctl").glob("*.py")} - {"__init__", "__main__"}
    assert rooms == set(POWERCTL_ROOMS) and top == GROUND


def test_powerctl_rooms_import_only_rooms_below() -> None:
    wrong = []
    for room in POWERCTL_ROOMS:
        below = set(POWERCTL_ROOMS[POWERCTL_ROOMS.index(room) :]) | GROUND
        for path in sorted((ROOT / "powerctl" / room).rglob("*.py")):
            wrong += [
                f"{path.relative_to(ROOT)}:{line} imports powerctl.{name}"
                for name, line in room_imports(path).items()
                if name not in below
            ]
    for name in sorted(GROUND):
        path = ROOT / "powerctl" / f"{name}.py"
        wrong += [
            f"{path.relative_to(ROOT)}:{line} imports powerctl.{r}" for r, line in room_imports(path).items()
        ]
    assert not wrong, wrong


def test_the_room_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import json\n\ndef f():\n    from powerctl.cli.util import say\nimport powerctl.records.pick\n"
    )
    assert room_imports(module) == {"cli": 4, "records": 5}


MAX_FUNCTION_LINES = 100
MAX_PARAMETERS = 8
"""Issue 39: a function a reader can hold — at most 100 lines and 8 parameters (a config record counts
as one; `self`/`cls` do not)."""


def oversized(path: Path, root: Path = ROOT) -> list[str]:
    """`path`'s functions over MAX_FUNCTION_LINES lines or MAX_PARAMETERS parameters, as `file:Qual.name`."""
    found: list[str] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                names = [x.arg for x in (*a.posonlyargs, *a.args)]
                count = len(names) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
                count -= bool(names) and names[0] in ("self", "cls")
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                if lines > MAX_FUNCTION_LINES or count > MAX_PARAMETERS:
                    found.append(f"{path.relative_to(root)}:{prefix}{child.name}")
                walk(child, f"{prefix}{child.name}.")

    walk(ast.parse(path.read_text(), str(path)), "")
    return found


def test_no_function_is_longer_than_100_lines_or_takes_more_than_8_parameters() -> None:
    tops = ("powerfed", "powerctl", "strategies", "fl_server", "fl_client", "simulations", "bench")
    found = [name for top in tops for path in sorted((ROOT / top).rglob("*.py")) for name in oversized(path)]
    assert found == [], f"split these, or group their options in a record: {found}"


def test_the_size_check_counts_lines_and_parameters(tmp_path: Path) -> None:
    module = tmp_path / "probe.py"
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    module.write_text(
        "class C:\n    def m(self, a, b, c, d, e, f, g, h):\n        pass\n\n"
        "def wide(a, b, c, d, e, f, g, *h, i):\n    pass\n\n"
        f"def long():\n{body}\n"
    )
    assert oversized(module, tmp_path) == ["probe.py:wide", "probe.py:long"]


MAX_MODULE_LINES = 600
"""A module a reader can hold, with one job: at most 600 lines (`../shared/tools/house-figures` counts the
same way)."""
BEING_SPLIT = frozenset({"fl_client/round.py", "strategies/protocol.py"})
"""The modules still over MAX_MODULE_LINES while they are redesigned: one leaves this set when it is split,
none joins it."""


def long_modules(root: Path = ROOT) -> list[str]:
    """Every module of the parts over MAX_MODULE_LINES lines, but those in BEING_SPLIT, as `path: N lines`."""
    tops = ("powerfed", "powerctl", "strategies", "fl_server", "fl_client", "simulations", "bench")
    found = []
    for path in (p for top in tops for p in sorted((root / top).rglob("*.py"))):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        name = path.relative_to(root).as_posix()
        if lines > MAX_MODULE_LINES and name not in BEING_SPLIT:
            found.append(f"{name}: {lines} lines")
    return found


def test_no_module_is_longer_than_600_lines() -> None:
    found = long_modules()
    assert found == [], f"split these into modules with one job each (move the code, do not copy it): {found}"


def test_the_layout_page_draws_the_layers_these_tests_enforce() -> None:
    """docs/design/layout.md's arrow line and its list of powerctl's rooms are the orders checked above."""
    import re

    lines = (ROOT / "docs" / "design" / "layout.md").read_text(encoding="utf-8").splitlines()
    arrow = next(line for line in lines if "→" in line and "powerctl" in line)
    tiers = [{name.strip() for name in tier.split(",")} for tier in arrow.split("→")]
    assert set().union(*tiers) == set(LOWER)
    for i, tier in enumerate(tiers):
        below = set().union(*tiers[i + 1 :])
        for part in tier:  # everything below it, and nothing above it
            assert below <= LOWER[part] <= below | tier, part
    start = next(i for i, line in enumerate(lines) if line.startswith("    powerctl/"))
    end = next(i for i in range(start + 1, len(lines)) if re.match(r"    \S", lines[i]))
    rooms = [m[1] for line in lines[start + 1 : end] if (m := re.match(r"      (\w+)/", line))]
    assert tuple(rooms) == POWERCTL_ROOMS
