"""Bad input, tried as a new user would: one line naming what and where, exit status 2, no traceback, and
nothing expensive run, pinned or half-written first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fl_server.cli import main as fl_server_main
from powerctl.files.outputs import OutputPathError, check_output_dir, check_output_file
from powerctl.records.profile import Profile
from powerctl.records.relation import RelationVector
from powerfed.training.errors import ModelError
from powerfed.training.models import build_model, check_size
from powerfed.training.powerctl_cli import main as powerctl_main
from simulations.__main__ import main as simulations_main

PROFILE = ["profile", "--device", "sim:jetson-nano", "--model", "cnn-tiny", "--batch-sizes", "4", "--quiet"]


def _one_line(capsys: pytest.CaptureFixture[str], prog: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"{prog}"), err
    return err


@pytest.fixture
def no_profiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any profiling is a failure: these inputs must be refused before the profile starts."""
    import powerctl.profiling.profiler

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("profiled before the input was checked")

    monkeypatch.setattr(powerctl.profiling.profiler.Profiler, "run", refuse)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--out", "/proc/profile.json"], "--out /proc/profile.json: cannot write in /proc"),
        (["--out", "MISSING/sub/p.json"], "folder MISSING/sub does not exist; create it first"),
        (["--out", "FILE/p.json"], "(it is a file)"),
        (["--out", "TMP"], "is a folder; give a file name"),
        (
            ["--out", "TMP/p.json", "--warmup", "-3"],
            "argument --warmup: expected an integer in [0, 1000], got '-3'",
        ),
        (["--out", "TMP/p.json", "--rate", "0"], "argument --rate: expected a number in (0, 1000], got '0'"),
        (
            ["--out", "TMP/p.json", "--rate", "nan"],
            "argument --rate: expected a number in (0, 1000], got 'nan'",
        ),
        (
            ["--out", "TMP/p.json", "--rate", "inf"],
            "argument --rate: expected a number in (0, 1000], got 'inf'",
        ),
        (
            ["--out", "TMP/p.json", "--seed", "-1"],
            "argument --seed: expected an integer in [0, 4294967295], got '-1'",
        ),
    ],
)
def test_profile_inputs_are_refused_before_profiling(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_profiling: None, extra: list[str], fragment: str
) -> None:
    (tmp_path / "FILE").write_text("x")
    argv = [
        a.replace("MISSING", str(tmp_path / "missing")).replace("FILE", str(tmp_path / "FILE")) for a in extra
    ]
    argv = [str(tmp_path) if a == "TMP" else a.replace("TMP", str(tmp_path)) for a in argv]
    assert powerctl_main(PROFILE + argv) == 2
    err = _one_line(capsys, "powerctl")
    assert fragment.replace("MISSING", str(tmp_path / "missing")) in err
    assert not (tmp_path / "missing").exists()  # a missing folder is never created for a file
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]


@pytest.mark.parametrize("argv", [["--set", "-5MHz"], ["--set=-5MHz"], ["--set", "-0.5"], ["--set", "0"]])
def test_freq_set_of_a_non_positive_frequency_says_so(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert powerctl_main(["freq", "--device", "sim:jetson-nano", *argv]) == 2
    assert "frequency must be > 0" in _one_line(capsys, "powerctl freq")


def test_plot_into_an_existing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "taken").write_text("x")
    assert powerctl_main(["plot", str(tmp_path / "absent.json"), "--out", str(tmp_path / "taken")]) == 2
    assert "--out " + str(tmp_path / "taken") + ": is a file, not a folder" in _one_line(capsys, "powerctl")


def test_output_folders_may_be_created_below_an_existing_folder(tmp_path: Path) -> None:
    assert check_output_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # checked, not created: the command creates it when it writes
    with pytest.raises(OutputPathError, match="cannot write in /proc"):
        check_output_dir("/proc/new-folder")
    with pytest.raises(OutputPathError, match="does not exist"):
        check_output_file(tmp_path / "a" / "f.json")
    assert check_output_file(tmp_path / "f.json") == tmp_path / "f.json"
    assert os.listdir(tmp_path) == []  # the probe leaves nothing behind


