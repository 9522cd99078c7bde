"""Model registry: the paper's networks in plain torch, small variants, losses and accuracy.

Every model is built by name so that the server, the clients and the profiler agree on what
"resnet18" is without shipping code; users add theirs with `register_model` (in every process, server
and clients alike), as the seven built-ins below register themselves. The built-in image models take
[B, 3, 32, 32] floats and return [B, classes]; text models take [B, T] character ids (T ≤ seq_len)
and return next-character logits [B, T, vocab].
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import math
import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from powerctl.files.mapping import Flag, Integer, Number, bounds_text, check_arguments, is_integer
from powerctl.records.workload import Workload, measure_workload
from powerfed.training.errors import ModelError

log = logging.getLogger(__name__)

VOCAB: str = string.ascii_letters + string.digits + string.punctuation + " \n"
"""The paper's character vocabulary (96 symbols); text outside it is dropped by the loaders."""
VOCAB_SIZE: int = len(VOCAB)

TASKS = ("image", "text")


def _check_task(task: str) -> str:
    if task not in TASKS:
        raise ModelError(f"unknown task {task!r}; expected one of: {', '.join(TASKS)}")
    return task


# --------------------------------------------------------------------------- ResNet18 (CIFAR stem)


class BasicBlock(nn.Module):
    """The standard two-3×3-conv residual block with a 1×1 projection when the shape changes."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet for 32×32 inputs: 3×3 stride-1 stem, no max-pool, four stages of BasicBlocks."""

    def __init__(
        self, num_classes: int = 10, width: int = 64, blocks: tuple[int, ...] = (2, 2, 2, 2)
    ) -> None:
        super().__init__()
        if width < 1 or not blocks or any(b < 1 for b in blocks):
            raise ModelError(f"resnet: width {width} and blocks {blocks} must be positive; use e.g. width=64")
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        stages: list[nn.Module] = []
        in_planes = width
        for i, n in enumerate(blocks):
            planes = width * 2**i
            for j in range(n):
                stages.append(BasicBlock(in_planes, planes, stride=2 if (i > 0 and j == 0) else 1))
                in_planes = planes
        self.layers = nn.Sequential(*stages)
        self.fc = nn.Linear(in_planes, num_classes)
        _init_conv_net(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(F.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(out, 1), 1))


def _init_conv_net(model: nn.Module) -> None:
    """torchvision's initialisation, so our weights start where the reference implementations do."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)


# --------------------------------------------------------------------------- MobileNetV2 (32×32)


def _make_divisible(v: float, divisor: int = 8) -> int:
    """Round channel counts as the reference MobileNetV2 does (never down by more than 10%)."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _conv_bn(
    inp: int, out: int, kernel: int, stride: int, groups: int = 1, act: bool = True
) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(inp, out, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(out),
    ]
    if act:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """Expand (1×1) → depthwise 3×3 → linear project (1×1), residual when shapes match."""

    def __init__(self, inp: int, out: int, stride: int, expand_ratio: int) -> None:
        super().__init__()
        hidden = round(inp * expand_ratio)
        self.use_res = stride == 1 and inp == out
        layers: list[nn.Module] = []
        if expand_ratio != 1:
            layers.append(_conv_bn(inp, hidden, 1, 1))
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden), _conv_bn(hidden, out, 1, 1, act=False)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    """The standard MobileNetV2 (Sandler et al. 2018; torchvision layout), adapted to 32×32 inputs.

    The usual CIFAR adaptation: the stem conv and the first stride-2 stage (24 channels) use stride 1,
    so the 32×32 input is reduced only 8× (to 4×4) instead of 32×. Parameter count is unchanged
    (2,236,682 at 10 classes, width multiplier 1).
    """

    # (expansion t, output channels c, repeats n, first stride s), CIFAR strides
    SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 1),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, num_classes: int = 10, width_mult: float = 1.0, dropout: float = 0.2) -> None:
        super().__init__()
        if width_mult <= 0:
            raise ModelError(f"mobilenetv2: width_mult must be > 0, got {width_mult}; use e.g. 1.0 or 0.25")
        inp = _make_divisible(32 * width_mult)
        last = _make_divisible(1280 * max(1.0, width_mult))
        layers: list[nn.Module] = [_conv_bn(3, inp, 3, 1)]
        for t, c, n, s in self.SETTINGS:
            out = _make_divisible(c * width_mult)
            for i in range(n):
                layers.append(InvertedResidual(inp, out, s if i == 0 else 1, t))
                inp = out
        layers.append(_conv_bn(inp, last, 1, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last, num_classes))
        _init_conv_net(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(out, 1))


