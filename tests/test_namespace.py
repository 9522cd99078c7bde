"""A user's Flower app with folders of generic names (`training/`, `utils/`, `models/`, `data/`) and its
own `task.py`, first on sys.path, imports the extension and runs a power-aware round (issue 27 item 1).

The wheel installs `powerfed` (the training core is `powerfed.training`) and the design card's five
packages, no generic top-level name: the user's `training.lr` stays the user's. Before, the project's own
top-level `training` shadowed it or was shadowed (`ImportError: cannot import name 'LR_RULES' from
'training.lr'`). The round goes through the public face only: the relation vector of the user's model on
the user's data, the plan, `power_aware_mod` around the user's train function with its `PowerSession`
on a simulated board, and the report in the reply.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

USER_APP = {
    "pyproject.toml": """
        [project]
        name = "myapp"
        version = "1.0.0"

        [tool.flwr.app]
        publisher = "me"

        [tool.flwr.app.components]
        serverapp = "myapp.server_app:app"
        clientapp = "myapp.client_app:app"
        """,
    "training/__init__.py": '"""The user\'s own training helpers (not the project\'s)."""\n',
    "training/lr.py": 'SCHEDULE = "the user\'s own cosine"\n',
    "utils/__init__.py": "",
    "utils/data.py": """
        import torch


        def make_data(n, seed):
            patterns = torch.randn(4, 1, 16, 16, generator=torch.Generator().manual_seed(0))
            g = torch.Generator().manual_seed(seed)
            y = torch.randint(0, 4, (n,), generator=g)
            return patterns[y] + torch.randn(n, 1, 16, 16, generator=g), y
        """,
    "models/__init__.py": 'WHO = "the user\'s models"\n',
    "data/__init__.py": 'WHO = "the user\'s data"\n',
    "task.py": """
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset

        from training.lr import SCHEDULE
        from utils.data import make_data


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(1, 8, 3, padding=1)
                self.fc = nn.Linear(8 * 8 * 8, 4)

            def forward(self, x):
                return self.fc(torch.flatten(nn.functional.max_pool2d(self.conv(x).relu(), 2), 1))


        def make_step(net):
            opt = torch.optim.SGD(net.parameters(), lr=0.05)

            def step(x, y):
                opt.zero_grad()
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()

            return step


        def train(net, loader, session):
            step = make_step(net)
            for x, y in loader:
                session.step(step, x, y)


        def trainset(partition_id):
            return TensorDataset(*make_data(256, seed=10 + partition_id))
        """,
}

ROUND = """
    import json
    import sys

    sys.path.insert(0, APP)  # the user's app first, as Flower puts it
    import data
    import models
    import training.lr
    import utils
    from task import SCHEDULE, Net, make_step, train, trainset
    from utils.data import make_data

    import powerfed
    from powerfed import (
        PowerAware,
        PowerSession,
        TrainInstructions,
        describe_node,
        estimate_relation,
        power_aware_mod,
        save_results,
    )

    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.supercore.task_identity import TaskIdentity
    from torch.utils.data import DataLoader

    rel = estimate_relation(
        Net, proxy=make_data(300, seed=1), target_accuracy=0.6, batch_sizes=[8, 16, 32],
        settings=powerfed.RelationSettings(seeds=[0], eval_every_samples=32, max_samples=3000),
        how=powerfed.RelationCompute(progress=False, use_cache=False),
    )
    plan = TrainInstructions(
        model=rel.model, relation_vector=rel, target_accuracy=0.6, num_classes=4, model_overrides={},
        profile_samples=128, profile_warmup=0, profile_steps=1,
    )


    def user_train(msg, context):
        net = Net()
        net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        data = trainset(context.node_config["partition-id"])
        example = next(iter(DataLoader(data, batch_size=8)))
        with PowerSession(model=net, make_step=make_step, example=example, train_examples=len(data)) as s:
            train(net, DataLoader(data, batch_size=s.batch_size, shuffle=True), s)
        content = RecordDict({
            "arrays": ArrayRecord(net.state_dict()),
            "metrics": MetricRecord({"num-examples": len(data)}),
        })
        return Message(content, reply_to=msg)


    USER_MODULES = ("training", "training.lr", "utils", "models", "data", "task")
    EXTENSION = ("powerfed", "powerctl", "strategies", "fl_client", "fl_server")
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, 0, 0
    context = Context(1, 1, {"partition-id": 1, "num-partitions": 2}, RecordDict(), {"fleet": FLEET})
    msg = Message(
        RecordDict({"arrays": ArrayRecord(Net().state_dict()), "config": plan.to_config()}),
        dst_node_id=1, message_type="train",
    )
    reply = power_aware_mod(msg, context, user_train)
    assert not reply.has_error(), reply.error.reason
    node = describe_node(Message(RecordDict(), dst_node_id=1, message_type="query"), context)
    report = dict(reply.content.config_records["report"])
    print(json.dumps({
        "report": report,
        "node": dict(node.content.config_records["node"]),
        "schedule": SCHEDULE,
        "user_modules": {m: sys.modules[m].__file__ for m in USER_MODULES},
        "powerfed_modules": {
            m: mod.__file__ for m, mod in sys.modules.items() if m.split(".")[0] in EXTENSION
        },
        "face": sorted(powerfed.__all__),
    }))
"""


def write_app(app: Path) -> None:
    for name, text in USER_APP.items():
        path = app / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")


def test_a_user_app_with_its_own_training_utils_and_task_imports_powerfed_and_runs_a_round(
    tmp_path: Path,
) -> None:
    app = tmp_path / "myapp"
    write_app(app)
    code = f"APP = {str(app)!r}\nFLEET = 'sim:jetson-nano@3.0, sim:jetson-tx2nx@3.5'\n" + textwrap.dedent(
        ROUND
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # powerfed as installed, nothing else
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=app,
        env={**env, "POWERFED_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])

    # the user's folders are the user's; the extension's modules are all the project's own
    assert out["schedule"] == "the user's own cosine"
    assert all(Path(f).is_relative_to(app) for f in out["user_modules"].values()), out["user_modules"]
    assert out["powerfed_modules"] and all(
        Path(f).is_relative_to(ROOT) and not Path(f).is_relative_to(app)
        for f in out["powerfed_modules"].values()
    )
    assert not any(m.split(".")[0] in ("training", "utils", "models", "data") for m in out["face"])

    # the round on the simulated board: its pair under the cap, and what it cost
    report, node = out["report"], out["node"]
    assert (report["device"], report["board"], report["power-cap-w"]) == (
        "sim:jetson-tx2nx",
        "jetson-tx2nx",
        3.5,
    )
    assert report["batch-size"] in (8, 16, 32) and report["frequency-hz"] > 0
    assert report["device-s"] > 0 and report["energy-j"] > 0 and report["peak-power-w"] > 0
    assert (
        report["samples"] == 256 and report["profiling-choice"] == "predicted"
    )  # a short task: confirmed in
    assert report["profiling-s"] == 0.0  # training, no profiling seconds beside it
    assert (node["node-key"], node["device"], node["power-cap-w"]) == ("partition-1", "sim:jetson-tx2nx", 3.5)
