"""Model registry: every model by name, so that the server, the clients and the profiler agree on what
"resnet18" is without shipping code; users add theirs with `register_model` (in every process). How large
a model may be built (each size option's range, the parameter and activation bounds) is checked before
anything is allocated: an override comes from a command line, a weights file or a message."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from powerctl.files.mapping import (
    Flag,
    Integer,
    Invalid,
    Number,
    bounds_text,
    check_arguments,
    is_integer,
    must_be,
)
from powerctl.records.workload import Workload, measure_workload
from powerfed.training import networks
from powerfed.training.errors import DataError, ModelError
from powerfed.training.networks import CharTransformer, MobileNetV2, ResNet, TinyCNN
from powerfed.training.tasks import check_task, default_num_classes, loss_fn

if TYPE_CHECKING:  # only an annotation: importing the models loads no dataset readers
    from powerfed.training.data import Dataset

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class ModelSpec:
    """One registered model, which every side builds by its name. Compared by identity: a name
    registered again is another model, whose size is counted afresh."""

    name: str
    task: str  # "image" (one class per sample: cross entropy, top-1 accuracy) or "text" (per character)
    input_shape: tuple[int, ...]  # one sample's shape: (3, 32, 32), (1, 16, 16) or (seq_len,)
    description: str
    builder: Callable[..., nn.Module] = field(repr=False)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Keyword arguments of `builder` that define this named variant; overrides go on top."""

    def _parameters(self) -> list[inspect.Parameter]:
        try:
            return list(inspect.signature(self.builder).parameters.values())
        except (TypeError, ValueError):  # a callable without a signature: no options
            return []

    def options(self) -> list[str]:
        """Names `build_model` accepts as overrides for this model."""
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return [p.name for p in self._parameters() if p.kind in named and p.name != "num_classes"]

    def call(self, num_classes: int, kwargs: Mapping[str, Any]) -> nn.Module:
        """The builder called with `kwargs`, and `num_classes` where it takes it (a factory may fix it)."""
        takes = any(p.name == "num_classes" or p.kind is p.VAR_KEYWORD for p in self._parameters())
        model = self.builder(**({"num_classes": num_classes} if takes else {}), **kwargs)
        if not isinstance(model, nn.Module):
            raise ModelError(
                f"model {self.name!r}: its factory returned {type(model).__name__}, not a torch nn.Module"
            )
        return model

    @property
    def builtin(self) -> bool:
        """Whether this is one of the project's own models (its code is versioned with the project)."""
        return getattr(self.builder, "__module__", None) == networks.__name__


_REGISTRY: dict[str, ModelSpec] = {}
BUILT_IN: frozenset[str] = frozenset()
"""The models this package registers itself (set once they are, below): never replaced or removed."""
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
"""What a model name may be: it becomes part of file names (weights, caches) and travels in messages."""


def model_spec(
    name: str,
    factory: Callable[..., nn.Module],
    *,
    task: str = "image",
    input_shape: Sequence[int],
    description: str = "",
    **defaults: Any,
) -> ModelSpec:
    """A checked registry entry, not registered (the relation estimator wraps a user's factory in one)."""
    if not isinstance(name, str) or not MODEL_NAME.fullmatch(name):
        raise ModelError(
            "a model name must be 1-100 letters, digits and . _ + - (it names cache files and messages), "
            f"got {name!r}"
        )
    if isinstance(factory, nn.Module):
        raise ModelError(
            f"model {name!r}: give the factory that builds the model (e.g. the class "
            f"{type(factory).__name__}), not a model instance: every node builds its own"
        )
    if not callable(factory):
        raise ModelError(
            f"model {name!r}: the factory must be callable (returning an nn.Module), got {factory!r}"
        )
    check_task(task)
    shape = tuple(input_shape) if isinstance(input_shape, (list, tuple)) else ()
    if not shape or any(not is_integer(d) or d < 1 for d in shape):
        raise ModelError(
            f"model {name!r}: input_shape must be one sample's shape in positive integers, e.g. (1, 16, 16), "
            f"got {input_shape!r}"
        )
    shape = tuple(int(d) for d in shape)  # plain ints (numpy's converted): the cache key holds them
    spec = ModelSpec(name, task, shape, description or name, factory, MappingProxyType(dict(defaults)))
    unknown = sorted(set(defaults) - set(spec.options()))
    if unknown:
        raise ModelError(
            f"model {name!r}: its factory takes no {', '.join(unknown)}; options: {spec.options()}"
        )
    return spec


