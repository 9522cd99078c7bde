"""Numbers without bounds (issue 28): every numeric flag of `powerctl` and `fl-server`, and every model
size option (`--set KEY=VALUE`), has a range its help names; a value outside it, an empty power cap, or a
model too large to allocate is one line and exit status 2 before any work, with nothing written."""

from __future__ import annotations

import argparse
import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import powerfed.training.models as models
from fl_server.cli import build_parser as fl_server_parser
from fl_server.cli import main as fl_server_main
from powerctl.cli.commands import build_parser as powerctl_parser
from powerctl.cli.util import Bounded, bounded_float, bounded_int, power_cap
from powerctl.files.mapping import Integer, Number, bounds_text
from powerfed.training.errors import ModelError
from powerfed.training.models import MAX_PARAMETERS, OPTION_MAXIMUM, build_model, check_size, model_names
from powerfed.training.powerctl_cli import main as powerctl_main

EXAMPLE_RELATION = Path(__file__).resolve().parents[1] / "docs" / "examples" / "relation-cnn-tiny.json"
PROFILE = ["profile", "--device", "sim:jetson-nano", "--model", "cnn-tiny", "--batch-sizes", "4", "--quiet"]
PRETRAIN = ["pretrain", "--model", "cnn-tiny", "--data", "synthetic-image", "--no-progress"]


