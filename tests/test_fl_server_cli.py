"""`fl-server`: help a newcomer can follow, one-line errors with exit 2, a tiny real end-to-end run."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fl_server.cli import main
from fl_server.weights import load_model
from powerctl.records.relation import RelationVector


@pytest.mark.parametrize("argv", [["--help"], ["pretrain", "--help"], ["relation", "--help"]])
def test_help_exits_zero(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "usage: fl-server" in out
    if argv[0] != "--help":
        assert "example" in out and "../shared/data/" in out and "default" in out


def test_python_dash_m_works() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fl_server", "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "pretrain" in proc.stdout and "relation" in proc.stdout


PRE = "pretrain --model cnn-tiny --out {tmp}/o/w.safetensors"
REL = "relation --model cnn-tiny --out {tmp}/o/relation.json"
BAD = {
    "missing data file": f"{PRE} --data text:{{tmp}}/none.txt",
    "unknown dataset": f"{PRE} --data mnist-ish",
    "unknown model": "pretrain --model resnet9000 --data synthetic-image --out {tmp}/w",
    "zero batch": f"{PRE} --data synthetic-image --batch-size 0",
    "both budgets": f"{PRE} --data synthetic-image --samples 5 --epochs 1",
    "out is a dir": "pretrain --model cnn-tiny --data synthetic-image --out {tmp}",
    "missing weights": f"{REL} --weights {{tmp}}/none.safetensors --proxy synthetic-image --target 0.5",
    "missing proxy": f"{REL} --proxy npz:{{tmp}}/none.npz --target 0.5",
    "target above 1": f"{REL} --proxy synthetic-image --target 1.5",
    "bad batch list": f"{REL} --proxy synthetic-image --target 0.5 --batch-sizes 8,x",
    "huge batch size": f"{REL} --proxy synthetic-image --target 0.5 --batch-sizes 8,100000000",
    "negative seed": f"{REL} --proxy synthetic-image --target 0.5 --seeds -1",
    "repeated seed": f"{REL} --proxy synthetic-image --target 0.5 --seeds 0,0",
    "unknown lr rule": f"{REL} --proxy synthetic-image --target 0.5 --lr-rule cubic",
    "fractional budget": f"{REL} --proxy synthetic-image --target 0.5 --max-samples 1.5",
    "unknown flag": "relation --model cnn-tiny --frobnicate",
    "no command": "",
}


def _argv(command: str, **paths: Path) -> list[str]:
    return shlex.split(command.format(**{k: str(v) for k, v in paths.items()}))


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2_nothing_written(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_argv(BAD[case], tmp=tmp_path)) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fl-server") and "error:" in lines[0], captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_relation_flags_that_are_run_settings_default_and_check_as_the_run_does() -> None:
    """With no flag given, `fl-server relation` estimates what the ServerApp estimates by default; a
    value the run config refuses, the flag refuses in the same words."""
    from fl_server.cli import build_parser
    from strategies.settings import read_settings

    args = build_parser().parse_args(
        ["relation", "--model", "cnn-tiny", "--proxy", "p", "--target", "0.5", "--out", "r"]
    )
    run = read_settings({})
    assert args.batch_sizes == run.batch_sizes and args.seeds == run.relation_seeds
    assert (args.lr_max, args.lr_rule, args.vector) == (run.lr_max, run.lr_rule, run.relation_values)
    assert (args.max_samples, args.max_seeds) == (run.relation_max_samples, run.relation_max_seeds)
    assert (args.eval_every_samples, args.eval_max_samples) == (run.eval_every_samples, run.eval_max_samples)
    assert args.data_seed == run.proxy_seed


def test_the_commands_and_the_estimate_name_run_settings_by_attribute() -> None:
    """fl-server's and the simulations' commands, the demo's settings and the relation estimate read a
    run setting through its declaration (its attribute, `flag`, `key_of`): none spells a run-config key,
    so a renamed key changes its declaration alone."""
    import ast

    from strategies.settings import SETTINGS

    root = Path(__file__).resolve().parents[1]
    files = ["fl_server/cli.py", "simulations/__main__.py", "simulations/demo_config.py"]
    files += sorted(str(p.relative_to(root)) for p in (root / "fl_server" / "relation").glob("*.py"))
    keys = {key for key in SETTINGS if "-" in key}
    spelled = {
        (name, node.value)
        for name in files
        for node in ast.walk(ast.parse((root / name).read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and node.value in keys
    }
    assert not spelled


def test_pretrain_then_relation_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weights = tmp_path / "w" / "pre.safetensors"
    weights.parent.mkdir()  # an output file's folder must exist (powerctl.files.outputs)
    pre = "pretrain --model cnn-tiny --data synthetic-image --limit 150 --samples 240 --batch-size 16 "
    assert main(_argv(pre + "--lr 0.002 --out {w} --no-progress", w=weights)) == 0
    report = json.loads((tmp_path / "w" / "pre.report.json").read_text())
    assert report["samples"] == 240 and 0.0 <= report["final_test_accuracy"] <= 1.0
    load_model(weights, expect_model="cnn-tiny")

    out = tmp_path / "rel" / "relation.json"
    out.parent.mkdir()
    rel_cmd = (
        "relation --model cnn-tiny --weights {w} --proxy synthetic-image --data-seed 1 --limit 150 "
        "--target 0.5 --batch-sizes 8,16 --eval-every 32 --max-samples 3000 --lr-max 0.002 "
        "--cache-dir {cache} --out {out} --no-progress"
    )
    argv = _argv(rel_cmd, w=weights, cache=tmp_path / "cache", out=out)
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rel = RelationVector.load(out)
    assert rel.model == "cnn-tiny" and rel.batch_sizes == (8, 16) and rel.relation[-1] == 1.0
    assert rel.extra["weights_sha256"] == report["weights_sha256"]
    assert f"wrote {out}" in printed
    # the same command again is served from the cache and writes the same file
    out.unlink()
    assert main(argv) == 0
    assert RelationVector.load(out).to_dict() == rel.to_dict()
