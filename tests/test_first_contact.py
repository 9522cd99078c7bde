"""What a new user and a hostile input meet first (issue 18): one line naming the real problem, exit
status 2, nothing written and nothing started; every user-controlled size bounded."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from matplotlib.artist import Artist
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from fl_server.cli import main as fl_server_main
from powerctl.files.mapping import MAX_BATCH_SIZE
from powerctl.records.relation import RelationVector
from powerctl.selection.capsource import MAX_POINTS
from powerfed.training.powerctl_cli import main as powerctl_main
from simulations.__main__ import main as simulations_main
from strategies.fleet import MAX_BOARDS, NodeConfigError, read_yaml
from tests.test_bad_input import _one_line

ROOT = Path(__file__).resolve().parents[1]
SOLAR = ROOT / "simulations" / "caps" / "solar-jetson-nano.csv"
BINARY = bytes(range(256)) * 8  # not UTF-8

FLEET = """\
name: tiny
groups:
  - {device: sim:jetson-nano, power-cap-w: 3.0}
task:
  model: cnn-tiny
  batch-sizes: [8, 16]
rounds: 1
"""


@pytest.fixture
def no_flower(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting Flower is a failure: these inputs must be refused before the SuperLink and Ray start."""
    import simulations.runner

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("Flower was started before the input was checked")

    monkeypatch.setattr(simulations.runner, "run_flwr", refuse)


@pytest.fixture
def profile(tmp_path: Path) -> Path:
    path = tmp_path / "nano.json"
    argv = ["profile", "--device", "sim:jetson-nano", "--model", "cnn-tiny", "--predicted"]
    assert powerctl_main([*argv, "--batch-sizes", "8,16,32", "--out", str(path)]) == 0
    return path


# --- fleet files ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (FLEET + "groups:\n  - {device: sim:jetson-tx2nx}\n", "key 'groups' is given twice (lines 2 and 8)"),
        (
            FLEET.replace("model: cnn-tiny", "model: cnn-tiny\n  model: resnet18"),
            "key 'model' is given twice",
        ),
        (
            FLEET.replace("power-cap-w: 3.0}", "power-cap-w: 3.0, power-cap-w: 5}"),
            "'power-cap-w' is given twice",
        ),
    ],
)
def test_a_fleet_file_with_a_key_twice_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_flower: None, text: str, fragment: str
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(text)
    with pytest.raises(NodeConfigError, match=re.escape(fragment)):
        read_yaml(fleet)
    assert simulations_main(["run", str(fleet), "--out", str(tmp_path / "out")]) == 2
    assert fragment in _one_line(capsys, "python -m simulations")
    assert not (tmp_path / "out").exists()


def test_binary_files_given_as_fleet_profile_or_relation_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], profile: Path, no_flower: None
) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(BINARY)
    assert simulations_main(["run", str(junk), "--out", str(tmp_path / "out")]) == 2
    assert "not a text file (not UTF-8); a fleet file is YAML text" in _one_line(
        capsys, "python -m simulations"
    )
    for argv, what in (
        (["select", "--profile", str(junk), "--relation", str(junk)], "powerctl.profile/2"),
        (["select", "--profile", str(profile), "--relation", str(junk)], "powerctl.relation/2"),
        (["plot", str(junk), "--out", str(tmp_path / "plots")], "powerctl.profile/2"),
        (["caps", "--profile", str(junk), "--power-cap", "5"], "powerctl.profile/2"),
    ):
        assert powerctl_main(argv) == 2
        assert f"junk.bin: not a text file (not UTF-8); expected {what} JSON" in _one_line(capsys, "powerctl")
    assert powerctl_main(["select", "--profile", str(tmp_path), "--relation", str(junk)]) == 2
    assert "is a folder; give the powerctl.profile/2 file" in _one_line(capsys, "powerctl")


