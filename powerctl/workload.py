"""What one training sample costs: FLOPs, activation memory, parameter memory.

Measured from the real torch model (not hand-written), so a simulated board charges a bigger
network more time, more power and more memory, and refuses a batch that does not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Workload:
    model: str
    input_shape: tuple[int, ...]
    flops_per_sample: float
    """Training FLOPs per sample: forward + backward."""
    activation_bytes_per_sample: float
    """Bytes autograd keeps per sample between forward and backward."""
    parameter_bytes: float
    optimizer_states: int = 2
    """Extra copies of the parameters the optimizer keeps (Adam/AdamW: 2)."""

    def memory_bytes(self, batch_size: int) -> float:
        """Training memory at `batch_size`: weights, grads, optimizer state, activations."""
        fixed = self.parameter_bytes * (2 + self.optimizer_states)
        return fixed + batch_size * self.activation_bytes_per_sample

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["input_shape"] = list(self.input_shape)
        return d


def measure_workload(
    model: Any,
    inputs: Any,
    targets: Any,
    loss_fn: Callable[[Any, Any], Any],
    name: str,
    optimizer_states: int = 2,
) -> Workload:
    """Count one forward+backward pass of `model` on a batch and divide by its size.

    `inputs`/`targets` is a small batch (2–4 samples) of the task's shape; the model is left
    unchanged (gradients are cleared again).
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    batch = int(inputs.shape[0])
    saved = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    was_training = model.training
    model.train()
    counter = FlopCounterMode(display=False)
    with counter:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = loss_fn(model(inputs), targets)
        loss.backward()  # counted too: the backward pass is most of a training step's work
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return Workload(
        model=name,
        input_shape=tuple(int(s) for s in inputs.shape[1:]),
        flops_per_sample=counter.get_total_flops() / batch,
        activation_bytes_per_sample=saved / batch,
        parameter_bytes=float(params),
        optimizer_states=optimizer_states,
    )