def register_model(
    name: str,
    factory: Callable[..., nn.Module],
    *,
    task: str = "image",
    input_shape: Sequence[int],
    description: str = "",
    replace: bool = False,
    **defaults: Any,
) -> ModelSpec:
    """Register `factory` as model `name`, so that a name in a message, a run config or a command builds
    it on the server and the clients alike (each process registers it). Returns the entry.

    `factory(**options)` returns an nn.Module (given `num_classes=` when it takes it). `task` "image":
    one label per sample, any input shape; "text": next-character ids [B, T]. `input_shape`: one
    sample's shape; `defaults`: `factory`'s keyword arguments for this variant (overrides go on top).
    A name taken is refused unless `replace=True`; a built-in model's name is refused even then.
    """
    check_arguments("register_model", replace=(replace, Flag()))  # "no" must not replace
    spec = model_spec(name, factory, task=task, input_shape=input_shape, description=description, **defaults)
    if name in BUILT_IN:
        raise ModelError(
            f"model {name!r} is built in and stays as it is (every run's clients and caches name it); "
            "register yours under a name of its own"
        )
    if name in _REGISTRY and not replace:
        raise ModelError(
            f"model {name!r} is already registered ({_REGISTRY[name].description}); "
            "pass replace=True to replace it or choose another name"
        )
    _REGISTRY[name] = spec
    return spec


def unregister_model(name: str) -> None:
    """Remove model `name` (a user's); unknown and built-in names are refused."""
    get_model_spec(name)
    if name in BUILT_IN:
        raise ModelError(f"model {name!r} is built in and stays registered; unregister only your own models")
    del _REGISTRY[name]


for _name, _builder, _task, _description, _defaults in (  # image: (3, 32, 32); text: (64,) windows
    ("resnet18", ResNet, "image", "ResNet18, CIFAR stem, widths 64..512", {"width": 64}),
    ("resnet18-small", ResNet, "image", "ResNet18 topology, widths 16..128", {"width": 16}),
    ("mobilenetv2", MobileNetV2, "image", "MobileNetV2 for 32x32, width 1.0", {"width_mult": 1.0}),
    ("mobilenetv2-small", MobileNetV2, "image", "MobileNetV2 for 32x32, width 0.25", {"width_mult": 0.25}),
    ("cnn-tiny", TinyCNN, "image", "two-conv CNN for fast tests", {"width": 16}),
    ("chartransformer", CharTransformer, "text", "char GPT, 6 layers, 6 heads, 256 wide", {}),
    (
        "chartransformer-small",
        CharTransformer,
        "text",
        "char GPT, 2 layers, 2 heads, 64 wide",
        {"n_layer": 2, "n_head": 2, "n_embd": 64},
    ),
):
    _shape = (3, 32, 32) if _task == "image" else (64,)
    register_model(_name, _builder, task=_task, input_shape=_shape, description=_description, **_defaults)

BUILT_IN = frozenset(_REGISTRY)


def model_fingerprint(model: nn.Module) -> dict[str, Any]:
    """What a relation vector was estimated for (a session refuses a plan of another model): the class,
    the parameter count and a digest of every tensor's name and shape, not the weights' values."""
    shapes = [[name, list(t.shape)] for name, t in model.state_dict().items()]
    digest = hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:16]
    cls = type(model)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "parameters": sum(p.numel() for p in model.parameters()),
        "shapes_sha256": digest,
    }


def same_model(recorded: Any, model: nn.Module) -> str | None:
    """None when `model` is what `recorded` (a vector's `model_fingerprint`) describes, or nothing is
    recorded; else what differs, in words."""
    if not isinstance(recorded, Mapping):  # a vector keeps it read-only (a FrozenJson)
        return None
    now = model_fingerprint(model)
    if recorded.get("class") == now["class"] and recorded.get("shapes_sha256") == now["shapes_sha256"]:
        return None
    return (
        f"the relation vector was estimated for {recorded.get('class')} with {recorded.get('parameters')} "
        f"parameters, this loop trains {now['class']} with {now['parameters']}"
    )


def model_names() -> list[str]:
    """Every registered model's name: the seven built-ins, then the users', in registration order."""
    return list(_REGISTRY)


