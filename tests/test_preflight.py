"""Everything a run config names is checked before Flower starts (issue 28): `make run`'s pre-flight
(`python -m simulations flwr-run`) and `python -m fl_server.supervise` refuse, in one line with exit
status 2, what used to fail 45-51 s later in every client of every round (an unknown board, a real device
in a local simulation, a file as the fleet, a dataset path that is not there, a comma too many) or after
the pre-training (a results folder under /proc); nothing is started or written. The ServerApp and the
ClientApp refuse the same fleet with the same words: one function does it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from fl_server import supervise
from fl_server.run_config import RunConfigError, check_before_start, parse_server_config
from simulations import __main__ as simulations_cli
from simulations import launcher
from simulations.launcher import check_launch, check_simulation
from simulations.local_superlink import descendants
from strategies.fleet import MAX_BOARDS, NodeConfigError
from strategies.settings import read_settings

REPO = Path(__file__).resolve().parents[1]

BAD_FLWR_RUN = [
    ('fleet="sim:bogus@3"', "entry 'sim:bogus@3': no simulated board named 'bogus'"),
    ('fleet="host@3"', "entry 'host@3': must be a simulated board"),
    ('fleet="nvml:0@none"', "entry 'nvml:0@none': must be a simulated board"),
    ('fleet="quantum:0@3"', "unknown device spec 'quantum:0'"),
    ('fleet="{inputs}/profile.json"', "names a file, not a device (a fleet file is YAML"),
    ('fleet="sim:jetson-nano@3,"', "'fleet' entry 2 is empty"),
    ('fleet=",,"', "'fleet' entry 1 is empty"),
    ('fleet="sim:jetson-nano@"', "has no cap after '@'"),
    ('fleet="sim:jetson-nano@3 sim:jetson-tx2nx@4"', "got '3 sim:jetson-tx2nx@4'; entries are separated by"),
    pytest.param(
        "fleet='" + ",".join(["sim:jetson-nano@3"] * (MAX_BOARDS + 1)) + "'",
        f"has {MAX_BOARDS + 1} entries; a fleet has at most",
        id="fleet-of-too-many-boards",
    ),
    ('client-data="npz:/nonexist"', "'client-data': dataset spec 'npz:/nonexist': no such file or folder"),
    ('client-data="npz:no/such.npz"', f"no such file or folder {REPO}/no/such.npz"),
    ('proxy-data="text:/nonexist.txt"', "'proxy-data': dataset spec 'text:/nonexist.txt': no such file"),
    ('client-data="text:/dev/zero"', "'client-data': dataset spec 'text:/dev/zero': /dev/zero is neither"),
    ('pretrain-data="npz:"', "'pretrain-data' must be a dataset spec"),
    (
        'results-dir="/proc/powerfed-run"',
        "run config: 'results-dir' /proc/powerfed-run: cannot write in /proc",
    ),
    ('results-dir="{inputs}/profile.json"', "is a file, not a folder"),
    ('profile-cache="/proc/powerfed-profiles"', "run config: 'profile-cache' /proc/powerfed-profiles"),
    ("availability=0.0", "run config: population: no board is available in any of the 2 round(s)"),
    ('availability-trace="{inputs}/header-only.csv"', "has no window in rounds 1-2"),
    (
        'availability-trace="{inputs}/beyond.csv"',
        "names board(s) 7 the fleet does not have (its 4 boards are 0-3",
    ),
    ('availability-trace="/dev/zero"', "names /dev/zero, which is a character device, not a regular file"),
    (
        'availability-trace="{inputs}/fifo.csv"',
        "names {inputs}/fifo.csv, which is a FIFO, not a regular file",
    ),
    ('weights="{inputs}"', "'weights' names {inputs}, which is a folder, not a regular file; give a file"),
    ('weights="{inputs}/profile.json"', "run config: 'weights': "),
    ('relation="{inputs}/profile.json"', "run config: 'relation': "),
]


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """A folder of inputs, apart from what a run would write: a profile, as someone would pass it."""
    folder = tmp_path / "inputs"
    folder.mkdir()
    profile = {"schema": "powerctl.profile/2", "device": "sim:jetson-nano", "points": []}
    (folder / "profile.json").write_text(json.dumps(profile), encoding="utf-8")
    (folder / "header-only.csv").write_text("board,first-round,last-round\n", encoding="utf-8")
    os.mkfifo(folder / "fifo.csv")  # never opened: a FIFO without a writer would block a reader
    (folder / "beyond.csv").write_text("board,first-round,last-round\n0,1,\n7,1,2\n", encoding="utf-8")
    return folder


@pytest.fixture
def no_flower(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every way a run could start Flower, recorded instead (a test asserts none was taken)."""
    started: list[object] = []
    monkeypatch.setattr(launcher, "run_flwr", lambda *a, **k: started.append(a))
    monkeypatch.setattr(supervise.Supervisor, "submit", lambda self: started.append(self) or 1)
    return started


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else b"" for p in folder.rglob("*")}


