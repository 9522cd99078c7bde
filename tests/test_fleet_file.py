"""The fleet file of `python -m simulations run`: what it means, and one clear line for each bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fl_client.node import resolve_node
from simulations.fleet import FleetFileError, load_fleet_spec
from strategies.fleet import fleet_entry, load_fleet

ROOT = Path(__file__).resolve().parents[1]
FLEETS = ROOT / "simulations" / "fleets"

GOOD = """\
name: tiny
groups:
  - {device: sim:jetson-nano, power-cap-w: 3.0, count: 2}
  - {device: sim:jetson-tx2nx, power-cap-w: none}
  - {device: sim:jetson-tx2nx, power-cap-w: [[0, 3.5], [60, none]]}
task:
  model: cnn-tiny
  target-accuracy: 0.6
  batch-sizes: [16, 8]
partitioning: {scheme: dirichlet, alpha: 0.3}
rounds: 3
seeds: {run: 4, relation: [0]}
budget: {samples: 500}
scale: {profiles: predicted, real-share: 0.5}
"""


def write(tmp_path: Path, text: str, name: str = "fleet.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_fleet_file_becomes_boards_and_a_run_config(tmp_path: Path) -> None:
    spec = load_fleet_spec(write(tmp_path, GOOD))
    assert [b.label() for b in spec.boards] == [
        "sim:jetson-nano@3",
        "sim:jetson-nano@3",
        "sim:jetson-tx2nx@none",
        "sim:jetson-tx2nx@3.5",
    ]
    assert [b.group for b in spec.boards] == [0, 0, 1, 2]
    assert spec.boards[3].power_cap_schedule == ((0.0, 3.5), (60.0, None))
    assert spec.boards[3].cap_source is not None and spec.boards[0].cap_source is None
    # scale mode: the stand-ins do not train, so they cannot follow it; said plainly
    assert spec.notes and "stand-in clients" in spec.notes[0]
    assert spec.scale_mode and spec.settings.real_share == 0.5
    assert spec.settings.profile_source == "predicted"
    cfg = spec.run_config(tmp_path / "out", ["ours", "oracle"], tmp_path / "profiles")
    assert (
        cfg["batch-sizes"] == "8,16" and cfg["partitioning"] == "dirichlet" and cfg["dirichlet-alpha"] == 0.3
    )
    assert cfg["num-server-rounds"] == 3 and cfg["seed"] == 4 and cfg["relation-seeds"] == "0"
    assert cfg["methods"] == "ours,oracle" and cfg["budget-samples"] == 500
    # the ClientApp maps partition ids through the same file (strategies.fleet.load_fleet: one place)
    fleet = load_fleet(cfg["fleet"])
    assert [fleet_entry(fleet, i).label() for i in range(4)] == [b.label() for b in spec.boards]
    node = resolve_node({"partition-id": 3, "num-partitions": 4}, cfg)
    assert (node.device, node.power_cap_w) == ("sim:jetson-tx2nx", 3.5)


def test_the_shipped_fleets_parse() -> None:
    quick = load_fleet_spec(FLEETS / "quick.yaml")
    assert len(quick.boards) == 4 and {b.device for b in quick.boards} == {
        "sim:jetson-nano",
        "sim:jetson-tx2nx",
    }
    assert None in [b.power_cap_w for b in quick.boards] and len(quick.settings.methods) == 4
    assert len({b.power_cap_w for b in quick.boards}) == 4
    assert len(load_fleet_spec(FLEETS / "large.yaml").boards) >= 100
    paper = load_fleet_spec(FLEETS / "paper.yaml")
    assert {(b.device, b.power_cap_w) for b in paper.boards} >= {("sim:jetson-nano", None)}
    four = load_fleet_spec(FLEETS / "four-boards.yaml")
    assert four.name == "four-boards" and len(four.boards) == 4 and len(four.settings.methods) == 4


def test_the_default_fleet_is_the_paper_tables_grid_each_board_at_each_limit_and_uncapped() -> None:
    """Issue 40: the default verdict is the paper's setting (every board kind at each of its paper
    limits and without one), the limits bench/paper_tables.py charges its tables at: one list, checked."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import paper_setup
    finally:
        sys.path.remove(str(ROOT / "bench"))
    default, paper = load_fleet_spec(FLEETS / "default.yaml"), load_fleet_spec(FLEETS / "paper.yaml")
    grid = [
        (f"sim:{board}", cap) for board in paper_setup.BOARDS for cap in (*paper_setup.CAPS_W[board], None)
    ]
    assert [(b.device, b.power_cap_w) for b in default.boards] == grid
    assert [(b.device, b.power_cap_w) for b in paper.boards] == grid  # the text task's fleet: the same grid
    assert default.name == "default" and default.settings.methods == [
        "ours",
        "state-of-practice",
        "proxy-batch",
        "oracle",
    ]


