"""Where torch tensors live: the one reader of `auto`, `cpu`, `cuda` and `cuda:INDEX`."""

from __future__ import annotations

import sys

from powerctl.errors import DeviceError

TORCH_SPEC_HELP = "auto (the first CUDA device torch sees, else the CPU), cpu, cuda, cuda:INDEX"


def is_torch_spec(spec: str) -> bool:
    """Whether `spec` is one of the torch forms (well formed or not)."""
    spec = spec.strip()
    return spec in ("auto", "cpu", "cuda") or spec.startswith("cuda:")


def check_torch_spec(spec: str) -> str:
    """`spec` in its one written form (`cuda` → `cuda:0`), checked without torch (one DeviceError line)."""
    text = spec.strip() if isinstance(spec, str) else ""
    if text in ("auto", "cpu"):
        return text
    if text == "cuda":
        return "cuda:0"
    if text.startswith("cuda:"):
        index = text[len("cuda:") :].strip()
        if index.isdigit():
            return f"cuda:{int(index)}"
        raise DeviceError(f"device {spec!r}: the CUDA index must be a number from 0, e.g. cuda:0")
    raise DeviceError(f"unknown torch device {spec!r}; use one of: {TORCH_SPEC_HELP}")


def resolve_torch_device(spec: str = "auto") -> str:
    """The torch device `spec` names here (`auto`: `cuda:0` when torch sees one, else `cpu`)."""
    form = check_torch_spec(spec)
    if form == "cpu":
        return "cpu"
    import torch

    cuda = torch.cuda.is_available()
    if form == "auto":
        return "cuda:0" if cuda else "cpu"
    if not cuda:
        build = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        raise DeviceError(
            f"device {form}: torch {torch.__version__} ({build}) sees no CUDA device here; "
            "use cpu, or auto (a GPU where there is one)"
        )
    index, count = int(form.split(":")[1]), torch.cuda.device_count()
    if index >= count:
        raise DeviceError(
            f"device {form}: torch sees {count} CUDA device(s) here (cuda:0 to cuda:{count - 1}); "
            "check CUDA_VISIBLE_DEVICES"
        )
    return form


def torch_device_arg(text: str) -> str:
    """`--device` of a command that trains on this machine: the device resolved, or argparse's one line."""
    import argparse

    try:
        return resolve_torch_device(text)
    except DeviceError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def free_accelerator_memory() -> None:
    """Hand torch's cached CUDA blocks back after an out-of-memory batch (nothing without CUDA)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
