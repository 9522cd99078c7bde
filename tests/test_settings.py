"""One settings declaration (strategies/settings.py): pyproject's table, the ServerApp's config, the train
instructions, the ClientApp's reads and the fleet file all follow it."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from fl_server.run_config import RunConfigError, ServerConfig, parse_server_config
from simulations.fleet import load_fleet_spec
from strategies import settings as declared
from strategies.fleet import NodeConfigError, load_fleet_file
from strategies.protocol import ProtocolError, TrainInstructions
from strategies.settings import BOTH, CLIENT, SETTINGS, client_setting, read_settings
from strategies.settings_derived import app_config_toml
from tests.fl_helpers import relation

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_table() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]


def test_pyprojects_table_is_the_declaration_key_for_key_in_order() -> None:
    table = _pyproject_table()
    assert list(table) == list(SETTINGS)
    assert table == {key: s.default for key, s in SETTINGS.items()}
    assert all(type(table[key]) is type(s.default) for key, s in SETTINGS.items())  # 4.0, not 4


def test_the_derived_table_is_what_pyproject_holds_and_every_default_passes_its_own_check() -> None:
    printed = app_config_toml()
    assert tomllib.loads(printed)["tool"]["flwr"]["app"]["config"] == _pyproject_table()
    assert printed in (ROOT / "pyproject.toml").read_text()  # the help lines too
    defaults = read_settings({})
    for s in SETTINGS.values():
        assert s.kind.to_config(getattr(defaults, s.attr)) == s.default, s.key


def test_every_instruction_setting_is_sent_and_read_back_by_its_run_config_key() -> None:
    cfg = read_settings({"model": "cnn-tiny", "lr-max": 0.01, "eval-max-samples": 77, "guard-window": 5})
    instr = TrainInstructions.for_run(
        cfg, num_classes=10, model_overrides={}, relation=relation(model=cfg.model)
    )
    record = instr.to_config()
    for s in SETTINGS.values():
        assert (s.key in record) == (s.readers == BOTH), s.key
    assert (record["lr-max"], record["eval-max-samples"], record["guard-window"]) == (0.01, 77, 5)
    assert TrainInstructions.from_config(record) == instr
    assert all("_" not in key for key in record)  # one key style in the messages: kebab-case


def test_a_changed_default_in_the_declaration_changes_it_everywhere(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    changed = {
        "eval-max-samples": 123,
        "client-data-seed": 9,
        "partitioning": "dirichlet",
        "lr-rule": "linear",
    }
    for key, value in changed.items():
        monkeypatch.setitem(SETTINGS, key, dataclasses.replace(SETTINGS[key], default=value))
    # the ServerApp's config
    cfg = parse_server_config({})
    assert (cfg.eval_max_samples, cfg.client_data_seed, cfg.partitioning, cfg.lr_rule) == (
        123,
        9,
        "dirichlet",
        "linear",
    )
    assert ServerConfig().eval_max_samples == 123
    # the train instructions: built from the config, and by default
    instr = TrainInstructions.for_run(
        cfg, num_classes=10, model_overrides={}, relation=relation(model=cfg.model)
    )
    assert instr.eval_max_samples == 123 and instr.lr_rule == "linear"
    plain = TrainInstructions(
        num_classes=10, model_overrides={}, relation_vector=relation(model=ServerConfig().model)
    )
    assert plain.eval_max_samples == 123 and plain.lr_rule == "linear"
    # what the ClientApp reads from its run config
    assert client_setting({}, "client-data-seed") == 9 and client_setting({}, "partitioning") == "dirichlet"
    # the fleet file reader
    fleet = tmp_path / "f.yaml"
    fleet.write_text("groups:\n  - {device: sim:jetson-nano}\ntask: {model: cnn-tiny}\n")
    spec = load_fleet_spec(fleet)
    run = spec.run_config(tmp_path / "out", ["ours"], tmp_path / "p")
    assert (run["eval-max-samples"], run["client-data-seed"], run["partitioning"], run["lr-rule"]) == (
        123,
        9,
        "dirichlet",
        "linear",
    )


def test_a_changed_check_in_the_declaration_changes_it_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    from powerctl.files.mapping import Integer

    s = SETTINGS["eval-max-samples"]
    monkeypatch.setitem(SETTINGS, s.key, dataclasses.replace(s, kind=Integer(200), default=300))
    with pytest.raises(RunConfigError, match="'eval-max-samples' must be an integer ≥ 200, got 100"):
        parse_server_config({"eval-max-samples": 100})
    record = dict(
        TrainInstructions(
            num_classes=10, model_overrides={}, relation_vector=relation(model=ServerConfig().model)
        ).to_config()
    )
    with pytest.raises(ProtocolError, match="'eval-max-samples' must be an integer ≥ 200, got 100"):
        TrainInstructions.from_config({**record, "eval-max-samples": 100})


def test_the_client_keys_are_checked_by_the_server_and_read_the_same_on_the_client() -> None:
    client_keys = [s.key for s in SETTINGS.values() if s.readers == CLIENT]
    assert {
        "fleet",
        "client-data",
        "partitioning",
        "dirichlet-alpha",
        "profile-cache",
        "inject-failures",
    } <= set(client_keys)
    for key, bad in (("partitioning", "skewed"), ("dirichlet-alpha", -1.0), ("client-data-seed", "two")):
        with pytest.raises(RunConfigError, match=f"run config: '{key}' must be"):
            parse_server_config({key: bad})
        with pytest.raises(NodeConfigError, match=f"run config: '{key}' must be"):
            client_setting({key: bad}, key, NodeConfigError)


def test_a_fleet_file_is_parsed_before_any_work_when_the_launcher_can_read_it(tmp_path: Path) -> None:
    bad = tmp_path / "fleet.yaml"
    bad.write_text("boards:\n  - {device: sim:jetson-tx2nx, power-cap-w: 0.5}\n")
    assert parse_server_config({"fleet": str(bad)}).fleet == str(bad)  # the ServerApp: it exists
    with pytest.raises(RunConfigError) as err:
        parse_server_config({"fleet": str(bad)}, load_fleet_file=load_fleet_file)
    assert str(err.value) == (
        f"run config: 'fleet': {bad}: boards[0]: 'power-cap-w': a cap of 0.5 W is below anything "
        "sim:jetson-tx2nx can run (its least power is 2.62 W): raise it, or give none"
    )


def test_typed_settings_are_what_the_run_config_says() -> None:
    cfg = read_settings({"batch-sizes": "64, 8,16", "methods": "oracle,ours", "relation-seeds": "3;1"})
    assert (
        cfg.batch_sizes == [8, 16, 64] and cfg.methods == ["oracle", "ours"] and cfg.relation_seeds == [3, 1]
    )
    assert declared.to_config(cfg)["batch-sizes"] == "8,16,64"
    assert declared.read_settings(declared.to_config(cfg)) == cfg


def test_code_reads_a_setting_by_its_attribute_and_a_results_config_by_the_declaration() -> None:
    from simulations.summary_figure import predicted_board_profile

    assert declared.key_of("client_data_seed") == "client-data-seed"
    assert client_setting({"client-data-seed": 7}, "client_data_seed") == 7
    assert client_setting({}, "batch_sizes") == [8, 16, 32, 64]  # the declared default, typed
    # results.json's config is read by the same declarations: a bad value is one line, not a ValueError
    with pytest.raises(declared.SettingsError, match=r"^run config: 'batch-sizes' must be .*got '8,x'$"):
        predicted_board_profile("jetson-nano", "cnn-tiny", {"batch-sizes": "8,x"})


def test_a_resumed_run_may_change_only_the_settings_declared_outside_its_fingerprint() -> None:
    from fl_server.resume import run_fingerprint

    outside = {key for key, s in SETTINGS.items() if not s.fingerprint}
    assert outside == {
        "num-server-rounds",
        "resume",
        "results-dir",
        "round-timeout",
        "rejoin-wait-s",
        "inject-server-stop-round",
        "server-device",
    }
    base = declared.to_config(ServerConfig())
    same = run_fingerprint(base, "w", {})
    assert run_fingerprint({**base, "num-server-rounds": 9, "server-device": "cpu"}, "w", {}) == same
    assert run_fingerprint({**base, "lr-max": 0.01}, "w", {}) != same


NOT_YET_READ_BY_ATTRIBUTE: frozenset[str] = frozenset()
"""Run config keys still spelled in a third non-test file while their readers move to attributes (none
now); this set only shrinks."""


def test_each_run_config_key_is_spelled_in_at_most_two_non_test_files() -> None:
    """The declaration and one place mapping another file's keys onto it (simulations/fleet.py): code
    names a setting by its attribute (`key_of`, `client_setting`), so a renamed key changes two files."""
    import ast

    keys = {key for key in SETTINGS if "-" in key}
    spelled: dict[str, set[str]] = {key: set() for key in keys}
    tops = ("powerfed", "powerctl", "strategies", "fl_server", "fl_client", "simulations")
    for path in (p for top in tops for p in sorted((ROOT / top).rglob("*.py"))):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and node.value in spelled:
                spelled[node.value].add(str(path.relative_to(ROOT)))
    spread = {key: sorted(files) for key, files in spelled.items() if len(files) > 2}
    assert set(spread) <= NOT_YET_READ_BY_ATTRIBUTE, spread
