"""Outputs that never replace what they should not (issue 28): a device node, a FIFO, a name over the file
system's limit, an empty path or a plot format matplotlib does not know, given to every command that
writes, is one line and exit status 2, before any work, with nothing created or replaced; and the atomic
writers themselves refuse the same as a last guard."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from fl_server.cli import main as fl_server_main
from powerctl.files.jsonfile import write_json
from powerctl.files.outputs import OutputPathError, check_output_file
from powerfed.training.powerctl_cli import main as powerctl_main
from simulations.__main__ import main as simulations_main

ROOT = Path(__file__).resolve().parents[1]
SOLAR = ROOT / "simulations" / "caps" / "solar-jetson-nano.csv"
FLEET = """\
name: tiny
groups:
  - {device: sim:jetson-nano, power-cap-w: 3.0}
task:
  model: cnn-tiny
rounds: 1
"""
LONG = "n" * 300

Main = Callable[[list[str]], int]
FILE, FOLDER = "file", "folder"
PC, FL, SIM = (
    (powerctl_main, "powerctl"),
    (fl_server_main, "fl-server"),
    (simulations_main, "python -m simulations"),
)
COMMANDS: dict[str, tuple[tuple[Main, str], str, str]] = {
    # name: ((main, prog), what OUT must be, the command line with OUT standing for the output)
    "powerctl profile --out": (
        PC,
        FILE,
        "profile --device sim:jetson-nano --model cnn-tiny --batch-sizes 4 --quiet --out OUT",
    ),
    "powerctl plot --out": (PC, FOLDER, "plot IN/p.json --out OUT"),
    "powerctl pareto --out": (PC, FOLDER, "pareto --profile IN/p.json --relation IN/r.json --out OUT"),
    "powerctl cap-source --plot": (PC, FILE, f"cap-source trace:{SOLAR} --plot OUT"),
    "fl-server pretrain --out": (
        FL,
        FILE,
        "pretrain --model cnn-tiny --data synthetic-image --samples 64 --no-progress --out OUT",
    ),
    "fl-server relation --out": (
        FL,
        FILE,
        "relation --model cnn-tiny --proxy synthetic-image --target 0.5 --no-progress --out OUT",
    ),
    "simulations run --out": (SIM, FOLDER, "run IN/f.yaml --out OUT"),
    "simulations demo --out": (SIM, FOLDER, "demo --quiet --out OUT"),
    "simulations flwr-run --out": (SIM, FOLDER, "flwr-run --out OUT"),
    "simulations flwr-run --log": (SIM, FILE, "flwr-run --log OUT"),
}


def _fragment(case: str, what: str) -> str:
    not_a = "not a regular file" if what == FILE else "not a folder"
    return {
        "/dev/null": f"is a character device, {not_a}",
        "/dev/full": f"is a character device, {not_a}",
        "FIFO": f"is a FIFO, {not_a}",
        "LONG": "its name is 30",  # 300 bytes (+ a suffix), over the file system's NAME_MAX
        "": "expected a path to write, got ''",
    }[case]


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiling, training, estimating, pre-training or starting Flower is a failure: every output is
    refused before the work that fills it."""
    import fl_server.app
    import fl_server.pretrain
    import fl_server.relation
    import powerctl.profiling.profiler
    import simulations.__main__
    import simulations.runner

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the work started before its output was checked")

    monkeypatch.setattr(powerctl.profiling.profiler.Profiler, "run", refuse)
    monkeypatch.setattr(fl_server.pretrain, "fine_tune", refuse)
    monkeypatch.setattr(fl_server.relation, "estimate_relation", refuse)
    monkeypatch.setattr(fl_server.app, "pretrained_weights", refuse)
    monkeypatch.setattr(simulations.runner, "run_flwr", refuse)
    monkeypatch.setattr(simulations.__main__, "owning_every_process", refuse)


def _one_line(capsys: pytest.CaptureFixture[str], prog: str) -> str:
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    assert captured.err.startswith(f"{prog}") and captured.out == "", captured
    return captured.err


def _tree(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.lstat().st_mode for p in sorted(folder.rglob("*"))}


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An inputs folder (IN), a FIFO, and an empty current folder (where `''` would write)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "f.yaml").write_text(FLEET)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


