"""What one training step costs (FLOPs, memory, kernels, memory traffic), measured from the torch model."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any
from unittest import mock

from powerctl.errors import ArgumentError, first_line
from powerctl.files.mapping import Integer, Number, check_arguments, check_fields, field_kinds, kind_field

AMOUNT, COUNT = Number(0.0), Integer(0)


@dataclass(frozen=True)
class Workload:
    model: str
    input_shape: tuple[int, ...]  # a list given is made a tuple
    flops_per_sample: float = kind_field(AMOUNT)  # training FLOPs per sample: forward + backward
    activation_bytes_per_sample: float = kind_field(AMOUNT)  # kept by autograd for backward, weights left out
    parameter_bytes: float = kind_field(AMOUNT)
    optimizer_states: int = kind_field(COUNT, 2)  # parameter copies the optimizer keeps (Adam: 2)
    kernels_per_step: int = kind_field(COUNT, 0)  # compute ops (≈ kernel launches) per pass; 0: not measured
    traffic_bytes_per_sample: float = kind_field(AMOUNT, 0.0)  # written by the pass, weight grads left out
    parameter_tensors: int = kind_field(COUNT, 0)  # a per-tensor optimizer launches kernels for each

    def __post_init__(self) -> None:
        """A hand-made workload holds what a counted one does (no NaN or negative count)."""
        check_fields(self, "Workload", field_kinds(self))
        if isinstance(self.input_shape, list):
            object.__setattr__(self, "input_shape", tuple(self.input_shape))

    def memory_bytes(self, batch_size: int) -> float:
        """Training memory at `batch_size`: weights, grads, optimizer state, activations."""
        fixed = self.parameter_bytes * (2 + self.optimizer_states)
        return fixed + batch_size * self.activation_bytes_per_sample

    def to_dict(self) -> dict[str, Any]:
        """As a profile keeps it (`extra["workload"]`); `Workload(**d)` reads it back."""
        return asdict(self) | {"input_shape": list(self.input_shape)}


def check_model(where: str, model: Any) -> None:
    """A model to measure or train: an nn.Module whose tensors hold data (none on the meta device)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ArgumentError(f"{where}: 'model' must be a torch nn.Module, got {type(model).__name__}")
    for what, tensors in (("parameters", model.named_parameters()), ("buffers", model.named_buffers())):
        meta = [name for name, t in tensors if t.is_meta]
        if meta:
            more = f" and {len(meta) - 1} more" if len(meta) > 1 else ""
            raise ArgumentError(
                f"{where}: 'model' has {what} on the meta device (not materialized): {meta[0]}{more}; "
                "build it outside torch.device('meta'), or model.to_empty(device=...) and load its weights"
            )


MODEL_INPUT_ERRORS = (RuntimeError, ValueError, TypeError, IndexError)
"""What torch (or a user's loss) raises for a batch a model cannot take: another shape, dtype or device."""


def measure_workload(
    model: Any,
    inputs: Any,
    targets: Any,
    loss_fn: Callable[[Any, Any], Any],
    name: str,
    optimizer_states: int = 2,
) -> Workload:
    """Count one forward+backward pass of `model` on a batch and divide by its size.

    `inputs`/`targets`: a small batch of the task's shape; the model is left unchanged."""
    import torch

    where = "measure_workload"  # each argument refused in one ArgumentError line
    check_model(where, model)
    for what, t in (("inputs", inputs), ("targets", targets)):
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or len(t) == 0:
            raise ArgumentError(
                f"{where}: {what!r} must be a batch tensor of one sample or more, got {t!r:.80}"
            )
    if len(inputs) != len(targets):
        raise ArgumentError(f"{where}: 'inputs' has {len(inputs)} samples, 'targets' {len(targets)}")
    if not callable(loss_fn):
        raise ArgumentError(f"{where}: 'loss_fn' must be callable (outputs, targets) → loss, got {loss_fn!r}")
    states = check_arguments(where, optimizer_states=(optimizer_states, Integer(0)))["optimizer_states"]
    batch = int(inputs.shape[0])
    param_storages = {_storage(p).data_ptr() for p in model.parameters()}
    saved_storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        # one storage counted once (a ReLU output saved by two nodes is one buffer), weights never
        storage = _storage(t)
        ptr = storage.data_ptr()
        if ptr not in param_storages:
            saved_storages[ptr] = storage.nbytes()
        return t

    was_training = model.training
    model.train()
    counter = _flop_counter()
    # torch 1.13's dispatch modes fail on a tensor times a Python number when saved-tensor hooks are on
    # ("detach returned invalid type float"): there the saved tensors are counted in a pass of their own;
    # and its linear backward writes a weight's gradient transposed (a view turns it back)
    together = hasattr(torch.Tensor, "untyped_storage")
    weight_shapes = {tuple(p.shape) for p in model.parameters()}
    if not together:
        weight_shapes |= {shape[::-1] for shape in weight_shapes if len(shape) == 2}
    ops = _op_counter(weight_shapes, count_flops=counter is None)
    saved = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
    with counter or contextlib.nullcontext(), ops:
        with saved if together else contextlib.nullcontext():
            try:  # a batch the model or loss refuses is one ArgumentError line
                loss = loss_fn(model(inputs), targets)
            except getattr(torch.cuda, "OutOfMemoryError", ()):  # torch ≥ 1.13
                raise
            except MODEL_INPUT_ERRORS as exc:
                raise ArgumentError(
                    f"{where}: the model and loss cannot take the batch (inputs {tuple(inputs.shape)}, "
                    f"targets {tuple(targets.shape)}): {first_line(exc)}"
                ) from None
        loss.backward()  # counted too: the backward pass is most of a training step's work
        del loss
    if not together:
        with saved:
            loss = loss_fn(model(inputs), targets)
        del loss
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    params = list(model.parameters())
    return Workload(
        model=name,
        input_shape=tuple(int(s) for s in inputs.shape[1:]),
        flops_per_sample=(ops.flops if counter is None else counter.get_total_flops()) / batch,
        activation_bytes_per_sample=sum(saved_storages.values()) / batch,
        parameter_bytes=float(sum(p.numel() * p.element_size() for p in params)),
        optimizer_states=states,
        kernels_per_step=ops.kernels,
        traffic_bytes_per_sample=ops.written_bytes / batch,
        parameter_tensors=len(params),
    )