def _one_line(capsys: pytest.CaptureFixture[str], prog: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(prog), err
    return err


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiling or training is a failure: these inputs must be refused before either starts."""
    import fl_server.pretrain
    import powerctl.profiling.profiler

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("worked before the input was checked")

    monkeypatch.setattr(powerctl.profiling.profiler.Profiler, "run", refuse)
    monkeypatch.setattr(fl_server.pretrain, "fine_tune", refuse)


# --- the flag types --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flag", "text", "message"),
    [
        (bounded_int(1, 10**9), "100000000000000000000000", "expected an integer in [1, 1000000000]"),
        (bounded_int(1, 10**9), "1e23", "expected an integer in [1, 1000000000], got '1e23'"),
        (bounded_int(1, 10**9), "9" * 5000, "expected an integer in [1, 1000000000]"),  # past int()'s digits
        (bounded_int(2, 100), "1", "expected an integer in [2, 100], got '1'"),
        (bounded_int(0, 5), "-1", "expected an integer in [0, 5], got '-1'"),
        (bounded_float(0.0, 1000.0), "1e9", "expected a number in (0, 1000], got '1e9'"),
        (bounded_float(0.0, 1000.0), "nan", "expected a number in (0, 1000], got 'nan'"),
        (bounded_float(0.0, 1000.0), "-inf", "expected a number in (0, 1000], got '-inf'"),
        (bounded_float(0.001, 10.0, above=False), "1e-320", "expected a number in [0.001, 10], got '1e-320'"),
    ],
)
def test_a_bounded_flag_type_refuses_with_its_range(flag: Bounded, text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        flag(text)
    assert str(refused.value).startswith(message), refused.value


def test_a_bounded_flag_type_takes_its_bounds_and_words_them_for_the_help() -> None:
    assert bounded_int(1, 10**9)("1000000000") == 10**9
    assert bounded_float(0.0, 1000.0)("1000") == 1000.0
    assert bounded_int(1, 10**9).range == "in [1, 1000000000]"  # not 1e+09
    parser = argparse.ArgumentParser()
    bounded_float(0.0, 1000.0).add(parser, "--rate", "rate in Hz (default 50)")
    assert parser._actions[-1].help == "rate in Hz (default 50; in (0, 1000])"
    assert bounds_text(Number(0.0, 1.0, below=True)) == "in [0, 1)"
    assert bounds_text(Integer(2)) == "≥ 2"


@pytest.mark.parametrize("text", ["", "  "])
def test_an_empty_power_cap_is_not_taken_as_none(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"^empty; give watts or leave the flag out$"):
        power_cap(text)
    assert power_cap("none") is None and power_cap("3.5") == 3.5


def _numeric_actions(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(f"{name} {flag}", a) for flag, a in _numeric_actions(sub)]
        elif action.type in (int, float) or isinstance(action.type, Bounded):
            found.append((action.option_strings[0] if action.option_strings else action.dest, action))
    return found


@pytest.mark.parametrize("parser", [powerctl_parser, fl_server_parser], ids=["powerctl", "fl-server"])
def test_every_numeric_flag_has_a_range_its_help_names(parser: object) -> None:
    actions = _numeric_actions(parser())  # type: ignore[operator]
    assert len(actions) >= 8
    for name, action in actions:
        assert isinstance(action.type, Bounded), f"{name}: a bare {action.type} has no range"
        assert action.help and action.type.range in action.help, f"{name}: help {action.help!r}"


# --- powerctl --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--samples", "100000000000000000000000"], "--samples: expected an integer in [1, 1000000000]"),
        (["--rate", "1e9"], "--rate: expected a number in (0, 1000], got '1e9'"),
        (["--num-classes", "1"], "--num-classes: expected an integer in [2, 100000], got '1'"),
        (["--num-classes", "1000000000"], "--num-classes: expected an integer in [2, 100000]"),
        (["--warmup", "1000000"], "--warmup: expected an integer in [0, 1000]"),
        (["--steps", "1000000"], "--steps: expected an integer in [1, 1000]"),
        (["--seed", str(2**64)], "--seed: expected an integer in [0, 4294967295]"),
        (["--order", "efficient", "--power-cap", ""], "--power-cap: empty; give watts or leave the flag out"),
        (["--samples=--"], "argument --samples: expected a value, got '--'"),
    ],
)
def test_profile_numbers_out_of_range_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_work: None, extra: list[str], fragment: str
) -> None:
    assert powerctl_main([*PROFILE, "--out", str(tmp_path / "p.json"), *extra]) == 2
    assert fragment in _one_line(capsys, "powerctl profile")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["select", "pareto"])
def test_an_empty_power_cap_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    argv = [command, "--profile", "p.json", "--relation", str(EXAMPLE_RELATION), "--power-cap", ""]
    argv += ["--out", str(tmp_path / "out")] if command == "pareto" else []
    assert powerctl_main(argv) == 2
    assert "argument --power-cap: empty; give watts or leave the flag out" in _one_line(capsys, "powerctl")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--every", "1e-320"], "--every: expected a number in [0.001, 1000000000]"),
        (["--until", "1e300"], "--until: expected a number in (0, 1000000000]"),
    ],
)
def test_cap_source_spans_out_of_range_are_one_line(
    capsys: pytest.CaptureFixture[str], extra: list[str], fragment: str
) -> None:
    assert powerctl_main(["cap-source", "5", *extra]) == 2
    assert fragment in _one_line(capsys, "powerctl cap-source")


def test_a_frequency_beyond_any_gpu_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert powerctl_main(["freq", "--device", "sim:jetson-nano", "--set", "1e30"]) == 2
    assert "frequency must be > 0 and at most 100 GHz" in _one_line(capsys, "powerctl freq")


# --- fl-server pretrain and the model sizes ----------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (
            ["--epochs", "0.001"],
            "epochs 0.001 of the 4000-sample train split is 4 samples, less than one batch",
        ),
        (["--epochs", "1e9"], "--epochs: expected a number in (0, 1000]"),
        (["--samples", "1e23"], "--samples: expected an integer in [1, 1000000000], got '1e23'"),
        (["--lr", "1e9"], "--lr: expected a number in (0, 10]"),
        (["--batch-size", "100000000"], "--batch-size: expected an integer in [1, 65536]"),
        (["--threads", "1000000"], "--threads: expected an integer in [1, 1024]"),
        (["--seq-len", "100000000"], "--seq-len: expected an integer in [1, 16384]"),
        (
            ["--set", "width=100000"],
            "model 'cnn-tiny' option width must be an integer in [1, 4096], got 100000",
        ),
        (
            ["--model", "resnet18", "--set", "width=4000"],
            "model 'resnet18' with width=4000 would have 43,585,028,010 parameters, more than the "
            f"{MAX_PARAMETERS:,} a board can train: lower width",
        ),
        (
            [
                *("--model", "chartransformer", "--data", "synthetic-text"),
                *("--set", "seq_len=16384", "--set", "n_embd=1024", "--set", "n_layer=8"),
            ],
            "layer outputs per sample (8.8 GiB), more than 268,435,456: lower seq_len, n_embd, n_layer",
        ),
        (["--set", "width=true"], "option width must be an integer in [1, 4096], got True"),
    ],
)
def test_pretrain_numbers_out_of_range_are_one_line_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_work: None, extra: list[str], fragment: str
) -> None:
    argv = [*PRETRAIN, "--out", str(tmp_path / "w.safetensors"), *extra]
    if "--epochs" not in extra and "--samples" not in extra:
        argv += ["--samples", "64"]
    assert fl_server_main(argv) == 2
    assert fragment in _one_line(capsys, "fl-server")
    assert list(tmp_path.iterdir()) == []


def test_every_model_option_has_a_maximum_and_the_set_help_names_it() -> None:
    options = {k for name in model_names() for k in models.get_model_spec(name).options()}
    assert options - {"dropout"} == set(OPTION_MAXIMUM)
    pretrain = next(
        a for a in fl_server_parser()._actions if isinstance(a, argparse._SubParsersAction)
    ).choices["pretrain"]
    help_text = next(a.help for a in pretrain._actions if a.dest == "overrides")
    assert help_text is not None
    for key, top in OPTION_MAXIMUM.items():
        assert f"{key} in " in help_text and f"{top:g}" in help_text
    assert f"{MAX_PARAMETERS:,} parameters" in help_text


def test_a_model_too_large_is_refused_before_anything_is_allocated(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    built_on: list[str] = []

    def watching(builder: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(builder)  # its signature: the model's options
        def watched(**kwargs: Any) -> Any:
            built_on.append(torch.empty(0).device.type)  # where a tensor made now would live
            return builder(**kwargs)

        return watched

    for name in ("resnet18", "chartransformer-small"):
        spec = models.get_model_spec(name)
        monkeypatch.setitem(models._REGISTRY, name, dataclasses.replace(spec, builder=watching(spec.builder)))
    with pytest.raises(ModelError, match=r"would have [\d,]+ parameters, more than .*: use fewer classes"):
        build_model("resnet18", 10**9)  # 512 × 10⁹ weights in its head: torch would ask for 2 TB
    with pytest.raises(ModelError, match=r"option n_layer must be an integer in \[1, 256\]"):
        build_model("chartransformer-small", n_layer=10**9)  # refused before a billion modules are made
    assert built_on == ["meta"]  # counted on the meta device, never built for real


def test_an_allocation_failure_the_count_missed_is_one_model_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def out_of_memory(**_: object) -> None:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:114] DefaultCPUAllocator: can't allocate memory")

    spec = models.get_model_spec("cnn-tiny")
    monkeypatch.setitem(models._REGISTRY, "cnn-tiny", dataclasses.replace(spec, builder=out_of_memory))
    with pytest.raises(ModelError, match="not enough memory to build it: lower its size options"):
        build_model("cnn-tiny")

    def broken(**_: object) -> None:
        raise RuntimeError("a bug, not a lack of memory")

    monkeypatch.setitem(models._REGISTRY, "cnn-tiny", dataclasses.replace(spec, builder=broken))
    with pytest.raises(RuntimeError, match="a bug"):
        build_model("cnn-tiny")


def test_models_within_bounds_still_build() -> None:
    for name in model_names():
        check_size(name)
    model = build_model("chartransformer-small", n_embd=32, n_layer=3, seq_len=128)
    assert sum(p.numel() for p in model.parameters()) < MAX_PARAMETERS
    check_size("cnn-tiny", 1000, {"width": 64})


# --- garbage in, one line out --------------------------------------------------------------------------

GARBAGE = st.one_of(
    st.text(max_size=30),
    st.integers().map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "-0", "1e400", "0x10", "１２", "nan", "1_000", "9" * 5000, "--", "-1e-320"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    flag=st.sampled_from(["--power-cap", "--objective", "--relation-rule"]),
    value=GARBAGE,
)
def test_select_never_shows_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, value: str
) -> None:
    argv = ["select", "--profile", str(tmp_path / "none.json"), "--relation", str(EXAMPLE_RELATION)]
    assert powerctl_main([*argv, f"{flag}={value}"]) == 2  # the profile is missing: 2 whatever the flag
    _one_line(capsys, "powerctl")


class _Trained(Exception):
    pass


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    flag=st.sampled_from(
        [
            *("--samples", "--epochs", "--batch-size", "--lr", "--eval-max-samples", "--seq-len"),
            *("--limit", "--threads", "--seed", "--set width", "--set nosuch"),
        ]
    ),
    value=GARBAGE,
)
def test_pretrain_never_shows_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flag: str, value: str
) -> None:
    import torch

    import fl_server.pretrain

    def trained(*_: object, **__: object) -> None:
        raise _Trained  # the input was taken: far enough

    monkeypatch.setattr(fl_server.pretrain, "fine_tune", trained)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # taken: do not change the test's
    out = tmp_path / "w.safetensors"
    argv = [*PRETRAIN, "--out", str(out), "--limit", "200"]
    if flag.startswith("--set"):
        argv += ["--set", f"{flag.split()[1]}={value}"]
    else:
        argv.append(f"{flag}={value}")
    try:
        status = fl_server_main(argv)
    except _Trained:
        return
    assert status == 2
    _one_line(capsys, "fl-server")
    assert not out.exists()
