"""Fine-tune checkpoints: enough to continue an interrupted run to the result it would have had. One
safetensors file (no pickle) holds the named `Part`s' tensors and a JSON document of their plain values; it
is used only when its `identity` equals the new run's, else ignored with one line."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from powerctl.files.outputs import replacing

log = logging.getLogger(__name__)
"""`powerfed.training.checkpoint`: a checkpoint that cannot be used and is ignored (WARNING)."""

CHECKPOINT_FORMAT = "powerfed.finetune-checkpoint/2"


class CheckpointError(Exception):
    """A checkpoint file that cannot be read or does not hold what a checkpoint holds."""


@dataclass(frozen=True)
class Checkpointing:
    """Where and how often `fine_tune` saves, and what it must match to be resumed."""

    path: Path
    every_samples: int = 1024
    """Save at the first evaluation after every this many training samples (the power monitor is paused
    there anyway: checkpointing changes no measured number)."""
    key: str = ""
    """The caller's name for this work (e.g. a digest of a round's instructions): another key's is ignored."""


@dataclass
class Saved:
    """A checkpoint as read back: tensors by name, the JSON part, and where it was read from."""

    tensors: dict[str, torch.Tensor]
    state: dict[str, Any]
    path: Path


Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Part:
    """One piece of a run's resumable state: `take()` gives its tensors by name and a JSON value;
    `put(tensors, value)` sets the piece back to them."""

    take: Callable[[], tuple[Tensors, Any]]
    put: Callable[[Tensors, Any], None]


def save_parts(path: Path, identity: str, parts: dict[str, Part], *, finished: bool = False) -> None:
    """Write every part (tensors as `NAME.TENSOR`, JSON values under `NAME`) under `identity`;
    `finished`: the run is over and this is its end state (see `resumable`)."""
    tensors: Tensors = {}
    state: dict[str, Any] = {"identity": identity, "finished": finished}
    for name, part in parts.items():
        part_tensors, state[name] = part.take()
        tensors.update({f"{name}.{key}": t for key, t in part_tensors.items()})
    save(path, tensors, state)


def restore_parts(saved: Saved, parts: dict[str, Part]) -> None:
    """Put every part back from a checkpoint `save_parts` wrote, in the table's order."""
    for name, part in parts.items():
        prefix = f"{name}."
        tensors = {k[len(prefix) :]: t for k, t in saved.tensors.items() if k.startswith(prefix)}
        part.put(tensors, saved.state[name])


def state_digest(state: dict[str, torch.Tensor]) -> str:
    """sha256 over (name, dtype, shape, bytes) of every tensor, names sorted."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to("cpu").contiguous()
        h.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def identity_digest(identity: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def optimizer_parts(opt: torch.optim.Optimizer) -> tuple[Tensors, dict[str, Any]]:
    """An optimizer's state dict split into tensors (`IDX.NAME`) and plain JSON values."""
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, dict[str, Any]] = {}
    for idx, entry in sd["state"].items():
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"{idx}.{name}"] = value
            else:
                plain.setdefault(str(idx), {})[name] = value
    return tensors, {"param_groups": sd["param_groups"], "state": plain}


def optimizer_state(tensors: Tensors, parts: dict[str, Any]) -> dict[str, Any]:
    """The inverse of `optimizer_parts`: a state dict `Optimizer.load_state_dict` takes."""
    state: dict[int, dict[str, Any]] = {int(i): dict(v) for i, v in parts["state"].items()}
    for key, value in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else dict(g) for g in parts["param_groups"]]
    return {"state": state, "param_groups": groups}


def save(path: Path, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> None:
    """Write atomically and private (`powerctl.files.outputs.replacing`)."""
    from safetensors.torch import save_file

    canonical = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in tensors.items()}
    metadata = {"format": CHECKPOINT_FORMAT, "state": json.dumps(state, allow_nan=False)}
    with replacing(path, shared=False) as tmp:
        save_file(canonical, str(tmp), metadata=metadata)


def load(path: Path) -> Saved:
    """Read a checkpoint; anything unreadable is one CheckpointError line."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open is not a dict
    except (SafetensorError, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"{path}: not a readable checkpoint ({first})") from None
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not a {CHECKPOINT_FORMAT} file (format {meta.get('format')!r})")
    try:
        state = json.loads(meta["state"])
    except (KeyError, ValueError):
        raise CheckpointError(f"{path}: checkpoint metadata is missing or malformed") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: checkpoint metadata is not a JSON object")
    return Saved(tensors, state, path)


def resumable(ckpt: Checkpointing, identity: str) -> Saved | None:
    """The checkpoint at `ckpt.path` if it belongs to this run; otherwise None, with one line saying why
    (none for another work's end state: replacing it is the normal course)."""
    if not ckpt.path.is_file():
        return None
    try:
        saved = load(ckpt.path)
    except CheckpointError as exc:
        log.warning("checkpoint: %s; starting from the beginning", exc)
        return None
    if saved.state.get("identity") != identity:
        if saved.state.get("finished"):
            return None  # the end state of earlier work, kept for that work only: nothing is lost
        log.warning(
            "checkpoint: %s belongs to other work (another round, node, data or settings); "
            "ignored, starting from the beginning",
            ckpt.path,
        )
        return None
    return saved