def _storage(t: Any) -> Any:
    """The tensor's storage (`untyped_storage` from torch 2.0; `storage()` before)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def _flop_counter() -> Any:
    """torch's FlopCounterMode with `_flop_fixes`; None where torch has none (1.13: `_FALLBACK_FLOPS`)."""
    try:
        from torch.utils import flop_counter as fc
    except ImportError:
        return None
    with mock.patch.dict(fc.flop_registry, _flop_fixes()):  # torch's table, put back after
        return fc.FlopCounterMode(display=False)  # copies the table on construction: fixed first


def _op_counter(parameter_shapes: set[tuple[int, ...]], count_flops: bool = False) -> Any:
    """A dispatch mode counting compute ops (≈ kernel launches), the bytes they write and, with
    `count_flops`, the `_FALLBACK_FLOPS`."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.kernels = 0
            self.written_bytes = 0
            self.flops = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            formula = _FALLBACK_FLOPS.get(str(func.overloadpacket).split(".")[-1]) if count_flops else None
            if formula is not None:
                self.flops += formula(args, out)
            if getattr(func, "is_view", False) or "detach" in func.__name__:
                return out
            outs = out if isinstance(out, (tuple, list)) else (out,)
            tensors = [t for t in outs if isinstance(t, torch.Tensor)]
            if tensors:
                self.kernels += 1
                self.written_bytes += sum(
                    t.numel() * t.element_size() for t in tensors if tuple(t.shape) not in parameter_shapes
                )
            return out

    return OpCounter()


# FLOPs where torch has no flop counter (torch 1.13: docs/jetson.md).


def _conv_flop_count(x_shape: Any, w_shape: Any, out_shape: Any, transposed: bool = False) -> int:
    """torch.utils.flop_counter's convolution count: 2 × output positions × weight size × batch."""
    batch = x_shape[0]
    positions = math.prod((x_shape if transposed else out_shape)[2:])
    c_out, c_in, *kernel = w_shape
    return 2 * positions * math.prod(kernel) * batch * c_out * c_in


def _mm_flops(args: Any, out: Any) -> int:
    a, b = args[-2], args[-1]  # (b)mm(a, b), (b)addmm(bias, a, b): 2 × a's size × b's columns
    return 2 * math.prod(a.shape) * b.shape[-1]


def _convolution_flops(args: Any, out: Any) -> int:
    x, w, transposed = args[0], args[1], args[6]
    return _conv_flop_count(x.shape, w.shape, out.shape, transposed)


def _convolution_backward_flops(args: Any, out: Any) -> int:
    shapes = [getattr(a, "shape", a) for a in args]  # tensors as their shapes, as torch's counter has them
    return _conv_backward_flop(*shapes, out_shape=[None if o is None else o.shape for o in out])


_FALLBACK_FLOPS: dict[str, Callable[[Any, Any], int]] = {
    "mm": _mm_flops,
    "addmm": _mm_flops,
    "bmm": _mm_flops,
    "baddbmm": _mm_flops,
    "convolution": _convolution_flops,
    "convolution_backward": _convolution_backward_flops,
}
"""torch's formulas for conv, linear and matmul attention (grouped-conv fix included), for torch 1.13."""


def _conv_backward_flop(*args: Any, out_shape: Any, **kwargs: Any) -> int:
    """torch's formula for conv backward (aten.convolution_backward's arguments' shapes, in its order) with
    the weight gradient divided by `groups` (torch's counter counts a grouped conv's as dense)."""
    grad_out_shape, x_shape, w_shape, _, _, _, _, transposed, _, groups, output_mask = args

    def t(shape: Any) -> list[int]:
        return [shape[1], shape[0], *shape[2:]]

    count = 0
    if output_mask[0]:
        count += _conv_flop_count(grad_out_shape, w_shape, out_shape[0], not transposed)
    if output_mask[1]:
        gw = out_shape[1]
        pair = (t(grad_out_shape), t(x_shape)) if transposed else (t(x_shape), t(grad_out_shape))
        count += _conv_flop_count(*pair, t(gw), transposed=False) // groups
    return count


def _flop_fixes() -> dict[Any, Any]:
    """Formulas torch's flop counter lacks or gets wrong, by aten op: grouped conv backward, and CPU
    attention (counted as on CUDA, so a model costs the same on every host)."""
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    fixes: dict[Any, Any] = {aten.convolution_backward: fc.shape_wrapper(_conv_backward_flop)}
    for end in ("", "_backward"):
        like = getattr(aten, f"_scaled_dot_product_flash_attention{end}")
        cpu = getattr(aten, f"_scaled_dot_product_flash_attention_for_cpu{end}", None)
        if cpu is not None and like in fc.flop_registry:
            fixes.setdefault(cpu, fc.flop_registry[like])
    return fixes


def count_flops(fn: Callable[[], Any]) -> tuple[Any, float | None]:
    """Run `fn` once under torch's FLOP counter: (what it returned, its FLOPs; None without a counter)."""
    counter = _flop_counter()
    if counter is None:
        return fn(), None
    with counter:
        result = fn()
    return result, float(counter.get_total_flops())
