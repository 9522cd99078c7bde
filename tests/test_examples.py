"""examples/: two Flower apps, each with its power-aware twin (issue 27 item 6, issue 37): a
`quickstart-pytorch`-style app (Adam, FedAvg) and a FedProx app (SGD with momentum and the proximal
term in its own step, Flower's FedProx strategy, its relation vector estimated with that step).

Each power-aware version differs from its plain one by at most 30 (40) lines; the plain ones train as they
stand; the power-aware ones run with `flwr run` on two simulated boards through the project's launcher
(`python -m simulations flwr-run --app`: a private Flower home, a SuperLink started and stopped by
process id), and every node's row in its results.json says what the round cost and the pair it chose.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from simulations.local_superlink import free_port, pids_listening_on

ROOT = Path(__file__).resolve().parents[1]
PLAIN = ROOT / "examples" / "quickstart-pytorch"
POWER_AWARE = ROOT / "examples" / "quickstart-powerfed"
FEDPROX = ROOT / "examples" / "quickstart-fedprox"
FEDPROX_AWARE = ROOT / "examples" / "quickstart-fedprox-powerfed"
PAIRS = [
    pytest.param(PLAIN, POWER_AWARE, "pytorchexample", 30, id="adam-fedavg"),
    pytest.param(FEDPROX, FEDPROX_AWARE, "fedproxexample", 40, id="sgd-fedprox"),
]
"""(plain app, power-aware app, their package, the most lines the power-aware diff may change)."""
LAUNCHER = [sys.executable, "-m", "simulations", "flwr-run"]


def app_files(app: Path) -> dict[str, list[str]]:
    """The app's files (relative path → lines), what `flwr run` packs: no caches, no run outputs."""
    return {
        str(p.relative_to(app)): p.read_text(encoding="utf-8").splitlines()
        for p in sorted(app.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def changed_lines(a: dict[str, list[str]], b: dict[str, list[str]]) -> list[str]:
    """Every line removed or added going from `a` to `b` (as `diff -ru` counts them: '-' and '+' lines,
    a changed line counting twice), file by file; a file on one side only counts whole."""
    out: list[str] = []
    for name in sorted(set(a) | set(b)):
        diff = difflib.unified_diff(a.get(name, []), b.get(name, []), name, name, n=0, lineterm="")
        out += [f"{name}: {ln}" for ln in diff if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    return out


@pytest.mark.parametrize(("plain_app", "aware_app", "package", "most"), PAIRS)
def test_each_power_aware_example_differs_from_its_plain_one_by_at_most_its_lines(
    plain_app: Path, aware_app: Path, package: str, most: int
) -> None:
    plain, aware = app_files(plain_app), app_files(aware_app)
    assert sorted(plain) == sorted(aware)  # the same app: the same files
    changed = changed_lines(plain, aware)
    assert 0 < len(changed) <= most, "\n".join(changed)
    # what it takes is what the howto walks through: the Mod, the session, the wrapper, the relation
    text = "\n".join(changed)
    for name in ("power_aware_mod", "PowerSession", "session.step", "PowerAware(", "estimate_relation"):
        assert name in text, name


def _run_python(app: Path, code: str, env: dict[str, str] | None = None) -> str:
    """`code` in a fresh interpreter with `app` first on sys.path (both examples are `pytorchexample`)."""
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
    plain_app: Path, aware_app: Path, package: str, most: int
) -> None:
    """The plain app's own train and evaluate functions, called as Flower calls them: one epoch on one
    partition learns the task (the data is seeded, so the power-aware run has something to learn)."""
    out = _run_python(
        plain_app,
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
    tmp_path: Path, plain_app: Path, aware_app: Path, package: str, most: int
) -> None:
    """`flwr run` of the example app as it stands, one round, two virtual nodes mapped by its `fleet`
    to a Jetson Nano capped at 3 W and a TX2 NX at 3.5 W: every node reports device seconds, energy,
    peak power and the (batch size, frequency) pair it chose under its cap; the app folder is left as
    it was and nothing listens on the SuperLink's port afterwards."""
    before = app_files(aware_app)
    port = free_port()
    results = tmp_path / "results.json"
    run_config = f"num-server-rounds=1 results='{results}' model-path='{tmp_path / 'model.pt'}'"
    args = ["--app", str(aware_app), "--nodes", "2", "--port", str(port), "--run-config", run_config]
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
    assert not pids_listening_on(port) and app_files(aware_app) == before

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
        assert row["device_seconds"] > 0 and row["energy_j"] > 0 and row["samples"] == 800
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
