"""examples/: one Flower app made power-aware, `quickstart-powerfed` (Adam, FedAvg), and three patches
that give the other apps: Flower's `quickstart-pytorch`-style app it was made from, and a FedProx app
(SGD with momentum and the proximal term in its own step, Flower's FedProx strategy, its relation vector
estimated with that step) in its plain and power-aware forms.

The patches still apply to the app as it stands; each power-aware app differs from its plain one by at
most 30 (40) lines; the plain ones train as they stand; the power-aware ones run with `flwr run` on two
simulated boards through the project's launcher (`python -m simulations flwr-run --app`: a private Flower
home, a SuperLink started and stopped by process id), and every node's row in its results.json says what
the round cost and the pair it chose.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from simulations.local_superlink import free_port, pids_listening_on

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
POWER_AWARE = EXAMPLES / "quickstart-powerfed"
APPS = {
    "quickstart-pytorch": ("quickstart-powerfed", "pytorch-to-powerfed.patch", "-R"),
    "quickstart-fedprox-powerfed": ("quickstart-powerfed", "powerfed-to-fedprox-powerfed.patch", ""),
    "quickstart-fedprox": ("quickstart-fedprox-powerfed", "fedprox-to-fedprox-powerfed.patch", "-R"),
}
"""The apps the patches give (name → the app it is made from, the patch in examples/, applied in reverse
or not), in the order they are made."""
PAIRS = [
    pytest.param("quickstart-pytorch", "quickstart-powerfed", "pytorchexample", 30, id="adam-fedavg"),
    pytest.param("quickstart-fedprox", "quickstart-fedprox-powerfed", "fedproxexample", 40, id="sgd-fedprox"),
]
"""(plain app, power-aware app, their package, the most lines the power-aware diff may change)."""
LAUNCHER = [sys.executable, "-m", "simulations", "flwr-run"]


def make_app(app: Path, patch: Path, reverse: str) -> None:
    """`patch` applied to the app folder `app` in place (its paths start a/APP/, b/APP/: -p2), exactly as
    asked (never guessed reversed), no fuzz, no backup or reject files: one that no longer applies fails."""
    exact = ["--force", "--fuzz=0", "--no-backup-if-mismatch", "--reject-file=-", "-s", "-p2"]
    args = ["patch", *exact, "-d", str(app), "-i", str(patch), *([reverse] if reverse else [])]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, (
        f"examples/{patch.name} does not apply to examples/quickstart-powerfed as it stands: remake it "
        f"(examples/README.md)\n{proc.stdout}{proc.stderr}"
    )


@pytest.fixture(scope="module")
def apps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every example app as a folder: quickstart-powerfed as it stands, the others made by their patches."""
    root = tmp_path_factory.mktemp("examples")
    made = {"quickstart-powerfed": POWER_AWARE}
    for name, (base, patch, reverse) in APPS.items():
        shutil.copytree(made[base], root / name, ignore=shutil.ignore_patterns("__pycache__", "runs"))
        make_app(root / name, EXAMPLES / patch, reverse)
        made[name] = root / name
    return made


def app_files(app: Path) -> dict[str, list[str]]:
    """The app's files (relative path → lines), what `flwr run` packs: no caches, no run outputs."""
    return {
        str(p.relative_to(app)): p.read_text(encoding="utf-8").splitlines()
        for p in sorted(app.rglob("*"))
        if p.is_file() and not {"__pycache__", "runs"} & set(p.parts)
    }


