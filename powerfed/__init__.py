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
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE: dict[str, str] = {
    # server: strategies and the plan they send
    "PowerAware": "strategies.power_aware",
    "PowerAwareFedAvg": "strategies.power_aware",
    "RoundObjective": "strategies.objectives",
    "EnergyUnderDeadline": "strategies.objectives",
    "TrainInstructions": "strategies.protocol",
    "ClientReport": "strategies.protocol",
    "save_results": "fl_server.results",
    # client: any ClientApp's train function, any loop
    "power_aware_mod": "fl_client.mod",
    "describe_node": "fl_client.mod",
    "PowerSession": "fl_client.session",
    "SessionError": "fl_client.session",
    "NodeSettings": "fl_client.node",
    # the relation vector, for the built-in models and for users' own
    "estimate_relation": "fl_server.relation",
    "RelationSettings": "fl_server.relation",
    "RelationCompute": "fl_server.relation",
    "UserFunctions": "powerfed.training.finetune",
    "register_model": "powerfed.training.models",
    "unregister_model": "powerfed.training.models",
    "model_names": "powerfed.training.models",
    "RelationVector": "powerctl.records.relation",
    # the device side: devices, profiling, selection
    "open_device": "powerctl.devices",
    "Device": "powerctl.devices.base",
    "PowerMonitor": "powerctl.profiling.monitor",
    "measure_workload": "powerctl.records.workload",
    "Profiler": "powerctl.profiling.profiler",
    "Profile": "powerctl.records.profile",
    "select": "powerctl.selection.joint",
    # errors a caller may catch: every one is a single line saying what to do
    "PowerctlError": "powerctl.errors",
    "ArgumentError": "powerctl.errors",
    "NoClientReported": "strategies.power_aware",
}

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
