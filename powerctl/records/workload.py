"""What one training step costs: FLOPs, activation memory, parameter memory, kernels, memory traffic.

Measured from the real torch model (not hand-written), so a simulated board charges a bigger
network more time, more power and more memory, and refuses a batch that does not fit.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Workload:
    model: str
    input_shape: tuple[int, ...]
    """Held as a tuple (a list given is made one; `to_dict` writes a list)."""
    flops_per_sample: float
    """Training FLOPs per sample: forward + backward."""
    activation_bytes_per_sample: float
    """Bytes autograd keeps per sample between forward and backward (weights it saves are not counted:
    they are parameters, held once whatever the batch size)."""
    parameter_bytes: float
    optimizer_states: int = 2
    """Extra copies of the parameters the optimizer keeps (Adam/AdamW: 2)."""
    kernels_per_step: int = 0
    """Compute ops (≈ GPU kernel launches) of one forward + backward pass; 0 = not measured."""
    traffic_bytes_per_sample: float = 0.0
    """Bytes the forward + backward ops write per sample, weight gradients left out (memory traffic; reads
    are of the same order)."""
    parameter_tensors: int = 0
    """Parameter tensors: a per-tensor optimizer (PyTorch 1.10's Adam) launches kernels for each."""

    def __post_init__(self) -> None:
        """A workload a user makes by hand holds what a counted one does: a NaN or negative count would
        profile finite nonsense (a batch of 10⁶ "fitting" a 2 GiB board), one ArgumentError line."""
        from powerctl.files.mapping import Integer, Number, check_arguments

        checked = check_arguments(
            "Workload",
            flops_per_sample=(self.flops_per_sample, Number(0.0)),
            activation_bytes_per_sample=(self.activation_bytes_per_sample, Number(0.0)),
            parameter_bytes=(self.parameter_bytes, Number(0.0)),
            optimizer_states=(self.optimizer_states, Integer(0)),
            kernels_per_step=(self.kernels_per_step, Integer(0)),
            traffic_bytes_per_sample=(self.traffic_bytes_per_sample, Number(0.0)),
            parameter_tensors=(self.parameter_tensors, Integer(0)),
        )
        for name, value in checked.items():  # plain numbers (numpy's converted): a profile's JSON holds it
            object.__setattr__(self, name, value)
        if isinstance(self.input_shape, list):  # held as a tuple: a frozen record's shape cannot change
            object.__setattr__(self, "input_shape", tuple(self.input_shape))

    def memory_bytes(self, batch_size: int) -> float:
        """Training memory at `batch_size`: weights, grads, optimizer state, activations."""
        fixed = self.parameter_bytes * (2 + self.optimizer_states)
        return fixed + batch_size * self.activation_bytes_per_sample

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["input_shape"] = list(self.input_shape)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Workload:
        """The workload `to_dict` wrote (a profile's `extra["workload"]`)."""
        return cls(**{**d, "input_shape": tuple(d["input_shape"])})


def check_model(where: str, model: Any) -> None:
    """A model to measure or train (`measure_workload`, `PowerSession`): an nn.Module whose tensors hold
    data. One built under `torch.device("meta")` has shapes only: it would fail deep inside torch at the
    first step, so it is one ArgumentError line here."""
    import torch

    from powerctl.errors import ArgumentError

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


def _check_measure_arguments(
    model: Any, inputs: Any, targets: Any, loss_fn: Any, optimizer_states: Any
) -> int:
    """`measure_workload`'s arguments, one ArgumentError line each (a string model, a 0-d or empty batch
    would fail deep inside torch, or divide by zero); returns `optimizer_states` as a plain int."""
    import torch

    from powerctl.errors import ArgumentError
    from powerctl.files.mapping import Integer, check_arguments

    where = "measure_workload"
    check_model(where, model)
    for name, t in (("inputs", inputs), ("targets", targets)):
        if not isinstance(t, torch.Tensor) or t.dim() == 0 or len(t) == 0:
            raise ArgumentError(
                f"{where}: {name!r} must be a batch tensor of one sample or more, got {t!r:.80}"
            )
    if len(inputs) != len(targets):
        raise ArgumentError(f"{where}: 'inputs' has {len(inputs)} samples, 'targets' {len(targets)}")
    if not callable(loss_fn):
        raise ArgumentError(f"{where}: 'loss_fn' must be callable (outputs, targets) → loss, got {loss_fn!r}")
    return check_arguments(where, optimizer_states=(optimizer_states, Integer(0)))["optimizer_states"]


def _forward(model: Any, inputs: Any, targets: Any, loss_fn: Callable[[Any, Any], Any]) -> Any:
    """The loss of one forward pass; the model or loss refusing the batch (another shape, a dtype) is one
    ArgumentError line with torch's first line, not its traceback (running out of memory stays itself)."""
    import torch

    from powerctl.errors import ArgumentError, first_line

    try:
        return loss_fn(model(inputs), targets)
    except getattr(torch.cuda, "OutOfMemoryError", ()):  # torch ≥ 1.13
        raise
    except MODEL_INPUT_ERRORS as exc:
        raise ArgumentError(
            f"measure_workload: the model and loss cannot take the batch (inputs {tuple(inputs.shape)}, "
            f"targets {tuple(targets.shape)}): {first_line(exc)}"
        ) from None


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

    `inputs`/`targets` is a small batch (2–4 samples) of the task's shape; the model is left
    unchanged (gradients are cleared again).
    """
    import torch

    optimizer_states = _check_measure_arguments(model, inputs, targets, loss_fn, optimizer_states)
    batch = int(inputs.shape[0])
    param_storages = {_storage(p).data_ptr() for p in model.parameters()}
    saved_storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        # one storage counted once (a ReLU output saved by two nodes is one buffer), weights never: they
        # are parameters, not per-sample activations (transposed views share the weight's storage)
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
            loss = _forward(model, inputs, targets, loss_fn)
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
        optimizer_states=optimizer_states,
        kernels_per_step=ops.kernels,
        traffic_bytes_per_sample=ops.written_bytes / batch,
        parameter_tensors=len(params),
    )


def _storage(t: Any) -> Any:
    """The tensor's storage (`untyped_storage` from torch 2.0; `storage()` before, the same pointer/size)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def _flop_counter() -> Any:
    """torch's FlopCounterMode with `_flop_fixes` (torch 2.1+); None where torch has none (1.13: the
    op counter then counts the FLOPs itself, with `_FALLBACK_FLOPS`)."""
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    with _flop_counter_fixed():
        return FlopCounterMode(display=False)  # copies torch's table on construction: fixed first


def _op_counter(parameter_shapes: set[tuple[int, ...]], count_flops: bool = False) -> Any:
    """A dispatch mode counting the compute ops of a pass (≈ kernel launches) and the per-sample bytes
    they write (outputs shaped like a parameter are weight gradients: per step, not per sample); with
    `count_flops`, also the FLOPs of the ops in `_FALLBACK_FLOPS` (where torch has no flop counter).

    Views and detaches launch no kernel and are not counted. Built on first use: torch is imported lazily.
    """
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


# --- FLOPs where torch has no flop counter (torch 1.13: docs/jetson.md) ---------------------------


def _conv_flop_count(x_shape: Any, w_shape: Any, out_shape: Any, transposed: bool = False) -> int:
    """torch.utils.flop_counter's convolution count: 2 × output positions × weight size × batch."""
    batch = x_shape[0]
    positions = math.prod((x_shape if transposed else out_shape)[2:])
    c_out, c_in, *kernel = w_shape
    return 2 * positions * math.prod(kernel) * batch * c_out * c_in


def _mm_flops(args: Any, out: Any) -> int:
    a, b = args[-2], args[-1]  # mm(a, b), addmm(bias, a, b)
    return 2 * a.shape[0] * a.shape[1] * b.shape[1]


def _bmm_flops(args: Any, out: Any) -> int:
    a, b = args[-2], args[-1]  # bmm(a, b), baddbmm(bias, a, b)
    return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]


