"""A setting is declared once, as the field of its group (`strategies.settings.setting_field`): its key is
the field's name in kebab-case, who reads it is the group it is declared in, its default is read when an
object is made, and a field whose type is not its kind's is refused where it is declared, in one line that
says what to write."""

from __future__ import annotations

import dataclasses

import pytest

from powerctl.files.mapping import Integer, Number
from strategies.protocol import TrainInstructions
from strategies.settings import (
    BOTH,
    CLIENT,
    SERVER,
    SETTING_METADATA,
    SETTINGS,
    ClientSettings,
    RunSettings,
    SentSettings,
    SettingsError,
    _declare,
    setting_field,
    settings_of,
)


def test_who_reads_a_setting_is_the_group_it_is_declared_in() -> None:
    assert (SETTINGS["lr-max"].readers, SETTINGS["fleet"].readers, SETTINGS["weights"].readers) == (
        BOTH,
        CLIENT,
        SERVER,
    )
    sent = [f.name for f in dataclasses.fields(SentSettings)]
    assert sent == [s.attr for s in settings_of([BOTH])]
    assert [f.name for f in dataclasses.fields(ClientSettings)] == [s.attr for s in settings_of([CLIENT])]
    assert list(SETTINGS) == [f.name.replace("_", "-") for f in dataclasses.fields(RunSettings)]
    # the instructions carry the sent group: every sent setting, as an attribute, at its default
    plan_fields = {f.name for f in dataclasses.fields(TrainInstructions)}
    assert set(sent) <= plan_fields and not plan_fields & {s.attr for s in settings_of([SERVER, CLIENT])}


@pytest.mark.parametrize("cls", [RunSettings, TrainInstructions], ids=lambda c: c.__name__)
def test_each_setting_field_defaults_to_the_declaration_and_is_keyword_only(cls: type) -> None:
    for f in dataclasses.fields(cls):
        if SETTING_METADATA in f.metadata:
            key = f.name.replace("_", "-")
            assert f.kw_only and f.default is dataclasses.MISSING, key  # read when an object is made
            assert f.default_factory() == SETTINGS[key].typed_default(), key
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_a_field_of_the_wrong_type_is_refused_with_the_line_to_write() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Wrong:
        lr_max: int = setting_field("task", 0.002, Number(0.0, above=True), "A rate.")

    with pytest.raises(
        SettingsError, match=r"setting 'lr-max' is declared as lr_max: int; write lr_max: float$"
    ):
        _declare(Wrong, {Wrong: SERVER})


def test_an_integer_without_a_ceiling_is_refused() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Wrong:
        rounds: int = setting_field("rounds", 2, Integer(1), "Rounds.")

    with pytest.raises(SettingsError, match=r"setting 'rounds' is an integer without a maximum$"):
        _declare(Wrong, {Wrong: SERVER})


def test_a_declared_setting_is_read_by_its_group_under_its_name_in_kebab_case() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Sent:
        warm_up_seed: int = setting_field("rounds", 3, Integer(0, 9), "A seed.")

    declared = _declare(Sent, {Sent: BOTH})
    assert list(declared) == ["warm-up-seed"]
    assert declared["warm-up-seed"].readers == BOTH and declared["warm-up-seed"].typed_default() == 3
    assert (declared["warm-up-seed"].attr, declared["warm-up-seed"].group) == ("warm_up_seed", "rounds")