# --------------------------------------------------------------------------- tiny CNN


class TinyCNN(nn.Module):
    """Two conv layers and a linear head: a real image model that trains in milliseconds, for tests."""

    def __init__(self, num_classes: int = 10, width: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, 1, 1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, 1, 1)
        self.fc = nn.Linear(2 * width * 8 * 8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.adaptive_max_pool2d(F.relu(self.conv2(x)), 8)
        return self.fc(torch.flatten(x, 1))


# --------------------------------------------------------------------------- character transformer


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """softmax(q kᵀ / √d + causal mask) v: torch's fused kernel where it has one (2.0+), else the same
    sum written out (torch 1.13, the newest torch that builds for JetPack 4: docs/jetson.md)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    t = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    return F.dropout(weights, p=dropout_p) @ v


class LayerNormNoBias(nn.Module):
    """LayerNorm with a weight and no bias, as `nn.LayerNorm(n, bias=False)` (torch 2.1+) on any torch;
    the same state-dict keys, so weights move between torch versions."""

    def __init__(self, n: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, None, self.eps)


def layer_norm(n: int) -> nn.Module:
    """A bias-free LayerNorm: torch's own where it has the option, else `LayerNormNoBias`."""
    if "bias" in inspect.signature(nn.LayerNorm.__init__).parameters:
        return nn.LayerNorm(n, bias=False)
    return LayerNormNoBias(n)


class CausalSelfAttention(nn.Module):
    """nanoGPT's causal attention, with the head width decoupled from the residual width.

    `head_dim` defaults to n_embd // n_head; the attention's inner width is n_head · head_dim, which
    may be a little less than n_embd (256 wide with 6 heads: 6 × 42 = 252), as in T5's d_kv.
    """

    def __init__(self, n_embd: int, n_head: int, head_dim: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.head_dim, self.dropout = n_head, head_dim, dropout
        inner = n_head * head_dim
        self.c_attn = nn.Linear(n_embd, 3 * inner, bias=False)
        self.c_proj = nn.Linear(inner, n_embd, bias=False)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.c_attn(x).view(b, t, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        y = _causal_attention(q, k, v, self.dropout if self.training else 0.0)
        return self.resid_drop(self.c_proj(y.transpose(1, 2).reshape(b, t, -1)))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(ln(x)); x + mlp(ln(x)), MLP 4× wide with GELU."""

    def __init__(self, n_embd: int, n_head: int, head_dim: int, dropout: float) -> None:
        super().__init__()
        self.ln_1 = layer_norm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, head_dim, dropout)
        self.ln_2 = layer_norm(n_embd)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd, bias=False),
            nn.GELU(),
            nn.Linear(4 * n_embd, n_embd, bias=False),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class CharTransformer(nn.Module):
    """The paper's character-level GPT: 6 layers, 6 heads, 256 wide, context 64 (nanoGPT-style).

    256 is not divisible by 6, so rather than change the stated width or head count, each head is
    256 // 6 = 42 wide and attention works in 6 × 42 = 252 dimensions, projected back to the 256-wide
    residual stream. Learned position embeddings, no biases, output head tied to the token embedding.
    """

    def __init__(
        self,
        num_classes: int = VOCAB_SIZE,
        n_layer: int = 6,
        n_head: int = 6,
        n_embd: int = 256,
        seq_len: int = 64,
        head_dim: int | None = None,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if min(n_layer, n_head, n_embd, seq_len, num_classes) < 1 or n_embd < n_head:
            raise ModelError(
                f"chartransformer: n_layer={n_layer} n_head={n_head} n_embd={n_embd} seq_len={seq_len} "
                "must be positive with n_embd ≥ n_head"
            )
        self.block_size = seq_len
        self.wte = nn.Embedding(num_classes, n_embd)
        self.wpe = nn.Embedding(seq_len, n_embd)
        self.drop = nn.Dropout(dropout)
        hd = head_dim or n_embd // n_head
        self.blocks = nn.ModuleList(TransformerBlock(n_embd, n_head, hd, dropout) for _ in range(n_layer))
        self.ln_f = layer_norm(n_embd)
        self.lm_head = nn.Linear(n_embd, num_classes, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying, as in GPT-2/nanoGPT
        self._init_weights(n_layer)

    def _init_weights(self, n_layer: int) -> None:
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.block_size:
            raise ModelError(f"chartransformer: sequence of {t} exceeds its context {self.block_size}")
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True, eq=False)
class ModelSpec:
    """One registered model: what the server names in its messages and every side builds by that name.

    Compared by identity: a name registered again (`replace=True`) is another model, whose size is
    counted afresh.
    """

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

    def takes_num_classes(self) -> bool:
        """Whether the builder is told the number of classes (a user's factory may fix its own)."""
        return any(p.name == "num_classes" or p.kind is p.VAR_KEYWORD for p in self._parameters())

    def call(self, num_classes: int, kwargs: Mapping[str, Any]) -> nn.Module:
        """The builder called with `kwargs`, and `num_classes` where it takes it."""
        extra = {"num_classes": num_classes} if self.takes_num_classes() else {}
        model = self.builder(**extra, **kwargs)
        if not isinstance(model, nn.Module):
            raise ModelError(
                f"model {self.name!r}: its factory returned {type(model).__name__}, not a torch nn.Module"
            )
        return model

    @property
    def builtin(self) -> bool:
        """Whether this is one of the project's own models (its code is versioned with the project)."""
        return getattr(self.builder, "__module__", None) == __name__


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
    """A checked registry entry, not registered (`register_model` registers one; the relation estimator
    wraps an unregistered factory in one)."""
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
    _check_task(task)
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
    it on the server and the clients alike (each process registers it: import the module that does).

    `factory(**options)` returns an nn.Module; it is given `num_classes=` too when it takes it.
    `task` "image" means one label per sample (cross entropy, top-1 accuracy), whatever the input shape
    and channel count; "text" means next-character ids [B, T]. `input_shape` is one sample's shape
    ((1, 16, 16), or (seq_len,) for text); `defaults` are keyword arguments of `factory` that define this
    variant (what `build_model`'s overrides go on top of). A name already taken is refused unless
    `replace=True`; a built-in model's name is refused even then (every run's clients, caches and
    results name it: register yours under a name of its own). Returns the entry.
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
    """Remove model `name` (a user's, e.g. after a test); unknown names are refused as `get_model_spec`,
    built-in ones (`BUILT_IN`) are kept: a run's clients and caches name them."""
    get_model_spec(name)
    if name in BUILT_IN:
        raise ModelError(f"model {name!r} is built in and stays registered; unregister only your own models")
    del _REGISTRY[name]


_IMG = (3, 32, 32)
register_model(
    "resnet18", ResNet, input_shape=_IMG, description="ResNet18, CIFAR stem, widths 64..512", width=64
)
register_model(
    "resnet18-small", ResNet, input_shape=_IMG, description="ResNet18 topology, widths 16..128", width=16
)
register_model(
    "mobilenetv2",
    MobileNetV2,
    input_shape=_IMG,
    description="MobileNetV2 for 32x32, width 1.0",
    width_mult=1.0,
)
register_model(
    "mobilenetv2-small",
    MobileNetV2,
    input_shape=_IMG,
    description="MobileNetV2 for 32x32, width 0.25",
    width_mult=0.25,
)
register_model("cnn-tiny", TinyCNN, input_shape=_IMG, description="two-conv CNN for fast tests", width=16)
register_model(
    "chartransformer",
    CharTransformer,
    task="text",
    input_shape=(64,),
    description="char GPT, 6 layers, 6 heads, 256 wide",
)
register_model(
    "chartransformer-small",
    CharTransformer,
    task="text",
    input_shape=(64,),
    description="char GPT, 2 layers, 2 heads, 64 wide",
    n_layer=2,
    n_head=2,
    n_embd=64,
)

BUILT_IN = frozenset(_REGISTRY)


def model_fingerprint(model: nn.Module) -> dict[str, Any]:
    """What a relation vector was estimated for, to tell another model from it (a session refuses a
    plan whose vector is of another model): the module's class, its parameter count, and a digest of
    every parameter's and buffer's name and shape. Not the weights' values (fine-tuning changes them)."""
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
    recorded (files from before it was); else what differs, in words."""
    if not isinstance(recorded, dict):
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


def check_input_shape(spec: ModelSpec, sample_shape: Sequence[int], data: str) -> None:
    """One ModelError line when samples of `sample_shape` (from `data`) cannot feed model `spec`: an
    image model takes samples of its input_shape's rank and channel count (the first dimension; the
    built-in networks pool over any height and width); a text model, windows of at most its context."""
    shape = tuple(int(d) for d in sample_shape)
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


def default_num_classes(task: str) -> int:
    """Ten CIFAR-style classes for images, the character vocabulary for text."""
    return VOCAB_SIZE if _check_task(task) == "text" else 10


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
"""The largest value of each size option. Each alone is generous; what a combination builds is
bounded by MAX_PARAMETERS and MAX_ACTIVATIONS, checked before anything is allocated."""
MAX_PARAMETERS = 200_000_000
"""Parameters at most: 800 MB of float32 weights, about 3.2 GB with their gradients and Adam's two
states, as much as the largest board here (8 GB, shared with the CPU) can train; 18 × resnet18."""
MAX_ACTIVATIONS = 2**28
"""Layer outputs per sample at most (1 GiB of float32 a sample): 50 × mobilenetv2's 4.8 million."""


def _option_kind(key: str) -> Integer | Number:
    """The range of size option `key` (for its help: the checks below keep their own words)."""
    if key == "dropout":
        return Number(0.0, 1.0, below=True)
    if key == "width_mult":
        return Number(0.0, OPTION_MAXIMUM[key], above=True)
    return Integer(1, int(OPTION_MAXIMUM[key]))


def option_ranges() -> str:
    """Every size option's range and the size bounds, in words (for `--set`'s help)."""
    keys = dict.fromkeys(k for spec in _REGISTRY.values() for k in spec.options())
    ranges = ", ".join(
        f"{k} {bounds_text(_option_kind(k))}"
        + (f" each, at most {MAX_STAGES} stages" if k == "blocks" else "")
        for k in keys
    )
    return f"{ranges}; at most {MAX_PARAMETERS:,} parameters and {MAX_ACTIVATIONS:,} layer outputs per sample"


def _checked_option(spec: ModelSpec, key: str, value: Any) -> Any:
    """An override of the builder's type and range (from a command line, a weights file or a message),
    or one ModelError line: a string where a size belongs must not reach the builder, nor a size that
    would ask for more memory than any board has."""
    annotation = str(inspect.signature(spec.builder).parameters[key].annotation)
    top = OPTION_MAXIMUM.get(key)

    def bad(what: str) -> ModelError:
        return ModelError(f"model {spec.name!r} option {key} must be {what}, got {value!r}")

    if annotation.startswith("int"):
        if value is None and "None" in annotation:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad("a positive integer")
        if top is not None and value > top:
            raise bad(f"at most {top:g}")
        return value
    if annotation == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise bad("a finite number")
        if key == "dropout" and not 0 <= value < 1:
            raise bad("in [0, 1)")
        if key != "dropout" and value <= 0:
            raise bad("> 0")
        if top is not None and value > top:
            raise bad(f"at most {top:g}")
        return float(value)
    if annotation.startswith("tuple[int"):
        if not isinstance(value, (list, tuple)) or not value:
            raise bad("a list of positive integers")
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
            raise bad("a list of positive integers")
        if len(value) > MAX_STAGES or (top is not None and max(value) > top):
            raise bad(f"at most {MAX_STAGES} stages of at most {top:g} blocks")
        return tuple(value)
    return value


def check_overrides(name: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The overrides of model `name`, checked without building it (for commands, before any work)."""
    return _checked_overrides(get_model_spec(name), overrides)


def _checked_overrides(spec: ModelSpec, overrides: Mapping[str, Any]) -> dict[str, Any]:
    name = spec.name
    unknown = sorted(set(overrides) - set(spec.options()))
    if unknown:
        raise ModelError(
            f"model {name!r} has no option {', '.join(unknown)}; options: {', '.join(spec.options())}"
        )
    return {k: _checked_option(spec, k, v) for k, v in overrides.items()}


def _described(overrides: Mapping[str, Any]) -> str:
    return f" with {', '.join(f'{k}={v}' for k, v in overrides.items())}" if overrides else ""


def _grows(spec: ModelSpec, num_classes: int, kwargs: Mapping[str, Any]) -> bool:
    """Whether a size option, or the classes, make the model larger than a named one (which fits): only
    then is its size counted, on the meta device, whose first use costs torch one to two seconds."""
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
    """(parameters, layer outputs per sample) of a model, counted on torch's meta device: shapes only,
    nothing allocated. None where it cannot be counted (torch 1.13 has no meta device context, or a
    layer has no meta kernel): then only building tells."""
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


def check_size(name: str, num_classes: int | None = None, overrides: Mapping[str, Any] | None = None) -> None:
    """Refuse, before any memory is asked for, a model whose parameters or layer outputs per sample
    exceed MAX_PARAMETERS or MAX_ACTIVATIONS (e.g. resnet18 with width=100000: 27 trillion
    parameters, which torch would try to allocate as 100 TB)."""
    _check_size(get_model_spec(name), num_classes, overrides)


def _check_size(spec: ModelSpec, num_classes: int | None, overrides: Mapping[str, Any] | None) -> None:
    name = spec.name
    options = _checked_overrides(spec, overrides or {})
    n = default_num_classes(spec.task) if num_classes is None else int(num_classes)
    if not _grows(spec, n, {**spec.defaults, **options}):
        return
    size = _size_of(spec, n, tuple(sorted(options.items())))
    if size is None:
        return
    params, outputs = size
    lower = f"lower {', '.join(options)}" if options else "use fewer classes"
    if params > MAX_PARAMETERS:
        raise ModelError(
            f"model {name!r}{_described(options)} would have {params:,} parameters, more than the "
            f"{MAX_PARAMETERS:,} a board can train: {lower}"
        )
    if outputs > MAX_ACTIVATIONS:
        raise ModelError(
            f"model {name!r}{_described(options)} would keep {outputs:,} layer outputs per sample "
            f"({outputs * 4 / 2**30:.1f} GiB), more than {MAX_ACTIVATIONS:,}: {lower}"
        )


def build_model(
    name: str, num_classes: int | None = None, *, seed: int | None = None, **overrides: Any
) -> nn.Module:
    """Build model `name` with `num_classes` outputs (text: the vocabulary size, default VOCAB_SIZE).

    `seed` makes the initial weights reproducible without touching the global RNG stream;
    `overrides` change sizes (resnet: width, blocks; mobilenetv2: width_mult, dropout;
    chartransformer: n_layer, n_head, n_embd, seq_len, head_dim, dropout; cnn-tiny: width; a
    registered model: its factory's keyword arguments).
    """
    return build_spec(get_model_spec(name), num_classes, seed=seed, **overrides)


def build_spec(
    spec: ModelSpec, num_classes: int | None = None, *, seed: int | None = None, **overrides: Any
) -> nn.Module:
    """`build_model` of a registry entry, registered or not (what crosses to a Ray worker, which has
    not run the user's `register_model`)."""
    name = spec.name
    overrides = _checked_overrides(spec, overrides)
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, type(None))):
        raise ModelError(f"model {name!r}: num_classes must be an integer, got {num_classes!r}")
    n = default_num_classes(spec.task) if num_classes is None else int(num_classes)
    if n < 1:
        raise ModelError(f"model {name!r}: num_classes must be ≥ 1, got {n}")
    _check_size(spec, n, overrides)
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
            f"model {name!r}{_described(overrides)}: not enough memory to build it: lower its size options"
        ) from None


# --------------------------------------------------------------------------- losses and accuracy


def _text_ce(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def loss_fn(task: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Cross entropy: per sample for images, averaged over every position for text."""
    return _text_ce if _check_task(task) == "text" else F.cross_entropy


def correct_count(task: str, logits: torch.Tensor, targets: torch.Tensor) -> int:
    """Top-1 hits for images; correctly predicted next characters (all positions) for text."""
    _check_task(task)
    return int((logits.argmax(dim=-1) == targets).sum().item())


def targets_count(task: str, targets: torch.Tensor) -> int:
    """How many predictions `correct_count` scored: samples for images, positions for text."""
    _check_task(task)
    return int(targets.numel())


# --------------------------------------------------------------------------- workload


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


def _input_shape_of(spec: ModelSpec, model: nn.Module) -> tuple[int, ...]:
    block = getattr(model, "block_size", None)
    return (int(block),) if spec.task == "text" and block else spec.input_shape


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
    shape = _input_shape_of(spec, model)
    x, y = example_batch(name, 2, n, generator=torch.Generator().manual_seed(0), input_shape=shape)
    device = next(model.parameters()).device
    return measure_workload(model, x.to(device), y.to(device), loss_fn(spec.task), name)