def _convolution_flops(args: Any, out: Any) -> int:
    x, w, transposed = args[0], args[1], args[6]
    return _conv_flop_count(x.shape, w.shape, out.shape, transposed)


def _convolution_backward_flops(args: Any, out: Any) -> int:
    grad_out, x, w = args[0], args[1], args[2]
    transposed, groups, mask = args[7], args[9], args[10]
    outs = [None if o is None else o.shape for o in out]
    return _conv_backward_flop(
        grad_out.shape,
        x.shape,
        w.shape,
        None,
        None,
        None,
        None,
        transposed,
        None,
        groups,
        mask,
        out_shape=outs,
    )


_FALLBACK_FLOPS: dict[str, Callable[[Any, Any], int]] = {
    "mm": _mm_flops,
    "addmm": _mm_flops,
    "bmm": _bmm_flops,
    "baddbmm": _bmm_flops,
    "convolution": _convolution_flops,
    "convolution_backward": _convolution_backward_flops,
}
"""The ops torch's counter counts for conv and linear layers and attention written as matmuls, with
its formulas (the grouped-conv fix included); the op counter uses them on torch 1.13."""


# --- corrections to torch.utils.flop_counter (applied only while measuring) ---------------------


CONV_BACKWARD_ARGS = (
    "grad_out",
    "input",
    "weight",
    "bias_sizes",
    "stride",
    "padding",
    "dilation",
    "transposed",
    "output_padding",
    "groups",
    "output_mask",
)
"""aten.convolution_backward's arguments, in its order: the flop counter passes their shapes positionally."""


