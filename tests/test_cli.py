"""`powerctl` end to end: the behaviours docs/reference/cli.md and the foundation issue name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from powerctl.records.relation import RelationVector
from powerfed.training.powerctl_cli import main
from tests.fake_boards import NANO_FREQS, make_nano_tree, tree_snapshot


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def nano_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "nano"
    make_nano_tree(root)
    monkeypatch.setenv("POWERCTL_SYSFS_ROOT", str(root))
    return root


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "profile.json"
    code = main(
        [
            "profile",
            "--device",
            "sim:jetson-nano",
            "--model",
            "cnn-tiny",
            "--batch-sizes",
            "4,16,64",
            "--samples",
            "2000",
            "--warmup",
            "0",
            "--steps",
            "1",
            "--quiet",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    return out


@pytest.fixture
def relation_path(tmp_path: Path) -> Path:
    path = tmp_path / "relation.json"
    RelationVector.from_samples("cnn-tiny", "synthetic-image", 0.8, {4: 900.0, 16: 1400.0, 64: 3000.0}).save(
        path
    )
    return path


def test_devices_lists_the_fake_nano(nano_root: Path, capsys) -> None:
    code, out, _ = run(capsys, "devices", "--json")
    assert code == 0
    devices = json.loads(out)
    nano = next(d for d in devices if d.get("board") == "jetson-nano")
    assert nano["frequencies_hz"] == NANO_FREQS and len(NANO_FREQS) == 12
    assert set(nano["rails"]) == {"POM_5V_IN", "POM_5V_GPU", "POM_5V_CPU"}
    assert {"sim:jetson-nano", "sim:jetson-tx2nx", "host"} <= {d["spec"] for d in devices}


def test_power_reads_the_total_rail(nano_root: Path, capsys) -> None:
    code, out, _ = run(capsys, "power", "--device", "jetson", "--json")
    reading = json.loads(out)
    assert code == 0 and reading["power_w"] == pytest.approx(reading["rails_w"]["POM_5V_IN"])


def test_freq_set_then_restore_leaves_the_tree_exactly_as_it_was(nano_root: Path, capsys) -> None:
    before = tree_snapshot(nano_root)
    assert run(capsys, "freq", "--device", "jetson", "--set", "460800000")[0] == 0
    pinned = tree_snapshot(nano_root)
    assert pinned != before
    assert any(k.endswith("min_freq") and v.strip() == b"460800000" for k, v in pinned.items())
    assert (
        run(capsys, "freq", "--device", "jetson-nano", "--set", "844.8MHz")[0] == 0
    )  # second pin, same board
    code, out, _ = run(capsys, "freq", "--device", "jetson", "--restore")
    assert code == 0 and "restored" in out
    assert tree_snapshot(nano_root) == before
    code, out, _ = run(capsys, "freq", "--device", "jetson", "--restore")
    assert code == 0 and "nothing to restore" in out


def test_freq_set_rejects_a_frequency_not_in_the_table(nano_root: Path, capsys) -> None:
    before = tree_snapshot(nano_root)
    code, _, err = run(capsys, "freq", "--device", "jetson", "--set", "500000000")
    assert code == 2 and "not a frequency" in err and err.count("\n") == 1
    assert tree_snapshot(nano_root) == before


def test_profile_then_select_gives_a_pair_under_the_cap(
    profile_path: Path, relation_path: Path, capsys
) -> None:
    profile = json.loads(profile_path.read_text())
    assert profile["device"] == "jetson-nano" and profile["profiling_s"] > 0
    peaks = sorted(p["peak_power_w"] for p in profile["points"])
    cap = peaks[len(peaks) // 2]  # a cap that rules out half the points
    code, out, _ = run(
        capsys,
        "select",
        "--profile",
        str(profile_path),
        "--relation",
        str(relation_path),
        "--power-cap",
        str(cap),
        "--json",
    )
    choice = json.loads(out)
    assert code == 0
    assert set(choice) == {"batch_size", "frequency_hz", "predicted_s", "peak_power_w"}
    assert choice["peak_power_w"] <= cap
    point = next(
        p
        for p in profile["points"]
        if (p["batch_size"], p["frequency_hz"]) == (choice["batch_size"], choice["frequency_hz"])
    )
    assert choice["peak_power_w"] == point["peak_power_w"]


def test_select_with_no_feasible_pair_exits_2_naming_cap_and_least_power(
    profile_path: Path, relation_path: Path, capsys
) -> None:
    least = min(p["peak_power_w"] for p in json.loads(profile_path.read_text())["points"])
    code, out, err = run(
        capsys,
        "select",
        "--profile",
        str(profile_path),
        "--relation",
        str(relation_path),
        "--power-cap",
        "0.5",
        "--json",
    )
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "0.5" in err and f"{least:.2f}" in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["select", "--profile", "{p}", "--relation", "{r}", "--power-cap", "0"],
            "expected a number of watts > 0 and ≤ 100000, or none",
        ),
        (
            ["select", "--profile", "{p}", "--relation", "{r}", "--power-cap", "nan"],
            "expected a number of watts > 0 and ≤ 100000, or none",
        ),
        (
            ["select", "--profile", "{p}", "--relation", "{r}", "--power-cap", "-3"],
            "expected a number of watts > 0 and ≤ 100000, or none",
        ),
        (["select", "--profile", "{bad}", "--relation", "{r}"], "not valid JSON"),
        (["select", "--profile", "{r}", "--relation", "{r}"], "schema"),
        (["select", "--profile", "{p}", "--relation", "{missing}"], "no such file"),
        (["power", "--device", "sim:jetson-xavier"], "no simulated board"),
        (["freq", "--device", "quantum:0", "--set", "1"], "unknown device spec"),
        (["profile", "--device", "sim:jetson-nano", "--model", "alexnet", "--out", "{out}"], "alexnet"),
        (
            [
                "profile",
                "--device",
                "sim:jetson-nano",
                "--model",
                "cnn-tiny",
                "--order",
                "efficient",
                "--out",
                "{out}",
            ],
            "--power-cap",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv, needle, profile_path: Path, relation_path: Path, tmp_path: Path, capsys
) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "powerctl.profile/2", "points": [')
    names = {
        "p": profile_path,
        "r": relation_path,
        "bad": bad,
        "missing": tmp_path / "missing.json",
        "out": tmp_path / "out.json",
    }
    code, _, err = run(capsys, *[a.format(**names) for a in argv])
    assert code == 2
    assert needle in err and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out.json").exists()


def test_plot_writes_heat_maps(profile_path: Path, relation_path: Path, tmp_path: Path, capsys) -> None:
    code, out, _ = run(
        capsys,
        "plot",
        str(profile_path),
        "--out",
        str(tmp_path / "plots"),
        "--power-cap",
        "3",
        "--relation",
        str(relation_path),
    )
    paths = [Path(line) for line in out.splitlines()]
    assert code == 0 and len(paths) >= 2
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_console_script_prints_no_traceback(tmp_path: Path) -> None:
    env = dict(os.environ)
    bad = tmp_path / "p.json"
    bad.write_text("not json")
    proc = subprocess.run(
        [sys.executable, "-m", "powerctl", "select", "--profile", str(bad), "--relation", str(bad)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("powerctl: error:") and "Traceback" not in proc.stderr


def test_profile_runs_the_injected_training_step_and_says_where_it_is_without_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """powerctl imports no training: `powerctl.cli.commands.main` measures the step it is given; without one
    (`python -m powerctl profile`) it is one line naming the installed command, and nothing is written."""
    from powerctl.cli import commands as cli
    from powerfed.training.profiling import profiling_step_factory

    asked: list[tuple[str, dict]] = []

    def step_factory(model_name: str, **options):  # type: ignore[no-untyped-def]
        asked.append((model_name, options))
        return profiling_step_factory(model_name, **options)

    argv = ["profile", "--device", "sim:jetson-nano", "--model", "cnn-tiny", "--batch-sizes", "4",
            "--warmup", "0", "--steps", "1", "--quiet", "--seed", "3"]  # fmt: skip
    assert cli.main([*argv, "--out", str(tmp_path / "p.json")], step_factory=step_factory) == 0
    assert asked == [("cnn-tiny", {"torch_device": "cpu", "num_classes": None, "seed": 3})]
    assert (tmp_path / "p.json").is_file()
    capsys.readouterr()
    assert cli.main([*argv, "--out", str(tmp_path / "q.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "run the installed `powerctl` command" in err
    assert not (tmp_path / "q.json").exists()