@pytest.mark.parametrize("case", ["/dev/null", "/dev/full", "FIFO", "LONG", ""])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_hostile_output_is_one_line_and_nothing_is_replaced(
    command: str, case: str, place: Path, capsys: pytest.CaptureFixture[str], no_work: None
) -> None:
    (main, prog), what, line = COMMANDS[command]
    out = {"FIFO": str(place / "fifo"), "LONG": str(place / LONG) + (".png" if "plot" in command else "")}
    given = out.get(case, case)
    before = _tree(place)
    argv = [given if a == "OUT" else a.replace("IN/", f"{place}/in/") for a in line.split()]
    assert main(argv) == 2
    assert _fragment(case, what) in _one_line(capsys, prog)
    assert _tree(place) == before  # nothing created (not even in the current folder), nothing replaced
    assert stat.S_ISFIFO((place / "fifo").lstat().st_mode)
    for device in ("/dev/null", "/dev/full"):
        assert stat.S_ISCHR(os.lstat(device).st_mode)


@pytest.mark.parametrize(
    ("plot", "fragment"),
    [
        (
            "x.txt",
            "--plot DIR/x.txt: its suffix .txt is not a format matplotlib writes; end it in one of .eps,",
        ),
        ("x", "--plot DIR/x: it has no suffix; end it in one of"),
        ("x.PNG.bak", "its suffix .bak is not a format matplotlib writes"),
    ],
)
def test_cap_source_plot_of_a_format_matplotlib_does_not_know_is_one_line(
    plot: str, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert powerctl_main(["cap-source", f"trace:{SOLAR}", "--plot", str(tmp_path / plot)]) == 2
    err = _one_line(capsys, "powerctl")
    assert fragment.replace("DIR", str(tmp_path)) in err and ".png" in err and ".svg" in err
    assert list(tmp_path.iterdir()) == []


def test_cap_source_plot_into_a_folder_whose_cap_source_png_is_a_fifo_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.mkfifo(tmp_path / "cap_source.png")
    assert powerctl_main(["cap-source", f"trace:{SOLAR}", "--plot", str(tmp_path)]) == 2
    assert f"--plot {tmp_path}/cap_source.png: is a FIFO" in _one_line(capsys, "powerctl")
    assert [p.name for p in tmp_path.iterdir()] == ["cap_source.png"]


@pytest.mark.parametrize(
    ("report", "fragment"),
    [
        ("fifo", "--out also writes DIR/w.report.json: is a FIFO, not a regular file"),
        ("folder", "--out also writes DIR/w.report.json: is a folder"),
    ],
)
def test_pretrain_refuses_a_report_path_it_would_replace_before_training(
    report: str, fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_work: None
) -> None:
    if report == "fifo":
        os.mkfifo(tmp_path / "w.report.json")
    else:
        (tmp_path / "w.report.json").mkdir()
    argv = ["pretrain", "--model", "cnn-tiny", "--data", "synthetic-image", "--no-progress"]
    assert fl_server_main([*argv, "--out", str(tmp_path / "w.safetensors")]) == 2
    assert fragment.replace("DIR", str(tmp_path)) in _one_line(capsys, "fl-server")
    assert [p.name for p in tmp_path.iterdir()] == ["w.report.json"]


def test_pretrain_checks_the_longest_name_it_derives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_work: None
) -> None:
    """A weights name that fits, whose report name (`STEM.report.json`) would not."""
    weights = tmp_path / ("w" * 250)
    argv = ["pretrain", "--model", "cnn-tiny", "--data", "synthetic-image", "--no-progress"]
    assert fl_server_main([*argv, "--out", str(weights)]) == 2
    err = _one_line(capsys, "fl-server")
    assert "--out also writes" in err and "its name is 262 bytes, over the 255" in err
    assert list(tmp_path.iterdir()) == []


def test_a_fleet_file_with_a_long_name_says_to_give_out(
    place: Path, capsys: pytest.CaptureFixture[str], no_work: None
) -> None:
    fleet = place / "in" / ("f" * 250 + ".yaml")  # runs/fleet-STEM would be 256 bytes
    fleet.write_text(FLEET)
    before = _tree(place)
    assert simulations_main(["run", str(fleet)]) == 2
    err = _one_line(capsys, "python -m simulations")
    assert "the default --out runs/fleet-fff" in err and "its name is 256 bytes, over the 255" in err
    assert err.rstrip().endswith("give --out")
    assert _tree(place) == before