def _conv_backward_flop(*args: Any, out_shape: Any, **kwargs: Any) -> int:
    """torch's formula for conv backward, with the weight gradient divided by `groups`.

    torch.utils.flop_counter (up to at least 2.13) counts the weight gradient of a grouped conv as if
    it were dense, which makes a depthwise layer's backward ~channels× too expensive (MobileNetV2's
    training FLOPs came out 7× too high); fixed upstream in pytorch/pytorch#183405. The counter calls
    it with the op's 11 arguments (`CONV_BACKWARD_ARGS`) and the outputs' shapes (`shape_wrapper`).
    """
    named = dict(zip(CONV_BACKWARD_ARGS, args, strict=True))
    grad_out_shape, x_shape, w_shape = named["grad_out"], named["input"], named["weight"]
    transposed, groups, output_mask = named["transposed"], named["groups"], named["output_mask"]

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
    """Formulas torch's flop counter lacks or gets wrong, keyed by aten op (wrapped as torch's are).

    - grouped conv backward: see `_conv_backward_flop`;
    - CPU attention (`_scaled_dot_product_flash_attention_for_cpu` and its backward) is not in the
      table, so attention FLOPs silently vanished on CPU though they are counted on CUDA; we count it
      with torch's own SDPA formulas, so a model costs the same on every host.
    """
    import torch
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten
    fixes: dict[Any, Any] = {aten.convolution_backward: fc.shape_wrapper(_conv_backward_flop)}
    pairs = (
        ("_scaled_dot_product_flash_attention_for_cpu", aten._scaled_dot_product_flash_attention),
        (
            "_scaled_dot_product_flash_attention_for_cpu_backward",
            aten._scaled_dot_product_flash_attention_backward,
        ),
    )
    for op_name, like in pairs:
        if hasattr(aten, op_name) and like in fc.flop_registry:
            fixes.setdefault(getattr(aten, op_name), fc.flop_registry[like])
    return fixes


@contextmanager
def _flop_counter_fixed() -> Iterator[None]:
    """Apply `_flop_fixes` to torch's flop table while measuring, and put the table back afterwards."""
    from torch.utils import flop_counter as fc

    missing = object()
    saved = {}
    for key, formula in _flop_fixes().items():
        saved[key] = fc.flop_registry.get(key, missing)
        fc.flop_registry[key] = formula
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is missing:
                fc.flop_registry.pop(key, None)
            else:
                fc.flop_registry[key] = old


def count_flops(fn: Callable[[], Any]) -> tuple[Any, float | None]:
    """Run `fn` once under torch's FLOP counter: (what it returned, its FLOPs); None where torch has no
    counter (1.13). What a training step really costs, whatever it does (two passes, a proximal term)."""
    counter = _flop_counter()
    if counter is None:
        return fn(), None
    with counter:
        result = fn()
    return result, float(counter.get_total_flops())
