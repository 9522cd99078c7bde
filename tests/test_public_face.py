"""`import powerfed`: the one public face. Every exported name resolves, importing it costs nothing
until a name is used (and `PowerAware` then loads no device code), and an unknown name is an
AttributeError as for any module."""

from __future__ import annotations

import subprocess
import sys

import pytest

import powerfed


def test_every_exported_name_resolves_to_what_its_module_defines() -> None:
    import importlib

    for name in powerfed.__all__:
        obj = getattr(powerfed, name)
        assert obj is getattr(importlib.import_module(powerfed._WHERE[name]), name)
        assert obj.__doc__, f"{name} has no docstring (docs/reference/api.md is made of them)"


def test_import_powerfed_loads_neither_torch_nor_flower() -> None:
    code = "import sys, powerfed; print(sorted(m for m in ('torch', 'flwr', 'ray') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


POWER_AWARE_NEEDS = {
    "powerctl",
    "powerctl.files",  # the rooms' package docstrings (nothing imported by them)
    "powerctl.cli",
    "powerctl.selection",
    "powerctl.records",
    "powerctl.errors",
    "powerctl.files.mapping",  # the argument checks
    "powerctl.files.readfile",
    "powerctl.files.jsonfile",
    "powerctl.files.outputs",
    "powerctl.cli.util",  # the settings' bounds
    "powerctl.selection.capsource",  # the power cap's reader
    "powerctl.records.pick",
    "powerctl.records.relation",  # the relation vector, its rules' names
    "powerctl.selection.methods",  # the registry's method and round objective names
    "powerctl.selection.names",
    "powerctl.selection.guard",  # the guard's and the cap follower's defaults (settings)
    "powerctl.selection.follow",
}
"""The device-side modules importing `PowerAware` may load: names, checks and the plan's readers; no
device, no profiler, no sensors (issue 39: it imported 22)."""


def test_importing_power_aware_loads_no_device_profiling_or_selection_code() -> None:
    code = (
        "import sys; from powerfed import PowerAware; "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'powerctl')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(out.split())
    assert "powerctl.selection.methods" in loaded and not loaded - POWER_AWARE_NEEDS, sorted(
        loaded - POWER_AWARE_NEEDS
    )


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        powerfed.nosuch  # noqa: B018


def test_a_user_model_registers_through_the_face() -> None:
    from torch import nn

    spec = powerfed.register_model(
        "face-test-cnn",
        lambda num_classes=10: nn.Sequential(nn.Flatten(), nn.Linear(16, num_classes)),
        input_shape=(1, 4, 4),
    )
    try:
        assert "face-test-cnn" in powerfed.model_names() and spec.name == "face-test-cnn"
    finally:
        powerfed.unregister_model("face-test-cnn")
    assert "face-test-cnn" not in powerfed.model_names()


def test_what_type_checkers_see_of_the_face_is_what_it_resolves() -> None:
    """`powerfed` resolves its names lazily (`_WHERE`); its `if TYPE_CHECKING:` block imports the same
    names from the same modules, so that mypy and editors see their types: the two lists stay one."""
    import ast
    from pathlib import Path

    tree = ast.parse(Path(powerfed.__file__).read_text(encoding="utf-8"))
    (block,) = [
        node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    seen = {
        alias.asname or alias.name: node.module
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert seen == powerfed._WHERE