def test_a_fleet_of_too_many_boards_is_one_line_saying_the_limit(tmp_path: Path, no_flower: None) -> None:
    fleet = tmp_path / "huge.yaml"
    fleet.write_text(FLEET.replace("power-cap-w: 3.0}", "power-cap-w: 3.0, count: 1000000000}"))
    with pytest.raises(
        NodeConfigError, match=rf"groups\[0\]: 'count': a fleet has at most {MAX_BOARDS} boards"
    ):
        from simulations.fleet import load_fleet_spec

        load_fleet_spec(fleet)


@pytest.mark.parametrize("where", ["/proc/fleet", "EXISTING_FILE"])
def test_the_fleet_runner_refuses_an_output_it_cannot_write_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_flower: None, where: str
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    existing = tmp_path / "results.txt"
    existing.write_text("keep me")
    out = str(existing) if where == "EXISTING_FILE" else where
    assert simulations_main(["run", str(fleet), "--out", out]) == 2
    err = _one_line(capsys, "python -m simulations")
    assert "is a file, not a folder" in err if where == "EXISTING_FILE" else "cannot write in /proc" in err
    assert existing.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == [
        "fleet.yaml",
        "results.txt",
    ]


def test_garbage_weights_or_a_relation_of_another_model_are_refused_before_flower_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_flower: None
) -> None:
    garbage = tmp_path / "weights.safetensors"
    garbage.write_bytes(BINARY)
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET.replace("  model: cnn-tiny\n", f"  model: cnn-tiny\n  weights: {garbage}\n"))
    assert simulations_main(["run", str(fleet), "--out", str(tmp_path / "out")]) == 2
    err = _one_line(capsys, "python -m simulations")
    assert "fleet.yaml: task.weights:" in err and "not a readable safetensors weights file" in err

    other = tmp_path / "relation.json"
    RelationVector.from_samples("resnet18", "proxy", 0.5, {8: 10.0, 16: 20.0}).save(other)
    fleet.write_text(FLEET.replace("  model: cnn-tiny\n", f"  model: cnn-tiny\n  relation: {other}\n"))
    assert simulations_main(["run", str(fleet), "--out", str(tmp_path / "out")]) == 2
    err = _one_line(capsys, "python -m simulations")
    assert "fleet.yaml: task.relation:" in err and "the vector is for model 'resnet18'" in err


# --- powerctl cap-source ----------------------------------------------------------------------------
def test_cap_source_plot_goes_to_an_existing_folder_only_and_prints_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = f"trace:{SOLAR}"
    assert powerctl_main(["cap-source", source, "--plot", "/proc/x.png"]) == 2
    assert "--plot /proc/x.png: cannot write in /proc" in _one_line(capsys, "powerctl")
    missing = tmp_path / "missing" / "cap.png"
    assert powerctl_main(["cap-source", source, "--plot", str(missing)]) == 2
    assert "does not exist; create it first" in _one_line(capsys, "powerctl")
    assert not missing.parent.exists()
    assert powerctl_main(["cap-source", source, "--plot", str(tmp_path)]) == 0
    written = tmp_path / "cap_source.png"
    assert capsys.readouterr().out.splitlines()[-1] == str(written) and written.stat().st_size > 10_000


def test_cap_source_bounds_its_points_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert powerctl_main(["cap-source", f"trace:{SOLAR}", "--until", "1e9", "--every", "0.001"]) == 2
    assert f"more than {MAX_POINTS:,}: raise --every or lower --until" in _one_line(capsys, "powerctl")
    plot = str(tmp_path / "p.png")
    assert (
        powerctl_main(["cap-source", f"trace:{SOLAR}", "--until", "1e9", "--every", "1e5", "--plot", plot])
        == 2
    )
    assert f"more than {MAX_POINTS:,} steps to draw; lower --until" in _one_line(capsys, "powerctl")