def test_the_shipped_population_reads_its_trace_which_its_script_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    from strategies.population import run_population

    spec = load_fleet_spec(FLEETS / "population.yaml")
    trace = FLEETS / "traces" / "online-250.csv"
    assert spec.settings.availability_trace == str(trace) and len(spec.boards) == 250
    pop = run_population(spec.settings, tuple(b.availability for b in spec.boards))
    draw = pop.draw(1, range(250), 250)
    assert 25 < len(draw.available) < 250 and len(draw.sampled) == spec.settings.clients_per_round == 25
    script = importlib.util.spec_from_file_location("make_online", FLEETS / "traces" / "make_online.py")
    module = importlib.util.module_from_spec(script)
    script.loader.exec_module(module)
    monkeypatch.setattr(module, "__file__", str(tmp_path / "make_online.py"))
    module.main()
    assert (tmp_path / "online-250.csv").read_text() == trace.read_text()  # the file is the script's


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            GOOD.replace("power-cap-w: none}", 'power-cap-w: "abc"}'),
            "fleet.yaml: groups[1]: 'power-cap-w' must be a number of watts, none, a schedule",
        ),
        (
            GOOD.replace("power-cap-w: 3.0,", "power-cap-w: -1,"),
            "groups[0]: 'power-cap-w' must be a number of watts > 0 and ≤ 100000, or none, got -1",
        ),
        (
            GOOD.replace("[[0, 3.5], [60, none]]", "[[0, 3.5], [0, 4]]"),
            "groups[2]: 'power-cap-w'[1]: times must",
        ),
        (
            GOOD.replace("[[0, 3.5], [60, none]]", "[[5, 3.5]]"),
            "groups[2]: 'power-cap-w'[0]: times start at 0 s",
        ),
        (
            GOOD.replace("[[0, 3.5], [60, none]]", "[[0, 3.5, 1]]"),
            "groups[2]: 'power-cap-w'[0]: expected a step",
        ),
        (GOOD.replace("count: 2", "count: 0"), "groups[0]: 'count' must be an integer ≥ 1, got 0"),
        (GOOD.replace("count: 2", "cap: 2"), "groups[0]: unknown key 'cap'"),
        (
            GOOD.replace("power-cap-w: 3.0,", "power-cap-w: 0.5,"),
            "groups[0]: 'power-cap-w': a cap of 0.5 W is below anything sim:jetson-nano can run",
        ),
        (
            GOOD.replace("[[0, 3.5], [60, none]]", "[[0, 1.5], [60, 2.0]]"),
            "groups[2]: 'power-cap-w': a cap of 2 W is below anything sim:jetson-tx2nx can run",
        ),
        (
            GOOD.replace("sim:jetson-tx2nx, power-cap-w: none", "jetson, power-cap-w: none"),
            "groups[1]: 'device' must be a simulated board (sim:jetson-nano, sim:jetson-tx2nx), got 'jetson'",
        ),
        (GOOD.replace("model: cnn-tiny", "model: resnet9000"), "task: 'model' must be one of"),
        (
            GOOD.replace("target-accuracy: 0.6", "target-accuracy: 1.5"),
            "task: 'target-accuracy' must be a number in (0, 1], got 1.5",
        ),
        (
            GOOD.replace("batch-sizes: [16, 8]", "batch-sizes: [8, 8]"),
            "task: 'batch-sizes' must be distinct integers ≥ 1",
        ),
        (
            GOOD.replace("model: cnn-tiny", "model: cnn-tiny\n  modle: x"),
            "task: unknown key 'modle'; did you mean 'model'?",
        ),
        (
            GOOD.replace("  target-accuracy", "  target: cifar10:/nowhere\n  target-accuracy"),
            "task: 'target' names no such file or folder: /nowhere",
        ),
        (
            GOOD.replace("scheme: dirichlet", "scheme: skewed"),
            "partitioning: 'scheme' must be one of iid, dirichlet",
        ),
        (GOOD.replace("alpha: 0.3", "alpha: 0"), "partitioning: 'alpha' must be a number > 0"),
        (GOOD.replace("rounds: 3", "rounds: two"), "'rounds' must be an integer in [1, 100000], got 'two'"),
        (GOOD.replace("relation: [0]", "relation: 0"), "seeds: 'relation' must be distinct integers ≥ 0"),
        (GOOD.replace("samples: 500", "samples: -5"), "budget: 'samples' must be an integer in [0, 10"),
        (GOOD.replace("real-share: 0.5", "real-share: 2"), "scale: 'real-share' must be a number in [0, 1]"),
        (GOOD.replace("profiles: predicted", "profiles: guessed"), "scale: 'profiles' must be one of"),
        (GOOD + "colour: blue\n", "fleet.yaml: unknown key 'colour'"),
        (GOOD + "methods: [ours, magic]\n", "fleet.yaml: 'methods' must be distinct names from"),
        (GOOD.replace("groups:", "grops:"), "unknown key 'grops'"),
        ("task: {model: cnn-tiny}\n", "fleet.yaml: missing key 'groups'"),
        ("groups: []\ntask: {model: cnn-tiny}\n", "fleet.yaml: 'groups' must be a non-empty list"),
        ("groups: [unclosed\n", "not valid YAML"),
        ("- just a list\n", "fleet.yaml: must be a mapping"),
    ],
)
def test_bad_fleet_files_are_one_line_naming_the_key_and_its_place(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(FleetFileError) as err:
        load_fleet_spec(write(tmp_path, text))
    assert message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_without_out_the_results_go_to_runs_fleet_name_and_a_bad_file_writes_nothing(tmp_path: Path) -> None:
    from simulations.__main__ import default_fleet_out

    assert default_fleet_out(Path("simulations/fleets/default.yaml")) == Path("runs/fleet-default")
    bad = write(tmp_path, GOOD.replace("power-cap-w: none}", "power-cap-w: abc}"))
    proc = subprocess.run(
        [sys.executable, "-m", "simulations", "run", str(bad)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "'power-cap-w' must be" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


def test_the_command_line_says_it_in_one_line_with_exit_status_2(tmp_path: Path) -> None:
    bad = write(tmp_path, GOOD.replace("power-cap-w: none}", "power-cap-w: abc}"))
    proc = subprocess.run(
        [sys.executable, "-m", "simulations", "run", str(bad), "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "python -m simulations: error: fleet.yaml: groups[1]: 'power-cap-w' must be a number of watts, "
        "none, a schedule [[t_s, W], ...], trace:PATH[?end=repeat|clip&scale=X&timescale=X] or "
        "live:PATH[?poll=S], got 'abc'"
    ]
    assert "Traceback" not in proc.stderr and not (tmp_path / "out").exists()
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "simulations",
            "run",
            str(tmp_path / "nope.yaml"),
            "--out",
            str(tmp_path / "o"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "no such fleet file" in missing.stderr
    methods = subprocess.run(
        [sys.executable, "-m", "simulations", "run", str(bad), "--out", "o", "--methods", "ours,best"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert methods.returncode == 2 and "--methods" in methods.stderr and "'ours,best'" in methods.stderr


def test_a_schedule_of_one_value_is_constant_on_a_node_but_kept_in_a_fleet_file(tmp_path: Path) -> None:
    """A node config's one-value schedule is its constant cap; a fleet file keeps it as a schedule."""
    node = resolve_node({"device": "sim:jetson-nano", "power-cap-w": "[[0, 4], [60, 4]]", "data": "x"}, {})
    assert (node.power_cap_w, node.cap_source) == (4.0, None)
    fleet = write(tmp_path, "groups:\n  - {device: sim:jetson-nano, power-cap-w: [[0, 4], [60, 4]]}\n")
    (entry,) = load_fleet(str(fleet))
    assert entry.power_cap_w == 4.0 and entry.power_cap_schedule == ((0.0, 4.0), (60.0, 4.0))
    assert entry.cap_label() == "schedule [0s:4, 60s:4]"
    virtual = resolve_node({"partition-id": 0, "num-partitions": 1}, {"fleet": str(fleet)})
    assert virtual.cap_source == entry.cap_source