# --- fl-server -----------------------------------------------------------------------------------


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    import fl_server.pretrain

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("trained before the input was checked")

    monkeypatch.setattr(fl_server.pretrain, "fine_tune", refuse)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--out", "/proc/w.safetensors"], "--out /proc/w.safetensors: cannot write in /proc"),
        (["--out", "MISSING/w.safetensors"], "does not exist; create it first"),
        (
            ["--model", "chartransformer-small", "--data", "synthetic-text", "--set", "n_embd=abc"],
            "model 'chartransformer-small' option n_embd must be an integer in [1, 16384], got 'abc'",
        ),
        (["--set", "width=-4"], "model 'cnn-tiny' option width must be an integer in [1, 4096], got -4"),
        (["--set", "width=1.5"], "option width must be an integer in [1, 4096], got 1.5"),
        (["--set", "nosuch=3"], "model 'cnn-tiny' has no option nosuch"),
        (["--model", "nosuch"], "argument --model: invalid choice"),
    ],
)
def test_pretrain_inputs_are_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_training: None, extra: list[str], fragment: str
) -> None:
    argv = ["pretrain", "--model", "cnn-tiny", "--data", "synthetic-image", "--samples", "64"]
    argv += ["--no-progress", "--out", str(tmp_path / "w.safetensors")]
    argv += [a.replace("MISSING", str(tmp_path / "missing")) for a in extra]
    assert fl_server_main(argv) == 2
    assert fragment in _one_line(capsys, "fl-server")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"dropout": 2.0}, "dropout must be a number in [0, 1), got 2.0"),
        ({"n_layer": True}, "n_layer must be an integer in [1, 256], got True"),
        ({"dropout": float("nan")}, "dropout must be a number in [0, 1), got nan"),
    ],
)
def test_model_options_of_the_wrong_type_or_range_are_one_model_error(overrides: dict, fragment: str) -> None:
    with pytest.raises(ModelError, match=fragment.replace("[", r"\[").replace(")", r"\)")):
        check_size("chartransformer-small", None, overrides)
    with pytest.raises(ModelError):
        build_model("chartransformer-small", **overrides)


# --- the demo ------------------------------------------------------------------------------------


@pytest.fixture
def no_pretraining(monkeypatch: pytest.MonkeyPatch) -> None:
    import fl_server.app

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("pre-trained before the input was checked")

    monkeypatch.setattr(fl_server.app, "pretrained_weights", refuse)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--out", "FILE"], "is a file, not a folder"),
        (["--device", "sim:jetson-orin"], "no simulated board named 'jetson-orin'"),
        (["--device", "quantum:0"], "unknown device spec 'quantum:0'"),
        (["--model", "nosuch"], "unknown model 'nosuch'"),
        (["--power-cap", "1"], "no fixed frequency of jetson-nano keeps every model under 1.00 W"),
        (["--power-cap", "-3"], "argument --power-cap: expected a number of watts in (0, 100000]"),
        (["--target-accuracy", "1.5"], "expected a number in (0, 1]"),
    ],
)
def test_demo_inputs_are_refused_before_pretraining(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_pretraining: None, extra: list[str], fragment: str
) -> None:
    (tmp_path / "FILE").write_text("x")
    argv = ["demo", "--quiet", "--out", str(tmp_path / "out")]
    argv += [str(tmp_path / "FILE") if a == "FILE" else a for a in extra]
    assert simulations_main(argv) == 2
    assert fragment in _one_line(capsys, "python -m simulations")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["FILE"]


# --- select: inputs that do not belong together --------------------------------------------------


def _profile(tmp_path: Path, model: str = "mobilenetv2-small") -> Path:
    from powerctl.records.profile import ProfilePoint

    points = [
        ProfilePoint(b, f, peak, peak * 0.9, 0.01 * b / f * 1e9 / 1e3, 10.0 * 64 / b * 614.4e6 / f)
        for b in (8, 16, 32)
        for f, peak in ((76800000, 2.0 + b / 100), (614400000, 2.6 + b / 50))
    ]
    path = tmp_path / f"{model}.profile.json"
    Profile("jetson-nano", model, [3, 32, 32], 1000, points).save(path)
    return path


