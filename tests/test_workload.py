"""What a workload counts: parameters once, activations per sample, kernels and traffic per step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from powerctl.devices import open_device
from powerctl.errors import DeviceOutOfMemory
from powerctl.records.workload import Workload, measure_workload


def _measure(model: nn.Module, batch: int) -> Workload:
    x, y = torch.randn(batch, 3, 8, 8), torch.randint(0, 10, (batch,))
    return measure_workload(model, x, y, nn.functional.cross_entropy, "m")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(192, 4096), nn.ReLU(), nn.Linear(4096, 10))


def test_weights_saved_by_autograd_are_parameters_not_activations() -> None:
    w = _measure(_mlp(), 2)
    # per sample: the input (192) and the hidden layer (4096, saved once though two nodes keep it),
    # float32; the 3 MiB weight matrix that the linear layers save is not per-sample memory
    assert w.activation_bytes_per_sample < 4 * (192 + 2 * 4096 + 10) + 64
    assert w.parameter_bytes == pytest.approx(4 * (192 * 4096 + 4096 + 4096 * 10 + 10))


def test_activation_memory_per_sample_does_not_depend_on_the_measuring_batch() -> None:
    a, b = _measure(_mlp(), 2), _measure(_mlp(), 8)
    assert a.activation_bytes_per_sample == pytest.approx(b.activation_bytes_per_sample, rel=0.05)
    assert a.traffic_bytes_per_sample == pytest.approx(
        b.traffic_bytes_per_sample, rel=0.15
    )  # + per-step scalars
    assert a.kernels_per_step == b.kernels_per_step > 4
    assert a.parameter_tensors == 4


def test_resnet18_at_128_fits_the_nano_and_mobilenetv2_at_128_does_not(
    paper_workloads: dict[str, Workload],
) -> None:
    # the paper trains ResNet18 at batch 128 on the 4 GB Nano and omits MobileNetV2 at 128 for memory
    nano = open_device("sim:jetson-nano")
    resnet, mobilenet = paper_workloads["resnet18"], paper_workloads["mobilenetv2"]
    assert 3 * 2**20 < resnet.activation_bytes_per_sample < 8 * 2**20  # 32x32 inputs: MiB, not tens
    nano.check_fits(resnet, 128)
    nano.check_fits(mobilenet, 64)
    with pytest.raises(DeviceOutOfMemory, match="batch size 128 of mobilenetv2"):
        nano.check_fits(mobilenet, 128)