# --- the writers themselves: the last guard ---------------------------------------------------------


def _writers(tmp: Path) -> dict[str, Callable[[Path], object]]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from fl_server.results import ResultsWriter
    from fl_server.weights import save_weights
    from powerctl.cli.plot import save_figure
    from powerfed.training import checkpoint
    from powerfed.training.models import build_model

    def figure(path: Path) -> Path:
        fig = Figure()
        FigureCanvasAgg(fig)
        fig.add_subplot().plot([0, 1])
        return save_figure(fig, path)

    return {
        "write_json": lambda p: write_json(p, {"a": 1}),
        "write_json durable": lambda p: write_json(p, {"a": 1}, durable=True),
        "save_weights": lambda p: save_weights(
            p, build_model("cnn-tiny", seed=0), model_name="cnn-tiny", num_classes=10
        ),
        "checkpoint.save": lambda p: checkpoint.save(p, {"t": torch.zeros(2)}, {"step": 1}),
        "save_figure": figure,
        "ResultsWriter": lambda p: ResultsWriter(p, {"method": "ours"}),
    }


WRITERS = [
    "ResultsWriter",
    "checkpoint.save",
    "save_figure",
    "save_weights",
    "write_json",
    "write_json durable",
]


def _hostile_target(target: str, folder: Path) -> Path:
    """A device node, FIFO, socket, over-long name or dangling link inside `folder`: a writer that
    replaced one by mistake harms nothing outside the test (never the real /dev/null)."""
    path = folder / f"{target.lower()}.png"
    if target == "CHARDEV":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))  # what /dev/null is
        except PermissionError:
            pytest.skip("creating a device node needs CAP_MKNOD")
    elif target == "FIFO":
        os.mkfifo(path)
    elif target == "SOCKET":
        if len(os.fsencode(path)) > 100:
            pytest.skip(f"{path} is too long for a socket's address")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif target == "LONG":
        path = folder / (LONG + ".png")
    else:
        path.symlink_to(folder / "nowhere" / "x.png")
    return path


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("target", ["CHARDEV", "FIFO", "SOCKET", "LONG", "DANGLING"])
def test_every_writer_refuses_what_is_not_a_regular_file(writer: str, target: str, tmp_path: Path) -> None:
    path = _hostile_target(target, tmp_path)
    kind = path.lstat().st_mode if target != "LONG" else None
    before = _tree(path.parent)
    with pytest.raises(OutputPathError) as refused:
        _writers(tmp_path)[writer](path)
    assert "\n" not in str(refused.value) and str(path)[:20] in str(refused.value)
    assert _tree(path.parent) == before
    assert kind is None or path.lstat().st_mode == kind


@pytest.mark.parametrize("writer", WRITERS)
def test_a_link_to_a_file_is_written_through_and_stays_a_link(writer: str, tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "x.png"
    real.write_bytes(b"old")
    link = tmp_path / "link.png"
    link.symlink_to(real)
    _writers(tmp_path)[writer](link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_bytes() != b"old"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["link.png", "real", "x.png"]  # no temporary left


@pytest.mark.parametrize("writer", WRITERS)
def test_a_name_at_the_limit_is_written_its_temporary_name_shortened(writer: str, tmp_path: Path) -> None:
    path = tmp_path / ("m" * 251 + ".png")  # 255 bytes: the temporary `.NAME.RANDOM.tmp` would be 269
    check_output_file(path)
    _writers(tmp_path)[writer](path)
    assert [p.name for p in tmp_path.iterdir()] == [path.name] and path.stat().st_size > 0


def test_save_figure_refuses_a_format_matplotlib_does_not_know(tmp_path: Path) -> None:
    with pytest.raises(OutputPathError, match=r"x\.txt: its suffix \.txt is not a format matplotlib writes"):
        _writers(tmp_path)["save_figure"](tmp_path / "x.txt")
    assert list(tmp_path.iterdir()) == []
