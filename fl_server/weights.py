"""Model weights on disk: safetensors (no pickle) plus the metadata that rebuilds the network from the
file alone; `weights_hash` identifies a set of weights independently of the file layout."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from powerctl.files.outputs import replacing
from powerfed.training.checkpoint import state_digest
from powerfed.training.errors import DataError, ModelError
from powerfed.training.models import build_model, get_model_spec

WEIGHTS_FORMAT = "powerfed.weights/1"


@dataclass(frozen=True)
class WeightsMeta:
    model: str
    num_classes: int
    task: str
    overrides: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, str] = field(default_factory=dict)  # anything else the writer stored

    @classmethod
    def from_metadata(cls, meta: dict[str, str] | None, where: str) -> WeightsMeta:
        meta = dict(meta or {})
        if meta.get("format") != WEIGHTS_FORMAT:
            raise DataError(f"{where}: not a {WEIGHTS_FORMAT} weights file (format {meta.get('format')!r})")
        try:
            num_classes = int(meta.pop("num_classes"))
            overrides = json.loads(meta.pop("overrides", "{}"))
            model, task = meta.pop("model"), meta.pop("task")
        except (KeyError, ValueError) as exc:
            raise DataError(f"{where}: weights metadata is incomplete or malformed ({exc})") from None
        if not isinstance(overrides, dict):
            raise DataError(f"{where}: weights metadata 'overrides' must be a JSON object")
        meta.pop("format")
        return cls(model, num_classes, task, overrides, meta)


def save_weights(
    path: str | Path,
    model: nn.Module,
    *,
    model_name: str,
    num_classes: int,
    overrides: dict[str, Any] | None = None,
    extra: dict[str, str] | None = None,
) -> None:
    """Write `model`'s state dict, the metadata that rebuilds it (`WeightsMeta`) and a checksum."""
    from safetensors.torch import save_file

    # detached, contiguous CPU copies: safetensors refuses shared storage (tied embeddings)
    state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}
    metadata = {
        **(extra or {}),
        "format": WEIGHTS_FORMAT,
        "model": model_name,
        "num_classes": str(int(num_classes)),
        "task": get_model_spec(model_name).task,
        "overrides": json.dumps(overrides or {}, sort_keys=True),
        "sha256": weights_hash(state),
    }
    with replacing(path) as tmp:  # shared mode: weights are meant to be shared (safetensors makes 0600)
        save_file(state, str(tmp), metadata=metadata)


def load_weights(path: str | Path) -> tuple[dict[str, torch.Tensor], WeightsMeta]:
    """The state dict and metadata of a weights file; a missing or corrupt file is one DataError line."""
    from safetensors import SafetensorError, safe_open

    p = Path(path)
    if p.is_dir():
        raise DataError(f"{path}: is a folder; give the weights file in it (.safetensors)")
    if not p.is_file():
        raise DataError(f"{path}: no such weights file")
    try:
        with safe_open(str(p), framework="pt") as f:
            raw = dict(f.metadata() or {})
            stored_hash = raw.pop("sha256", None)
            meta = WeightsMeta.from_metadata(raw, str(path))
            state = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open is not a dict
    except (SafetensorError, OSError, ValueError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{path}: not a readable safetensors weights file ({msg})") from None
    if stored_hash is not None and weights_hash(state) != stored_hash:
        raise DataError(f"{path}: weights file is corrupt (checksum mismatch); re-create or re-copy it")
    return state, meta


def load_model(path: str | Path, *, expect_model: str | None = None) -> tuple[nn.Module, WeightsMeta]:
    """Rebuild the network a weights file describes and load it; a mismatch is one ModelError line."""
    state, meta = load_weights(path)
    if expect_model is not None and meta.model != expect_model:
        raise ModelError(f"{path}: weights are for model {meta.model!r}, not {expect_model!r}")
    model = build_model(meta.model, meta.num_classes, **meta.overrides)
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise ModelError(f"{path}: weights do not fit model {meta.model!r} ({first})") from None
    return model, meta


def weights_hash(weights: dict[str, torch.Tensor] | nn.Module | str | Path) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor, names sorted: layout-independent."""
    if isinstance(weights, (str, Path)):
        weights = load_weights(weights)[0]
    return state_digest(weights.state_dict() if isinstance(weights, nn.Module) else weights)
