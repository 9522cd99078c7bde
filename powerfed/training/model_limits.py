"""How large a model may be built: each size option's range and the parameter and activation bounds,
checked before anything is allocated (an override comes from a command line, a weights file or a message)."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from powerctl.files.mapping import Integer, Invalid, Number, bounds_text, must_be
from powerfed.training.errors import ModelError
from powerfed.training.tasks import default_num_classes

if TYPE_CHECKING:
    from powerfed.training.models import ModelSpec

log = logging.getLogger(__name__)

MAX_SEQ_LEN = 16_384
"""The longest context (characters) of a text model, and the longest sample a command cuts."""
MAX_STAGES = 8
"""ResNet stages at most: widths double each stage, so eight already reach 128 × width."""
OPTION_MAXIMUM: Mapping[str, float] = MappingProxyType(
    {
        "width": 4096,
        "blocks": 64,  # per stage
        "width_mult": 16.0,
        "n_layer": 256,
        "n_head": 256,
        "n_embd": 16_384,
        "seq_len": MAX_SEQ_LEN,
        "head_dim": 4096,
    }
)
"""The largest value of each size option; a combination is bounded by MAX_PARAMETERS and MAX_ACTIVATIONS."""
MAX_PARAMETERS = 200_000_000
"""Parameters at most: 800 MB of float32 weights, about 3.2 GB with their gradients and Adam's two
states, as much as the largest board here (8 GB, shared with the CPU) can train; 18 × resnet18."""
MAX_ACTIVATIONS = 2**28
"""Layer outputs per sample at most (1 GiB of float32 a sample): 50 × mobilenetv2's 4.8 million."""


def _annotation(spec: ModelSpec, key: str) -> str:
    return str(inspect.signature(spec.builder).parameters[key].annotation)


def _option_kind(key: str, annotation: str) -> Integer | Number | None:
    """The range of size option `key` (of each stage, for a tuple); None: an option not checked here."""
    top = OPTION_MAXIMUM.get(key)
    if annotation.startswith(("int", "tuple[int")):
        return Integer(1, None if top is None else int(top))
    if annotation == "float":
        return Number(0.0, 1.0, below=True) if key == "dropout" else Number(0.0, top, above=True)
    return None


def option_ranges_of(specs: Iterable[ModelSpec]) -> str:
    """Every size option of `specs` with its range, and the size bounds, in words (for `--set`'s help)."""
    kinds: dict[str, Integer | Number | None] = {}
    for spec in specs:
        for k in spec.options():
            kinds.setdefault(k, _option_kind(k, _annotation(spec, k)))
    ranges = ", ".join(
        f"{k} {bounds_text(kind)}" + (f" each, at most {MAX_STAGES} stages" if k == "blocks" else "")
        for k, kind in kinds.items()
        if kind is not None
    )
    return f"{ranges}; at most {MAX_PARAMETERS:,} parameters and {MAX_ACTIVATIONS:,} layer outputs per sample"


def _checked_option(spec: ModelSpec, key: str, value: Any) -> Any:
    """An override in its option's range, or one ModelError line: a string where a size belongs must not
    reach the builder, nor a size that asks for more memory than any board has."""
    annotation = _annotation(spec, key)
    kind = _option_kind(key, annotation)
    try:
        if kind is None or (value is None and "None" in annotation):
            return value
        if not annotation.startswith("tuple"):
            return kind(value)
        if not isinstance(value, (list, tuple)) or not 0 < len(value) <= MAX_STAGES:
            raise must_be(f"a list of 1 to {MAX_STAGES} stages", value)
        return tuple(kind(v) for v in value)
    except Invalid as exc:
        raise ModelError(f"model {spec.name!r} option {key} {exc}") from None