def _one_line(err: str, prog: str, fragment: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") and fragment in lines[0], err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(("run_config", "fragment"), BAD_FLWR_RUN)
def test_flwr_run_refuses_what_its_run_config_names_before_flower_starts(
    tmp_path: Path,
    inputs: Path,
    no_flower: list[object],
    capsys: pytest.CaptureFixture[str],
    run_config: str,
    fragment: str,
) -> None:
    before, children = _snapshot(tmp_path), descendants(os.getpid())
    argv = ["flwr-run", "--run-config", run_config.format(inputs=inputs)]
    rc = simulations_cli.main(
        [*argv, "--out", str(tmp_path / "out"), "--log", str(tmp_path / "logs/flwr.log")]
    )
    out, err = capsys.readouterr()
    assert rc == 2 and not out
    _one_line(err, simulations_cli.PROG, fragment.format(inputs=inputs))
    assert no_flower == [] and descendants(os.getpid()) == children
    assert _snapshot(tmp_path) == before  # no results folder, no log, the input untouched


def test_a_results_folder_under_proc_as_the_flag_is_refused_too(
    tmp_path: Path, no_flower: list[object], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["flwr-run", "--out", "/proc/powerfed-run", "--log", str(tmp_path / "flwr.log")]
    assert simulations_cli.main(argv) == 2
    _one_line(capsys.readouterr().err, simulations_cli.PROG, "/proc/powerfed-run: cannot write in /proc")
    assert no_flower == [] and list(tmp_path.iterdir()) == []


def test_the_default_run_passes_the_pre_flight_and_writes_nothing(tmp_path: Path) -> None:
    plan = check_launch(4, "", tmp_path / "flwr", tmp_path / "flwr.log")
    assert plan.overrides == {"results-dir": str((tmp_path / "flwr").resolve())}
    fleet_file = check_launch(
        2, 'fleet="simulations/fleets/quick.yaml" seed=1', tmp_path / "a", tmp_path / "b"
    )
    assert fleet_file.overrides["fleet"] == "simulations/fleets/quick.yaml"
    assert list(tmp_path.iterdir()) == []


def test_a_relative_dataset_path_is_checked_and_passed_on_from_the_app_folder(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cifar").mkdir()
    overrides = {"client-data": "cifar10:data/cifar", "seed": 3}
    cfg = read_settings(overrides)
    passed = check_simulation(cfg, overrides, tmp_path)
    assert passed == {"client-data": f"cifar10:{tmp_path}/data/cifar", "seed": 3}
    with pytest.raises(RunConfigError, match=r"'client-data': dataset spec 'cifar10:data/cifar': no such"):
        check_simulation(cfg, overrides, tmp_path / "elsewhere")


@pytest.mark.parametrize(
    ("fleet", "fragment"),
    [
        ("sim:bogus@3", "no simulated board named 'bogus'"),
        ("sim:jetson-nano@3,", "entry 2 is empty"),
        ("/tmp/profile.json", "names a file, not a device"),
        ("nvml:x@none", "the NVML index must be a number"),
    ],
)
def test_the_serverapp_and_the_clientapp_refuse_a_bad_fleet_with_the_same_words(
    fleet: str, fragment: str
) -> None:
    from fl_client.node import resolve_node

    with pytest.raises(RunConfigError) as server:
        parse_server_config({"fleet": fleet})
    with pytest.raises(NodeConfigError) as client:
        resolve_node({"partition-id": 0, "num-partitions": 2}, {"fleet": fleet})
    assert fragment in str(server.value) and str(server.value) == str(client.value)


def test_a_real_device_is_a_deployment_fleet_entry_but_not_a_local_simulation_board() -> None:
    cfg = parse_server_config({"fleet": "nvml:0@none, jetson@5"})  # deployed nodes may take these
    with pytest.raises(RunConfigError, match="'fleet' entry 'nvml:0@none': must be a simulated board"):
        check_simulation(cfg, {})


def test_a_fleet_file_names_its_group_when_a_device_is_no_spec(tmp_path: Path) -> None:
    from strategies.fleet import load_fleet_file

    path = tmp_path / "fleet.yaml"
    path.write_text("boards:\n  - {device: sim:jetson-nano}\n  - {device: sim:bogus, count: 2}\n")
    with pytest.raises(NodeConfigError, match=r"boards\[1\]: 'device': no simulated board named 'bogus'"):
        load_fleet_file(path)


# --- fl_server.supervise --------------------------------------------------------------------------------
@pytest.fixture
def flwr_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Flower home with a connection `deploy` to a port where nothing listens."""
    home = tmp_path / "flwr-home"
    home.mkdir()
    (home / "config.toml").write_text('[superlink.deploy]\naddress = "127.0.0.1:9"\ninsecure = true\n')
    monkeypatch.setenv("FLWR_HOME", str(home))
    return home


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (
            ["--results-dir", "/proc/powerfed-run"],
            "run config: 'results-dir' /proc/powerfed-run: cannot write",
        ),
        (["--results-dir", "{home}/config.toml"], "config.toml: is a file, not a folder"),
        (
            ["--results-dir", "{out}", "--run-config", "target-accuracy=2"],
            "'target-accuracy' must be a number",
        ),
        (["--results-dir", "{out}", "--run-config", "num-server-rounds=0"], "'num-server-rounds' must be"),
        (["--results-dir", "{out}", "--run-config", "fleet='sim:bogus@3'"], "no simulated board named"),
        (["--results-dir", "{out}", "--run-config", "fleet=',,'"], "'fleet' entry 1 is empty"),
        (
            ["--results-dir", "{out}", "--run-config", "num-server-roundz=3"],
            "did you mean 'num-server-rounds'",
        ),
        (["--results-dir", "{out}", "--run-config", "model=cnn-tiny"], 'is quoted: model="cnn-tiny"'),
        (["--results-dir", "{out}", "--run-config", "results-dir='/tmp/x'"], "give the results folder as"),
        (["--results-dir", "{out}", "--app", "{home}"], "not a Flower app (Cannot find pyproject.toml"),
        (["--results-dir", "{out}", "--wait", "-5"], "argument --wait"),
        (["--results-dir", "{out}", "--wait", "nan"], "argument --wait"),
        (["--results-dir", "{out}", "--wait=-5"], "argument --wait"),
    ],
)
def test_supervise_checks_the_run_before_it_submits_it(
    tmp_path: Path,
    flwr_home: Path,
    no_flower: list[object],
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    fragment: str,
) -> None:
    before = _snapshot(tmp_path)
    argv = [a.format(home=flwr_home, out=tmp_path / "out") for a in ["deploy", "--app", str(REPO), *extra]]
    with pytest.raises(SystemExit) as done:  # main returns 2; a bad flag is argparse's exit 2
        raise SystemExit(supervise.main(argv))
    assert done.value.code == 2
    out, err = capsys.readouterr()
    assert not out
    _one_line(err, supervise.PROG, fragment)
    assert no_flower == [] and _snapshot(tmp_path) == before


def test_supervise_submits_a_good_run_with_its_results_folder(
    tmp_path: Path, flwr_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = supervise.build_parser().parse_args(
        ["deploy", "--results-dir", str(tmp_path / "it's here"), "--run-config", "num-server-rounds=3"]
    )
    sup = supervise.checked_supervisor(args)
    assert sup.run_config == f'num-server-rounds=3 results-dir="{tmp_path}/it\'s here"'
    cfg, merged = check_before_start({"num-server-rounds": 3}, REPO)
    assert cfg.num_server_rounds == merged["num-server-rounds"] == 3
    assert not (tmp_path / "it's here").exists()


FLOWER_REFUSAL = json.dumps(
    {
        "success": False,
        "error-message": "\nFlower configuration not found. Created default configuration at "
        "/h/config.toml\n\n\nAn unexpected error occurred while reading the Flower configuration file "
        "(/h/config.toml). SuperLink connection 'nosuch' not found in the Flower configuration file "
        "(/h/config.toml).",
    },
    indent=2,
)
"""What `flwr run . nosuch --format json` printed (Flower 1.41, exit status 0)."""


def test_a_refusal_is_flowers_message_in_one_line_not_its_json() -> None:
    line = supervise.refusal(supervise._json_object(FLOWER_REFUSAL), FLOWER_REFUSAL, 0)
    assert line.startswith("An unexpected error occurred while reading the Flower configuration file")
    assert line.endswith(
        "SuperLink connection 'nosuch' not found in the Flower configuration file (/h/config.toml)."
    )
    assert "{" not in line and "\n" not in line
    assert supervise.refusal(None, "Traceback\n  boom\n", 1) == "exit status 1, Traceback boom"


def test_flower_refusing_a_submission_is_one_line(tmp_path: Path, flwr_home: Path) -> None:
    sup = supervise.Supervisor(REPO, "nosuch", "num-server-rounds=1")  # a real `flwr run`, refused
    with pytest.raises(supervise.PowerctlError) as err:
        sup.submit()
    message = str(err.value)
    assert message.startswith("flwr run did not start the run: ") and "'nosuch' not found" in message
    assert "\n" not in message and "{" not in message and "success" not in message
