"""What stands in for the torch APIs 1.13 lacks (docs/jetson.md) computes what torch's own computes.

Run on the current torch (both paths exist: each stand-in against torch's) and on torch 1.13 by
`make test-torch-floor` (only the stand-ins exist: each against the same quantity worked out here).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import powerctl.records.workload as workload
from powerfed.training.models import build_model, example_batch, get_model_spec
from powerfed.training.networks import _causal_attention, layer_norm
from powerfed.training.tasks import loss_fn

CONV_MODELS = ["cnn-tiny", "resnet18-small", "mobilenetv2-small"]


def conv_linear_training_flops(model: nn.Module, x: torch.Tensor) -> int:
    """FLOPs of one forward + backward of the conv and linear layers, from their shapes (hooks): forward
    2·out·fan_in, the weight gradient the same, the input gradient the same unless the layer's input
    needs none (the first layer's)."""
    total = 0

    def count(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):
            fan_in = module.in_channels // module.groups * math.prod(module.kernel_size)
        else:
            fan_in = module.in_features
        forward = 2 * out.numel() * fan_in
        total += forward * (3 if args[0].requires_grad else 2)

    hooks = [m.register_forward_hook(count) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        model.train()
        model(x)
    finally:
        for h in hooks:
            h.remove()
    return total


@pytest.mark.parametrize("name", CONV_MODELS)
def test_flops_without_torchs_counter_are_the_layers_flops(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build_model(name, seed=0)
    x, y = example_batch(name, 2, None)
    expected = conv_linear_training_flops(model, x) / 2
    task_loss = loss_fn(get_model_spec(name).task)
    own = workload.measure_workload(model, x, y, task_loss, name)
    if workload._flop_counter() is not None:  # torch ≥ 2.1: its counter and ours agree
        monkeypatch.setattr(workload, "_flop_counter", lambda: None)
        fallback = workload.measure_workload(model, x, y, task_loss, name)
        assert fallback.flops_per_sample == own.flops_per_sample
        assert fallback.kernels_per_step == own.kernels_per_step
        assert fallback.activation_bytes_per_sample == own.activation_bytes_per_sample
    assert own.flops_per_sample == pytest.approx(expected, rel=1e-9)
    assert own.activation_bytes_per_sample > 0 and own.kernels_per_step > 0


def test_bias_free_layer_norm_is_the_formula_and_torchs() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16)
    ln = layer_norm(16)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
    assert [k for k, _ in ln.state_dict().items()] == ["weight"]  # same keys on every torch
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    formula = (x - mean) / torch.sqrt(var + 1e-5) * ln.weight
    torch.testing.assert_close(ln(x), formula, rtol=1e-5, atol=1e-5)


def test_causal_attention_without_sdpa_is_torchs(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8) for _ in range(3))
    # the attention written out, position by position: each query sees itself and the keys before it
    expected = torch.empty_like(q)
    for t in range(7):
        w = torch.softmax((q[..., t : t + 1, :] @ k[..., : t + 1, :].transpose(-2, -1)) / math.sqrt(8), -1)
        expected[..., t, :] = (w @ v[..., : t + 1, :])[..., 0, :]
    got = _causal_attention(q, k, v, 0.0)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    if hasattr(F, "scaled_dot_product_attention"):  # torch ≥ 2.0: the written-out path agrees too
        monkeypatch.delattr(F, "scaled_dot_product_attention")
        torch.testing.assert_close(_causal_attention(q, k, v, 0.0), got, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["cnn-tiny", "resnet18-small", "mobilenetv2-small", "chartransformer-small"])
def test_every_small_model_has_a_workload(name: str) -> None:
    """What a board's profile is priced from: FLOPs, activations and kernels of a training step."""
    from powerfed.training.models import model_workload

    w = model_workload(name, build_model(name, seed=0))
    assert w.flops_per_sample > 0 and w.activation_bytes_per_sample > 0 and w.kernels_per_step > 0
    assert w.traffic_bytes_per_sample > 0 and w.parameter_bytes > 0


def test_the_char_transformer_trains_a_step() -> None:
    model = build_model("chartransformer-small", seed=0)
    x, y = example_batch("chartransformer-small", 2, None)
    loss = loss_fn(get_model_spec("chartransformer-small").task)(model(x), y)
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
