"""`estimate_relation` with its settings given flat, as the tests write them: each keyword goes to its
record (`RelationSettings`, `UserFunctions`, `RelationCompute`), which checks it as a user's call would."""

from __future__ import annotations

import dataclasses
from typing import Any

from fl_server.relation import RelationCompute, RelationSettings, estimate_relation
from powerctl.records.relation import RelationVector
from powerfed.training.finetune_records import UserFunctions

RECORDS = {
    "settings": RelationSettings,
    "user": UserFunctions,
    "how": RelationCompute,
}


def flat_estimate(*args: Any, **flat: Any) -> RelationVector:
    """`estimate_relation(*args, target_accuracy=..., batch_sizes=..., seeds=..., cache_dir=..., ...)`."""
    parts: dict[str, dict[str, Any]] = {name: {} for name in RECORDS}
    call = {}
    for key, value in flat.items():
        owner = next((n for n, r in RECORDS.items() if key in {f.name for f in dataclasses.fields(r)}), None)
        if owner is None:
            call[key] = value
        else:
            parts[owner][key] = value
    records = {name: RECORDS[name](**given) for name, given in parts.items() if given}
    return estimate_relation(*args, **call, **records)