def changed_lines(a: dict[str, list[str]], b: dict[str, list[str]]) -> list[str]:
    """Every line removed or added going from `a` to `b` (as `diff -ru` counts them: '-' and '+' lines,
    a changed line counting twice), file by file; a file on one side only counts whole."""
    out: list[str] = []
    for name in sorted(set(a) | set(b)):
        diff = difflib.unified_diff(a.get(name, []), b.get(name, []), name, name, n=0, lineterm="")
        out += [f"{name}: {ln}" for ln in diff if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return out


@pytest.mark.parametrize("name", APPS)
def test_each_patch_makes_its_app_and_back(apps: dict[str, Path], name: str, tmp_path: Path) -> None:
    """A patch applied the other way to the app it made gives the app it was made from, to the byte."""
    base, patch, reverse = APPS[name]
    assert app_files(apps[name]) != app_files(apps[base])
    back = tmp_path / base
    shutil.copytree(apps[name], back)
    make_app(back, EXAMPLES / patch, "" if reverse else "-R")
    assert app_files(back) == app_files(apps[base])


def test_a_patch_that_no_longer_applies_is_named(tmp_path: Path) -> None:
    shutil.copytree(POWER_AWARE, tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__", "runs"))
    with pytest.raises(AssertionError, match=r"examples/pytorch-to-powerfed.patch does not apply"):
        make_app(tmp_path / "app", EXAMPLES / "pytorch-to-powerfed.patch", "")  # forward: already applied


@pytest.mark.parametrize(("plain_app", "aware_app", "package", "most"), PAIRS)
def test_each_power_aware_example_differs_from_its_plain_one_by_at_most_its_lines(
    apps: dict[str, Path], plain_app: str, aware_app: str, package: str, most: int
) -> None:
    plain, aware = app_files(apps[plain_app]), app_files(apps[aware_app])
    assert sorted(plain) == sorted(aware)  # the same app: the same files
    changed = changed_lines(plain, aware)
    assert 0 < len(changed) <= most, "\n".join(changed)
    # what it takes is what the howto walks through: the Mod, the session, the wrapper, the relation
    text = "\n".join(changed)
    for name in ("power_aware_mod", "PowerSession", "session.step", "PowerAware(", "estimate_relation"):
        assert name in text, name


def _run_python(app: Path, code: str, env: dict[str, str] | None = None) -> str:
    """`code` in a fresh interpreter with `app` first on sys.path."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=app,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc.stdout


@pytest.mark.parametrize(("plain_app", "aware_app", "package", "most"), PAIRS)
def test_each_plain_example_trains_and_evaluates_through_its_client_app(
    apps: dict[str, Path], plain_app: str, aware_app: str, package: str, most: int
) -> None:
    """The plain app's own train and evaluate functions, called as Flower calls them: one epoch on one
    partition learns the task (the data is seeded, so the power-aware run has something to learn)."""
    out = _run_python(
        apps[plain_app],
        f"""
        import sys
        sys.path.insert(0, ".")
        from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
        from flwr.supercore.task_identity import TaskIdentity
        from {package} import client_app
        from {package}.task import Net

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 0
        run_config = {{"local-epochs": 1, "batch-size": 32}}
        context = Context(1, 1, {{"partition-id": 0, "num-partitions": 2}}, RecordDict(), run_config)
        arrays = ArrayRecord(Net().state_dict())
        config = ConfigRecord({{"lr": 0.01, "proximal-mu": 0.1}})  # FedProx sends mu; FedAvg's app ignores it
        train = Message(RecordDict({{"arrays": arrays, "config": config}}), dst_node_id=1,
                        message_type="train")
        reply = client_app.train(train, context)
        evaluate = Message(RecordDict({{"arrays": reply.content["arrays"], "config": ConfigRecord({{}})}}),
                           dst_node_id=1, message_type="evaluate")
        before = client_app.evaluate(Message(RecordDict({{"arrays": arrays}}), dst_node_id=1,
                                             message_type="evaluate"), context)
        after = client_app.evaluate(evaluate, context)
        context.run_config["local-epochs"] = 0  # no step: a loss of 0, not a division by zero
        idle = client_app.train(train, context)
        print(reply.content["metrics"]["num-examples"], before.content["metrics"]["eval_acc"],
              after.content["metrics"]["eval_acc"], idle.content["metrics"]["train_loss"])
        """,
    )
    examples, before, after, idle = out.split()
    assert int(examples) == 800  # 2000 samples, half of them, 80% to train
    assert float(after) >= 0.8 > float(before) and float(idle) == 0.0


def test_an_app_folder_that_is_not_a_flower_app_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.run(
        [*LAUNCHER, "--app", str(tmp_path / "nope"), "--nodes", "2", "--port", str(port)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"python -m simulations: error: --app {tmp_path / 'nope'}: not a Flower app folder "
        "(no pyproject.toml in it); give the folder"
    ]
    assert not list(tmp_path.iterdir()) and not pids_listening_on(port)


@pytest.mark.slow
@pytest.mark.parametrize(("plain_app", "aware_app", "package", "most"), PAIRS)
def test_each_power_aware_example_runs_with_flwr_run_on_two_simulated_boards(
    apps: dict[str, Path], tmp_path: Path, plain_app: str, aware_app: str, package: str, most: int
) -> None:
    """`flwr run` of the example app as it stands, one round, two virtual nodes mapped by its `fleet`
    to a Jetson Nano capped at 3 W and a TX2 NX at 3.5 W: every node reports device seconds, energy,
    peak power and the (batch size, frequency) pair it chose under its cap; the app folder is left as
    it was and nothing listens on the SuperLink's port afterwards."""
    aware = apps[aware_app]
    before = app_files(aware)
    port = free_port()
    results = tmp_path / "results.json"
    run_config = f"num-server-rounds=1 results='{results}' model-path='{tmp_path / 'model.pt'}'"
    args = ["--app", str(aware), "--nodes", "2", "--port", str(port), "--run-config", run_config]
    proc = subprocess.run(
        [*LAUNCHER, *args, "--log", str(tmp_path / "flwr.log")],
        cwd=ROOT,
        env={**os.environ, "POWERFED_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=420,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == f"results: {results}"
    assert not pids_listening_on(port) and app_files(aware) == before

    data = json.loads(results.read_text())
    (rnd,) = data["rounds"]
    assert rnd["failed"] == [] and "unreported" not in rnd["summary"]
    rows = {c["node_key"]: c for c in rnd["clients"]}
    assert sorted(rows) == ["partition-0", "partition-1"]
    relation_batch_sizes = {8, 16, 32}
    for key, device, cap in (
        ("partition-0", "sim:jetson-nano", 3.0),
        ("partition-1", "sim:jetson-tx2nx", 3.5),
    ):
        row = rows[key]
        assert (row["device"], row["power_cap_w"], row["method"]) == (device, cap, "ours")
        assert row["device_s"] > 0 and row["energy_j"] > 0 and row["samples"] == 800
        assert row["peak_power_w"] > 0 and row["profiled_peak_power_w"] <= cap
        assert row["batch_size"] in relation_batch_sizes and row["frequency_hz"] > 0
        assert row["accuracy"] > 0 and row["pinned"] and not row["restored"]
    # its evaluate replies name their metrics as Flower's templates do (eval_acc, eval_loss)
    evaluated = {c["node_key"]: c for c in rnd["evaluation"]["clients"]}
    assert sorted(evaluated) == ["partition-0", "partition-1"]
    assert all(0.0 <= c["accuracy"] <= 1.0 and c["loss"] > 0.0 for c in evaluated.values()), evaluated
    nodes = {n["key"]: n for n in data["nodes"]}  # describe_node answered the wrapper's query
    assert nodes["partition-1"]["device"] == "sim:jetson-tx2nx" and nodes["partition-0"]["power_cap_w"] == 3.0
    assert (tmp_path / "model.pt").is_file()
    if package == "fedproxexample":  # the vector is the app's own step's (SGD, proximal term)
        assert data["run"]["relation"]["training_step"] == "the user's make_step"