def checked_overrides(spec: ModelSpec, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`overrides` of model `spec`, each checked; an option it lacks is one ModelError line."""
    name = spec.name
    unknown = sorted(set(overrides) - set(spec.options()))
    if unknown:
        raise ModelError(
            f"model {name!r} has no option {', '.join(unknown)}; options: {', '.join(spec.options())}"
        )
    return {k: _checked_option(spec, k, v) for k, v in overrides.items()}


def described(overrides: Mapping[str, Any]) -> str:
    """ " with k=v, ..." for a message naming a model built with `overrides` ("" without)."""
    return f" with {', '.join(f'{k}={v}' for k, v in overrides.items())}" if overrides else ""


def _grows(spec: ModelSpec, num_classes: int, kwargs: Mapping[str, Any]) -> bool:
    """Whether a size option, or the classes, make the model larger than a named one (which fits): only
    then is its size counted, on the meta device (whose first use costs torch a second or two)."""
    if num_classes > FEW_CLASSES:
        return True
    defaults = {
        k: p.default for k, p in inspect.signature(spec.builder).parameters.items() if k != "num_classes"
    }
    defaults.update(spec.defaults)
    for key, value in kwargs.items():
        default = defaults.get(key)
        if default is inspect.Parameter.empty:
            return True  # a user's option without a default: counted
        if key == "dropout" or value == default:
            continue
        if value is None or default is None or isinstance(value, tuple):
            return True  # head_dim given, or other blocks: counted
        if value > default:
            return True
    return False


FEW_CLASSES = 1000
"""Classes that add little to any model here (resnet18's head: 0.5 M parameters at 1000)."""


@functools.lru_cache(maxsize=64)
def _size_of(
    spec: ModelSpec, num_classes: int, options: tuple[tuple[str, Any], ...]
) -> tuple[int, int] | None:
    """(parameters, layer outputs per sample) of a model, counted on torch's meta device (nothing
    allocated); None where it cannot be (torch 1.13, a layer without a meta kernel): building tells."""
    if not hasattr(torch.device, "__enter__"):
        return None
    kwargs = {**spec.defaults, **dict(options)}
    try:
        with torch.device("meta"):
            model = spec.call(num_classes, kwargs)
        params = sum(p.numel() for p in model.parameters())
        if params > MAX_PARAMETERS:
            return params, 0
        outputs = 0

        def count(_module: nn.Module, _inputs: Any, out: Any) -> None:
            nonlocal outputs
            outputs += out.numel() if isinstance(out, torch.Tensor) else 0

        leaves = [m for m in model.modules() if next(m.children(), None) is None]
        handles = [m.register_forward_hook(count) for m in leaves]
        text = spec.task == "text"
        shape = (int(kwargs.get("seq_len", spec.input_shape[0])),) if text else spec.input_shape
        x = torch.zeros((1, *shape), dtype=torch.long if text else torch.float32, device="meta")
        with torch.no_grad():
            model.train()(x)
        for h in handles:
            h.remove()
    except Exception as exc:  # no meta kernel (or a user's forward that needs real data): no verdict
        log.debug("model %s: size not counted on the meta device: %s", spec.name, exc)
        return None
    return params, outputs


def check_spec_size(
    spec: ModelSpec, num_classes: int | None, overrides: Mapping[str, Any] | None
) -> dict[str, Any]:
    """`check_size` of a registry entry, registered or not; the overrides, checked."""
    name = spec.name
    options = checked_overrides(spec, overrides or {})
    n = default_num_classes(spec.task) if num_classes is None else int(num_classes)
    grows = _grows(spec, n, {**spec.defaults, **options})
    size = _size_of(spec, n, tuple(sorted(options.items()))) if grows else None
    params, outputs = size or (0, 0)  # not counted: nothing to refuse
    lower = f"lower {', '.join(options)}" if options else "use fewer classes"
    if params > MAX_PARAMETERS:
        raise ModelError(
            f"model {name!r}{described(options)} would have {params:,} parameters, more than the "
            f"{MAX_PARAMETERS:,} a board can train: {lower}"
        )
    if outputs > MAX_ACTIVATIONS:
        raise ModelError(
            f"model {name!r}{described(options)} would keep {outputs:,} layer outputs per sample "
            f"({outputs * 4 / 2**30:.1f} GiB), more than {MAX_ACTIVATIONS:,}: {lower}"
        )
    return options
