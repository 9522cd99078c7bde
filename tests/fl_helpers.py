"""Small, fast settings shared by the Flower app tests (cnn-tiny, tiny budgets, the synthetic task)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from powerctl.records.relation import RelationVector
from powerfed.training.models import build_model
from strategies.protocol import TrainInstructions

FLEET = "sim:jetson-nano@3.0, sim:jetson-tx2nx@4.5, sim:jetson-nano@none"

RUN_CONFIG: dict[str, Any] = {
    "model": "cnn-tiny",
    "fleet": FLEET,
    "client-data": "synthetic-image",
    "client-data-seed": 2,
}


def relation(samples: dict[int, float] | None = None, model: str = "cnn-tiny") -> RelationVector:
    """A relation vector on the synthetic proxy: samples to the target per batch size."""
    return RelationVector.from_samples(model, "synthetic-image", 0.99, samples or {8: 300.0, 16: 400.0})


def instructions(**changes: Any) -> TrainInstructions:
    """cnn-tiny, batch sizes 8 and 16, a target it will not reach in 64 samples: the budget stops it.
    `relation_batch_sizes` with `relation_samples` give another relation vector."""
    sizes = changes.pop("relation_batch_sizes", [8, 16])
    samples = changes.pop("relation_samples", [300.0, 400.0])
    base = TrainInstructions(
        model="cnn-tiny",
        num_classes=10,
        model_overrides={},
        target_accuracy=0.99,
        relation_vector=relation(dict(zip(sizes, samples, strict=True))),
        lr_max=2e-3,
        budget_samples=64,
        eval_every_samples=32,
        eval_max_samples=64,
        profile_samples=512,
        profile_warmup=0,
        profile_steps=1,
    )
    return dataclasses.replace(base, **changes)


def initial_state(seed: int = 0) -> dict[str, torch.Tensor]:
    return build_model("cnn-tiny", 10, seed=seed).state_dict()
