"""powerfed: power-aware federated fine-tuning on edge GPUs, as a Flower extension.

The one public face users import. Each name is resolved on first use (PEP 562), so `import powerfed`
costs nothing until a name is touched, and the packages behind it keep their one-way imports
(docs/design/layout.md). What each name is: docs/reference/api.md.

Server side::

    from powerfed import PowerAware, TrainInstructions, estimate_relation
    rel = estimate_relation(MyCNN, proxy=(x, y), target_accuracy=0.8, batch_sizes=[8, 16, 32])
    strategy = PowerAware(FedAdam(...), TrainInstructions.for_relation(rel, num_classes=10))

Client side, around the user's own loop::

    app = ClientApp(mods=[power_aware_mod])
    with PowerSession(model=net, make_step=make_step, example=(x, y), train_examples=n) as session:
        ...  # the loop, batches of session.batch_size, each step through session.step(step, x, y)

Device side::

    from powerfed import open_device, Profiler, select

A plan from a relation vector (run as a doctest by tests/test_docs.py):

>>> import powerfed
>>> rel = powerfed.RelationVector.from_samples("cnn-tiny", "proxy", 0.5, {8: 300.0, 16: 400.0})
>>> list(zip(rel.batch_sizes, rel.relation))
[(8, 0.75), (16, 1.0)]
>>> plan = powerfed.TrainInstructions.for_relation(rel, num_classes=10)
>>> plan.model, plan.method, plan.target_accuracy
('cnn-tiny', 'ours', 0.5)
>>> powerfed.TrainInstructions.for_relation(rel, num_classes=10, target_accuracy=0.9)  # doctest: +ELLIPSIS
Traceback (most recent call last):
  ...
powerctl.errors.ArgumentError: TrainInstructions.for_relation: 'target_accuracy' is the relation ...
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the face, declared once: type checkers read these; at run time `__getattr__` does
    from fl_client.mod import describe_node as describe_node
    from fl_client.mod import power_aware_mod as power_aware_mod
    from fl_client.node import NodeSettings as NodeSettings
    from fl_client.session import PowerSession as PowerSession
    from fl_client.session import RoundContext as RoundContext
    from fl_client.session import SessionError as SessionError
    from fl_server.relation import RelationCompute as RelationCompute
    from fl_server.relation import RelationSettings as RelationSettings
    from fl_server.relation import estimate_relation as estimate_relation
    from fl_server.results import save_results as save_results
    from powerctl.devices import open_device as open_device
    from powerctl.devices.base import Device as Device
    from powerctl.errors import ArgumentError as ArgumentError
    from powerctl.errors import PowerctlError as PowerctlError
    from powerctl.profiling.monitor import PowerMonitor as PowerMonitor
    from powerctl.profiling.profiler import Profiler as Profiler
    from powerctl.records.profile import Profile as Profile
    from powerctl.records.relation import RelationVector as RelationVector
    from powerctl.records.workload import measure_workload as measure_workload
    from powerctl.selection.joint import select as select
    from powerfed.training.finetune_records import UserFunctions as UserFunctions
    from powerfed.training.models import model_names as model_names
    from powerfed.training.models import register_model as register_model
    from powerfed.training.models import unregister_model as unregister_model
    from strategies.fedavg import PowerAwareFedAvg as PowerAwareFedAvg
    from strategies.objectives import EnergyUnderDeadline as EnergyUnderDeadline
    from strategies.objectives import NodeWaits as NodeWaits
    from strategies.objectives import RoundObjective as RoundObjective
    from strategies.power_aware import PowerAware as PowerAware
    from strategies.protocol import TrainInstructions as TrainInstructions
    from strategies.report import ClientReport as ClientReport
    from strategies.rounds import NoClientReported as NoClientReported


def _where() -> dict[str, str]:
    """Each name of the TYPE_CHECKING imports above → its module (this file's source, parsed once)."""
    block = next(n for n in ast.parse(Path(__file__).read_text("utf-8")).body if isinstance(n, ast.If))
    return {a.name: str(i.module) for i in block.body if isinstance(i, ast.ImportFrom) for a in i.names}


_WHERE = _where()
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    try:
        module = _WHERE[name]
    except KeyError:
        raise AttributeError(f"module 'powerfed' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