def test_cap_source_plot_draws_every_change_whatever_the_listing_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--every 600` lists two lines of a trace that runs 2.4–5 W; the plot still holds every step."""
    from matplotlib.figure import Figure

    drawn: list[Figure] = []
    real = Figure.savefig

    def keep(self: Figure, *args: object, **kwargs: object) -> None:
        drawn.append(self)
        real(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    assert powerctl_main(["cap-source", f"trace:{SOLAR}", "--every", "600", "--plot", str(tmp_path)]) == 0
    (line,) = drawn[0].axes[0].get_lines()
    ys = [y for y in line.get_ydata() if y == y]
    assert min(ys) == 2.4 and max(ys) == 5.0 and len(set(ys)) > 20


# --- sizes, and lines that name the real problem ------------------------------------------------------
def test_a_huge_batch_size_is_one_line_and_a_profile_with_no_point_is_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    argv = ["profile", "--device", "sim:jetson-nano", "--model", "cnn-tiny", "--predicted", "--out", str(out)]
    assert powerctl_main([*argv, "--batch-sizes", "100000000"]) == 2
    assert f"expected distinct integers ≥ 1 and ≤ {MAX_BATCH_SIZE}" in _one_line(capsys, "powerctl profile")
    assert powerctl_main([*argv[:4], "resnet18", *argv[5:], "--batch-sizes", "60000"]) == 2
    assert "no batch size fits in the device's memory (skipped [60000]): nothing written" in _one_line(
        capsys, "powerctl"
    )
    assert not out.exists()


def test_caps_below_every_point_says_the_cap_is_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], profile: Path
) -> None:
    # a second profile profiled at other frequencies only: the two share no frequency at every batch size
    data = json.loads(profile.read_text())
    data["points"] = [p for p in data["points"] if p["frequency_hz"] > 800e6 and p["batch_size"] == 8]
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**data, "model": "cnn-tiny", "skipped": []}))
    data["points"] = [p for p in json.loads(profile.read_text())["points"] if p["frequency_hz"] < 200e6]
    low = tmp_path / "low.json"
    low.write_text(json.dumps(data))
    assert powerctl_main(["caps", "--profile", str(other), "--profile", str(low), "--power-cap", "1"]) == 2
    err = _one_line(capsys, "powerctl")
    assert "no profiled point stays under 1.00 W: the least peak power is" in err and "share" not in err
    assert powerctl_main(["caps", "--profile", str(other), "--profile", str(low), "--power-cap", "50"]) == 2
    assert "share no frequency profiled at every batch size" in _one_line(capsys, "powerctl")


def test_select_with_a_two_entry_relation_says_what_the_relation_should_be(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], profile: Path
) -> None:
    rel = tmp_path / "r.json"
    doc = {"schema": "powerctl.relation/2", "model": "cnn-tiny", "proxy_dataset": "p", "target_accuracy": 0.7}
    rel.write_text(json.dumps({**doc, "batch_sizes": [8, 16], "samples_to_target": [2000, 1000]}))
    assert powerctl_main(["select", "--profile", str(profile), "--relation", str(rel)]) == 0
    err = capsys.readouterr().err
    assert "batch sizes [32] are profiled but not in the relation vector: not considered" in err
    rel.write_text(
        json.dumps({**doc, "batch_sizes": [8, 16], "samples_to_target": [2000, 1000], "relation": [1, 0.5]})
    )
    assert powerctl_main(["select", "--profile", str(profile), "--relation", str(rel)]) == 2
    err = _one_line(capsys, "powerctl")
    assert "'relation' [1, 0.5] is not samples_to_target divided by its last entry, [2, 1]" in err
    rel.write_text(json.dumps({"batch_sizes": [8, 16], "relation": [2, 1]}))
    assert powerctl_main(["select", "--profile", str(profile), "--relation", str(rel)]) == 2
    assert 'has no "schema" field; expected a powerctl.relation/2 file' in _one_line(capsys, "powerctl")


def test_plot_refuses_a_relation_of_another_model_as_select_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], profile: Path
) -> None:
    other = tmp_path / "relation.json"
    RelationVector.from_samples("resnet18", "proxy", 0.5, {8: 10.0, 16: 20.0}).save(other)
    out = tmp_path / "plots"
    for argv in (["select", "--profile", str(profile)], ["plot", str(profile), "--out", str(out)]):
        assert powerctl_main([*argv, "--relation", str(other)]) == 2
        assert "the relation vector of 'resnet18': they do not belong together" in _one_line(
            capsys, "powerctl"
        )
    assert not out.exists()
    assert (
        powerctl_main(["plot", str(profile), "--out", str(out), "--relation", str(other), "--allow-mismatch"])
        == 0
    )


@pytest.mark.parametrize(
    ("argv", "prog", "fragment"),
    [
        (
            ["power", "--device", "nvml:-1"],
            "powerctl",
            "the NVML index counts from 0 (nvml:0 is the first GPU)",
        ),
        (
            [
                "relation",
                "--model",
                "cnn-tiny",
                "--weights",
                "TMP",
                "--proxy",
                "synthetic-image",
                "--target",
                "0.5",
            ],
            "fl-server",
            "is a folder; give the weights file in it (.safetensors)",
        ),
        (
            ["pretrain", "--model", "cnn-tiny", "--data", "npz:JUNK", "--out", "TMP/w.safetensors"],
            "fl-server",
            "not a readable .npz: not a zip archive (numpy.savez writes one)",
        ),
        (
            ["stop-superlink", "--port", "99999"],
            "python -m simulations stop-superlink",
            "--port: expected an integer in [1, 65535]",
        ),
    ],
)
def test_misleading_lines_now_name_the_real_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], prog: str, fragment: str
) -> None:
    (tmp_path / "junk.bin").write_bytes(BINARY)
    argv = [a.replace("TMP", str(tmp_path)).replace("JUNK", str(tmp_path / "junk.bin")) for a in argv]
    if argv[0] == "relation":
        argv += ["--out", str(tmp_path / "r.json")]
    main = {"powerctl": powerctl_main, "fl-server": fl_server_main}.get(prog, simulations_main)
    assert main(argv) == 2
    err = _one_line(capsys, prog)
    assert fragment in err and "pickle" not in err and "must be a number" not in err


def test_stop_superlink_says_when_nothing_listens(capsys: pytest.CaptureFixture[str]) -> None:
    from simulations.local_superlink import free_port

    port = free_port()
    assert simulations_main(["stop-superlink", "--port", str(port)]) == 0
    assert capsys.readouterr().out.strip() == f"nothing listens on port {port}: nothing to stop"


# --- plots --------------------------------------------------------------------------------------------
def _inside(fig: Figure, artist: Artist) -> bool:
    box = artist.get_window_extent(fig.canvas.get_renderer())  # type: ignore[attr-defined]
    return box.x0 >= 0 and box.x1 <= fig.bbox.width and box.y0 >= 0


def test_heat_map_legends_fit_the_figure_and_the_over_cap_swatch_looks_like_the_cells(profile: Path) -> None:
    from powerctl.cli.plot import profile_figures
    from powerctl.records.profile import Profile

    data = json.loads(profile.read_text())
    data["points"] = [p for p in data["points"] if p["frequency_hz"] < 500e6]  # a narrow figure
    data["points"] = [p for p in data["points"] if not (p["batch_size"] == 8 and p["frequency_hz"] < 200e6)]
    narrow = Profile.from_dict(data, "narrow")
    relation = RelationVector.from_samples("cnn-tiny", "p", 0.7, {8: 600.0, 16: 800.0, 32: 1000.0})
    figs = profile_figures(narrow, power_cap_w=2.2, relation=relation)
    for name, fig in figs.items():
        (legend,) = fig.legends
        fig.canvas.draw()
        assert _inside(fig, legend), name
        labels = [t.get_text() for t in legend.get_texts()]
        assert "not profiled" in labels and "peak power over the cap (faded)" in labels
        ax = fig.axes[0]
        swatch = legend.legend_handles[labels.index("peak power over the cap (faded)")]
        faded = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_alpha() and not p.get_hatch()]
        image = ax.images[0]
        got = swatch.get_facecolor()[:3]

        def drawn(cell: Rectangle, image: Any = image) -> list[float]:  # its map colour under the veil
            x, y = cell.get_xy()
            rgb = image.cmap(image.norm(image.get_array()[round(y + 0.5), round(x + 0.5)]))[:3]
            return [c * 0.4 + 0.6 for c in rgb]

        nearest = min(max(abs(a - b) for a, b in zip(got, drawn(c), strict=True)) for c in faded)
        assert nearest < 0.1, (name, got)
        assert max(got) - min(got) > 0.02  # a tint of the map, not the grey of before


def test_fleet_summary_draws_one_map_per_cap_with_its_boundary_and_every_choice(tmp_path: Path) -> None:
    from matplotlib.collections import LineCollection

    from powerctl.cli.plot import BOUNDARY_GID
    from simulations.summary_figure import SUMMARY_FIGURE, fleet_figure

    figures: list[Figure] = []
    real = Figure.savefig

    def keep(self: Figure, *args: object, **kwargs: object) -> None:
        figures.append(self)
        real(self, *args, **kwargs)

    def rec(method: str, cap: float | None, b: int, mhz: float) -> dict:
        return dict(
            board="jetson-nano",
            device="sim:jetson-nano",
            node_key=f"board-{cap}",
            round=1,
            method=method,
            power_cap_w=cap,
            batch_size=b,
            frequency_hz=int(mhz * 1e6),
            device_s=1.0,
            profiling_s=0.0,
            energy_j=2.0,
        )

    records = [  # two methods in one cell under two caps: what drew "nonenone" before
        rec("ours", 3.0, 16, 614.4),
        rec("oracle", 3.0, 16, 614.4),
        rec("state-of-practice", 3.0, 16, 307.2),
        rec("ours", None, 16, 921.6),
        rec("oracle", None, 16, 921.6),
    ]
    results = {
        "run": {"config": {"batch-sizes": "8,16", "profile-samples": 4000}},
        "fleet": {"name": "maps", "model": "cnn-tiny", "target_accuracy": 0.7},
        "records": records,
        "methods": ["ours", "state-of-practice", "oracle"],
    }
    mp = pytest.MonkeyPatch()
    mp.setattr(Figure, "savefig", keep)
    try:
        path = fleet_figure(results, tmp_path)
    finally:
        mp.undo()
    assert path == tmp_path / SUMMARY_FIGURE and path.stat().st_size > 20_000
    (fig,) = figures
    maps = [ax for ax in fig.axes if ax.get_xlabel() == "GPU frequency (MHz)"]
    titles = [ax.get_title(loc="left") for ax in maps]
    assert titles == [
        "sim:jetson-nano, power cap 3 W: peak power P(b, f), the board model's",
        "sim:jetson-nano, no power cap: peak power P(b, f), the board model's",
    ]
    bounds = [
        [c for c in ax.collections if isinstance(c, LineCollection) and c.get_gid() == BOUNDARY_GID]
        for ax in maps
    ]
    assert len(bounds[0]) == 1 and bounds[1] == []  # the 3 W boundary on the 3 W panel only
    legends = [[t.get_text() for t in lg.get_texts()] for row in fig.subfigs for lg in row.subfigs[0].legends]
    assert "cap boundary (3.00 W)" in legends[0] and not any("cap boundary" in t for t in legends[1])
    for ax, want in zip(maps, (3, 2), strict=True):
        marks = [ln for ln in ax.lines if ln.get_label() in results["methods"]]
        xy = {(float(ln.get_xdata()[0]), float(ln.get_ydata()[0])) for ln in marks}
        assert len(marks) == want and len(xy) == want  # each mark in a place of its own
        assert not [t for t in ax.texts if t.get_text() in ("3", "none")]  # no cap labels under marks