def _relation(tmp_path: Path, model: str, samples: dict[int, float], **extra: object) -> Path:
    path = tmp_path / f"{model}.relation.json"
    RelationVector.from_samples(model, "proxy", 0.5, samples, **extra).save(path)
    return path


def test_select_refuses_a_relation_of_another_model_unless_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = _profile(tmp_path)
    relation = _relation(tmp_path, "chartransformer", {8: 900.0, 16: 1000.0, 32: 1100.0})
    argv = ["select", "--profile", str(profile), "--relation", str(relation), "--power-cap", "3"]
    assert powerctl_main(argv) == 2
    err = _one_line(capsys, "powerctl")
    assert "the profile is of model 'mobilenetv2-small', the relation vector of 'chartransformer'" in err
    assert "--allow-mismatch" in err
    assert powerctl_main([*argv, "--allow-mismatch"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("batch size ") and "combined anyway (--allow-mismatch)" in err


def test_select_names_batch_sizes_in_one_file_only_and_a_flat_relation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = _profile(tmp_path)
    relation = _relation(
        tmp_path, "mobilenetv2-small", {8: 1024.0, 16: 1024.0, 64: 1024.0}, eval_every_samples=1024
    )
    assert powerctl_main(["select", "--profile", str(profile), "--relation", str(relation)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert len(warnings) == 3, warnings
    assert "batch sizes [32] are profiled but not in the relation vector" in warnings[0]
    assert "batch sizes [64] are in the relation vector but not profiled" in warnings[1]
    assert "same 1024 samples (evaluated every 1024 samples): relation 1.000 everywhere" in warnings[2]


def test_select_compare_prints_every_row_and_marks_an_infeasible_baseline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = _profile(tmp_path)
    relation = _relation(tmp_path, "mobilenetv2-small", {8: 900.0, 16: 1000.0, 32: 1100.0})
    argv = [
        "select",
        "--profile",
        str(profile),
        "--relation",
        str(relation),
        "--power-cap",
        "2.2",
        "--compare",
    ]
    assert powerctl_main(argv) == 0  # the method has a pair under 2.2 W; no fixed frequency does
    out = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line for line in out[3:] if line.strip()}
    assert set(rows) == {"ours", "state-of-practice", "proxy-batch"}
    assert "infeasible under the cap" not in rows["ours"]
    for name in ("state-of-practice", "proxy-batch"):
        assert "infeasible under the cap: state of practice: no fixed frequency of jetson-nano" in rows[name]


def test_fl_server_relation_warns_when_every_batch_size_needs_the_same_samples(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import fl_server.relation

    flat = RelationVector.from_samples(
        "cnn-tiny", "synthetic-image", 0.5, {8: 1024.0, 16: 1024.0}, eval_every_samples=1024
    )
    monkeypatch.setattr(fl_server.relation, "estimate_relation", lambda *a, **k: flat)
    argv = ["relation", "--model", "cnn-tiny", "--proxy", "synthetic-image", "--target", "0.5"]
    assert fl_server_main([*argv, "--batch-sizes", "8,16", "--out", str(tmp_path / "r.json")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fl-server relation: warning: every batch size" in err


def test_a_dataset_of_nan_images_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np

    path = tmp_path / "nan.npz"
    np.savez(path, x=np.full((20, 3, 8, 8), np.nan, dtype="float32"), y=np.arange(20) % 3)
    argv = ["pretrain", "--model", "cnn-tiny", "--data", f"npz:{path}", "--samples", "16", "--no-progress"]
    assert fl_server_main([*argv, "--out", str(tmp_path / "w.safetensors")]) == 2
    assert f"{path}: image x holds NaN or infinite values" in _one_line(capsys, "fl-server")
    assert not (tmp_path / "w.safetensors").exists()


def test_relation_cache_dir_is_checked_before_estimating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fl_server.relation

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("estimated before the input was checked")

    monkeypatch.setattr(fl_server.relation, "estimate_relation", refuse)
    argv = ["relation", "--model", "cnn-tiny", "--proxy", "synthetic-image", "--target", "0.5"]
    argv += ["--cache-dir", "/proc/cache", "--out", str(tmp_path / "r.json")]
    assert fl_server_main(argv) == 2
    assert "--cache-dir /proc/cache: cannot write in /proc" in _one_line(capsys, "fl-server")