def get_model_spec(name: str) -> ModelSpec:
    """The registry entry of `name`; an unknown name is one ModelError line listing the registered ones."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ModelError(
            f"unknown model {name!r}; choose one of: {', '.join(_REGISTRY)} "
            "(or register yours with powerfed.training.models.register_model)"
        ) from None


def check_data_fits(spec: ModelSpec, ds: Dataset, data: str) -> None:
    """One line when `ds` (named `data`) cannot feed model `spec`: data of another task (DataError), or
    samples of another shape (ModelError): an image model takes its input_shape's rank and channel count
    (any height and width), a text model [T]."""
    if ds.task != spec.task:
        raise DataError(f"model {spec.name} is a {spec.task} model but {data} is {ds.task} data")
    shape = tuple(int(d) for d in ds.x.shape[1:])
    want = spec.input_shape
    if spec.task == "image" and (len(shape) != len(want) or shape[:1] != want[:1]):
        channels = f" ({want[0]} channels)" if len(want) == 3 else ""
        raise ModelError(
            f"model {spec.name!r} takes samples of shape {_shape_text(want)}{channels}, {data} has "
            f"{_shape_text(shape)}: give data of that shape or a model registered with its input_shape"
        )
    if spec.task == "text" and len(shape) != 1:
        raise ModelError(f"model {spec.name!r} takes character windows [T], {data} has {_shape_text(shape)}")


def _shape_text(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape) or "scalars"


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


def option_ranges() -> str:
    """Every registered model's size options with their ranges, and the size bounds (`--set`'s help)."""
    kinds: dict[str, Integer | Number | None] = {}
    for spec in _REGISTRY.values():
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


def check_size(
    model: str | ModelSpec, num_classes: int | None = None, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The overrides of `model` (a name, or an entry registered or not), checked without building it;
    refused, before any memory is asked for, where its parameters or layer outputs per sample exceed
    MAX_PARAMETERS or MAX_ACTIVATIONS (e.g. resnet18 with width=100000)."""
    spec = get_model_spec(model) if isinstance(model, str) else model
    name, overrides = spec.name, overrides or {}
    if unknown := sorted(set(overrides) - set(spec.options())):
        raise ModelError(
            f"model {name!r} has no option {', '.join(unknown)}; options: {', '.join(spec.options())}"
        )
    options = {k: _checked_option(spec, k, v) for k, v in overrides.items()}
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


def build_model(
    name: str, num_classes: int | None = None, *, seed: int | None = None, **overrides: Any
) -> nn.Module:
    """Build model `name` with `num_classes` outputs (text: the vocabulary size, default VOCAB_SIZE).
    `seed` makes the initial weights repeatable without touching the global RNG stream; `overrides`
    change sizes (the builder's keyword arguments: `ModelSpec.options`)."""
    return build_spec(get_model_spec(name), num_classes, seed=seed, **overrides)


def build_spec(
    spec: ModelSpec, num_classes: int | None = None, *, seed: int | None = None, **overrides: Any
) -> nn.Module:
    """`build_model` of a registry entry, registered or not (a Ray worker has not run `register_model`)."""
    name = spec.name
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, type(None))):
        raise ModelError(f"model {name!r}: num_classes must be an integer, got {num_classes!r}")
    n = default_num_classes(spec.task) if num_classes is None else int(num_classes)
    if n < 1:
        raise ModelError(f"model {name!r}: num_classes must be ≥ 1, got {n}")
    overrides = check_size(spec, n, overrides)
    kwargs = {**spec.defaults, **overrides}
    try:
        if seed is None:
            return spec.call(n, kwargs)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return spec.call(n, kwargs)
    except (MemoryError, RuntimeError) as exc:  # what the size check could not count (torch 1.13)
        if isinstance(exc, RuntimeError) and "alloc" not in str(exc).lower():
            raise
        raise ModelError(
            f"model {name!r}{described(overrides)}: not enough memory to build it: lower its size options"
        ) from None


def example_batch(
    name: str,
    batch_size: int,
    num_classes: int | None = None,
    *,
    generator: torch.Generator | None = None,
    input_shape: tuple[int, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and targets of the model's task and shape: what profiling needs, no data."""
    spec = get_model_spec(name)
    shape = tuple(input_shape or spec.input_shape)
    n = default_num_classes(spec.task) if num_classes is None else num_classes
    if spec.task == "text":
        x = torch.randint(0, n, (batch_size, *shape), generator=generator)
        y = torch.randint(0, n, (batch_size, *shape), generator=generator)
        return x, y
    x = torch.randn((batch_size, *shape), generator=generator)
    return x, torch.randint(0, n, (batch_size,), generator=generator)


def _num_classes_of(model: nn.Module) -> int | None:
    head = getattr(model, "lm_head", None) or getattr(model, "fc", None)
    classifier = getattr(model, "classifier", None)
    if head is None and isinstance(classifier, nn.Sequential):
        head = classifier[-1]
    return int(head.out_features) if isinstance(head, nn.Linear) else None


def model_workload(name: str, model: nn.Module, num_classes: int | None = None) -> Workload:
    """Training FLOPs and memory per sample of `model`, counted on a random batch of 2."""
    spec = get_model_spec(name)
    n = num_classes or _num_classes_of(model)
    block = getattr(model, "block_size", None)  # a text model's context
    shape = (int(block),) if spec.task == "text" and block else spec.input_shape
    x, y = example_batch(name, 2, n, generator=torch.Generator().manual_seed(0), input_shape=shape)
    device = next(model.parameters()).device
    return measure_workload(model, x.to(device), y.to(device), loss_fn(spec.task), name)
