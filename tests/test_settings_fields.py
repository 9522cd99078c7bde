"""The settings fields written out in class bodies (`setting_field`) are exactly the declaration's: a
setting declared without its field, a field without its declaration, a misspelt name or a wrong type
each fail here in one line that says what to write."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest

from powerctl.files.mapping import Distinct
from strategies.protocol import TrainInstructions
from strategies.settings import (
    BOTH,
    READERS,
    SETTING_METADATA,
    SETTINGS,
    RunSettings,
    Setting,
    SettingsError,
    run_default,
    setting_field,
    settings_of,
)

CLASSES: dict[type, tuple[str, ...]] = {RunSettings: READERS, TrainInstructions: (BOTH,)}
"""Each class whose fields include run settings, and the readers whose settings it carries."""
ROOT = Path(__file__).resolve().parents[1]


def _type_of(s: Setting) -> str:
    """The annotation a setting's field must have: its kind's Python type (a list's items' too)."""
    if isinstance(s.kind, Distinct):
        return f"list[{s.kind.item.python_type.__name__}]"
    return s.kind.python_type.__name__


def _annotation(hint: Any) -> str:
    args = typing.get_args(hint)
    origin = typing.get_origin(hint) or hint
    return f"{origin.__name__}[{', '.join(a.__name__ for a in args)}]" if args else origin.__name__


def field_mismatches(cls: type, readers: tuple[str, ...]) -> list[str]:
    """What differs between `cls`'s setting fields and the settings `readers` read, each as the line to
    write (or remove) in the class body; empty: they agree, in the declaration's order."""
    hints = typing.get_type_hints(cls)
    fields = {
        f.metadata[SETTING_METADATA]: f for f in dataclasses.fields(cls) if SETTING_METADATA in f.metadata
    }
    wanted = settings_of(readers)
    where = f"{cls.__module__}.{cls.__qualname__}"
    out = []
    for s in wanted:
        line = f'{s.attr}: {_type_of(s)} = setting_field("{s.key}")'
        f = fields.get(s.key)
        if f is None:
            out.append(f"{where} lacks the field of setting {s.key!r} (readers {s.readers}): add `{line}`")
        elif f.name != s.attr or _annotation(hints[f.name]) != _type_of(s):
            out.append(f"{where}.{f.name}: {_annotation(hints[f.name])} is setting {s.key!r}: write `{line}`")
    for key, f in fields.items():
        if key not in {s.key for s in wanted}:
            out.append(
                f"{where}.{f.name} is setting {key!r}, which its readers ({', '.join(readers)}) do not read "
                f"(readers {SETTINGS[key].readers}): remove it or change the declaration"
            )
    if not out and list(fields) != [s.key for s in wanted]:
        out.append(f"{where}'s setting fields are not in the declaration's order: {[s.key for s in wanted]}")
    return out


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_each_class_writes_out_exactly_the_settings_its_readers_read(cls: type) -> None:
    problems = field_mismatches(cls, CLASSES[cls])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_each_setting_field_defaults_to_the_declaration_and_is_keyword_only(cls: type) -> None:
    for f in dataclasses.fields(cls):
        if SETTING_METADATA in f.metadata:
            key = f.metadata[SETTING_METADATA]
            assert f.kw_only and f.default is dataclasses.MISSING, key  # a default written twice is none
            assert f.default_factory() == run_default(key), key
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_every_class_with_setting_fields_is_checked_here() -> None:
    """A new class that writes out setting fields must say whose settings it carries (`CLASSES`)."""
    found = set()
    tops = [d for d in ROOT.iterdir() if d.is_dir() and d.name[0] not in "._" and d.name != "tests"]
    for path in (p for top in tops for p in top.rglob("*.py")):
        if "setting_field(" not in path.read_text(errors="replace"):
            continue
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                isinstance(a, ast.AnnAssign)
                and isinstance(a.value, ast.Call)
                and getattr(a.value.func, "id", getattr(a.value.func, "attr", "")) == "setting_field"
                for a in node.body
            ):
                found.add(f"{module}.{node.name}")
    assert found == {f"{c.__module__}.{c.__qualname__}" for c in CLASSES}


def test_a_setting_declared_without_its_field_is_named_with_the_line_to_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    new = Setting("lr-min", 0.0001, SETTINGS["lr-max"].kind, "A floor.", BOTH, group="task")
    monkeypatch.setitem(SETTINGS, new.key, new)
    assert field_mismatches(TrainInstructions, (BOTH,)) == [
        "strategies.protocol.TrainInstructions lacks the field of setting 'lr-min' (readers both): add "
        '`lr_min: float = setting_field("lr-min")`'
    ]


def test_a_field_whose_setting_is_not_sent_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(SETTINGS, "seed", dataclasses.replace(SETTINGS["seed"], readers="server"))
    assert field_mismatches(TrainInstructions, (BOTH,)) == [
        "strategies.protocol.TrainInstructions.seed is setting 'seed', which its readers (both) do not "
        "read (readers server): remove it or change the declaration"
    ]


def test_a_field_of_no_declared_setting_is_refused_where_it_is_written() -> None:
    with pytest.raises(SettingsError, match=r"setting_field: unknown key 'lr-mx'; did you mean 'lr-max'\?"):
        setting_field("lr-mx")


def test_a_wrong_type_is_named_with_the_line_to_write() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Wrong:
        lr_max: int = setting_field("lr-max")

    assert field_mismatches(Wrong, ("nobody",)) == [
        f"{__name__}.{Wrong.__qualname__}.lr_max is setting 'lr-max', which its readers (nobody) do not "
        "read (readers both): remove it or change the declaration"
    ]
    write = 'write `lr_max: float = setting_field("lr-max")`'
    wrong = f"{__name__}.{Wrong.__qualname__}.lr_max: int is setting 'lr-max': {write}"
    assert wrong in field_mismatches(Wrong, (BOTH,))
