"""The built-in networks in plain torch: ResNet18 (CIFAR stem), MobileNetV2 for 32x32, a two-conv CNN,
and a character transformer; `powerfed.training.models` registers them by name."""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn

from powerfed.training.errors import ModelError
from powerfed.training.tasks import VOCAB_SIZE


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
    """The standard MobileNetV2 (Sandler et al. 2018; torchvision layout) for 32×32 inputs: the stem and
    the first stride-2 stage (24 channels) use stride 1, so the input is reduced 8× (to 4×4), not 32×."""

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
    """nanoGPT's causal attention, its inner width n_head · head_dim (may be a little less than n_embd,
    as T5's d_kv)."""

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
    """The paper's character-level GPT: 6 layers, 6 heads, 256 wide, context 64 (nanoGPT-style). Each
    head is 256 // 6 = 42 wide (attention in 252 dimensions, projected back to 256). Learned position
    embeddings, no biases, output head tied to the token embedding."""

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
