"""What the last digits of a CPU training result depend on beyond its inputs, for the caches' keys: the
torch minor version, the intra-op thread count and the CPU's kernels (docs/results/fleets.md)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path
from typing import Any

import torch


@functools.cache
def cpu_identity() -> str:
    """torch's CPU capability (the vector kernels it dispatches to, e.g. AVX2, AVX512) and the CPU's model
    name, e.g. 'AVX2 AMD EPYC'."""
    capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    parts = [capability() if capability is not None else "unknown-capability", _cpu_model_name()]
    return " ".join(part for part in parts if part)


def _cpu_model_name() -> str:
    """The first 'model name' of /proc/cpuinfo (Linux), else what platform says."""
    try:
        with Path("/proc/cpuinfo").open(encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                name, sep, value = line.partition(":")
                if sep and name.strip() == "model name":
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def torch_minor() -> str:
    """torch's major.minor version, e.g. '2.13' (a patch release keeps the numerics)."""
    return ".".join(torch.__version__.split(".")[:2])


def numerics_key(threads: int) -> dict[str, Any]:
    """The fields of a cache key that a CPU result's floats depend on, with `threads` intra-op threads."""
    return {
        "torch": torch_minor(),
        "threads": threads,
        "cpu": cpu_identity(),
    }
