"""Model registry: architectures match the references, costs are measured right, training works."""

from __future__ import annotations

import pytest
import torch

from powerfed.training.errors import ModelError
from powerfed.training.models import build_model, example_batch, get_model_spec, model_names, model_workload
from powerfed.training.synthetic import synthetic_image, synthetic_text
from powerfed.training.tasks import VOCAB, VOCAB_SIZE, correct_count, loss_fn, targets_count

ALL = model_names()
FAST = [n for n in ALL if n not in ("resnet18", "mobilenetv2", "chartransformer")]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small CPU kernels: one thread is fastest, and immune to spinning when the host is busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_vocabulary_is_the_papers() -> None:
    assert VOCAB_SIZE == 96 == len(set(VOCAB))
    assert VOCAB.endswith(" \n") and "a" in VOCAB and "~" in VOCAB


def test_registry_lists_the_promised_models() -> None:
    expected = {"resnet18", "resnet18-small", "mobilenetv2", "mobilenetv2-small", "chartransformer"}
    assert expected | {"chartransformer-small", "cnn-tiny"} <= set(ALL)
    assert get_model_spec("resnet18").input_shape == (3, 32, 32)
    assert get_model_spec("chartransformer").task == "text"
    assert get_model_spec("chartransformer").input_shape == (64,)


@pytest.mark.parametrize("name", ALL)
def test_forward_shape(name: str) -> None:
    spec = get_model_spec(name)
    model = build_model(name, seed=0).eval()
    x, _ = example_batch(name, 2)
    with torch.no_grad():
        out = model(x)
    if spec.task == "image":
        assert x.shape == (2, 3, 32, 32) and out.shape == (2, 10)
    else:
        assert x.shape == (2, 64) and x.dtype == torch.int64 and out.shape == (2, 64, VOCAB_SIZE)


def test_parameter_counts_match_the_reference_architectures() -> None:
    # torchvision-style CIFAR ResNet18 (kuangliu/pytorch-cifar): the well-known 11,173,962
    assert n_params(build_model("resnet18")) == 11_173_962
    assert n_params(build_model("resnet18", 100)) == 11_173_962 + 90 * 512 + 90
    # torchvision mobilenet_v2(num_classes=10): 2,236,682 (strides do not change the count)
    assert n_params(build_model("mobilenetv2")) == 2_236_682
    # 6 layers × (qkv 256·756 + proj 252·256 + MLP 2·256·1024 + 2 LN 256) + tok 96·256 + pos 64·256 + LN
    assert n_params(build_model("chartransformer")) == 6 * (256 * 756 + 252 * 256 + 2 * 256 * 1024 + 512) + (
        96 * 256 + 64 * 256 + 256
    )
    assert n_params(build_model("resnet18-small")) < n_params(build_model("resnet18")) / 10


def test_chartransformer_keeps_six_heads_and_256_wide() -> None:
    model = build_model("chartransformer")
    attn = model.blocks[0].attn
    assert len(model.blocks) == 6 and model.wte.embedding_dim == 256 and model.block_size == 64
    assert attn.n_head == 6 and attn.head_dim == 42
    assert model.lm_head.weight is model.wte.weight


def test_mobilenetv2_cifar_stem_keeps_resolution() -> None:
    model = build_model("mobilenetv2").eval()
    with torch.no_grad():
        feats = model.features(torch.zeros(1, 3, 32, 32))
    assert feats.shape == (1, 1280, 4, 4)  # reduced 8×, not 32×


def test_overrides_change_sizes_and_unknown_ones_are_refused() -> None:
    small = build_model("chartransformer", n_layer=1, n_head=2, n_embd=32, seq_len=16)
    assert len(small.blocks) == 1 and small.block_size == 16
    assert small(torch.zeros(3, 16, dtype=torch.int64)).shape == (3, 16, VOCAB_SIZE)
    assert n_params(build_model("resnet18", width=8)) < n_params(build_model("resnet18-small"))
    with pytest.raises(ModelError, match="no option depth"):
        build_model("resnet18", depth=50)
    with pytest.raises(ModelError, match="exceeds its context"):
        small(torch.zeros(1, 17, dtype=torch.int64))


def test_unknown_model_lists_the_choices() -> None:
    with pytest.raises(ModelError, match="resnet18") as err:
        get_model_spec("vgg16")
    assert "\n" not in str(err.value)
    with pytest.raises(ModelError):
        build_model("vgg16")


def test_same_seed_same_weights_and_global_rng_untouched() -> None:
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    a = build_model("resnet18-small", seed=7).state_dict()
    after = torch.rand(3)
    b = build_model("resnet18-small", seed=7).state_dict()
    c = build_model("resnet18-small", seed=8).state_dict()
    assert torch.equal(before, after)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_loss_and_accuracy_definitions() -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
    targets = torch.tensor([0, 0, 0])
    assert correct_count("image", logits, targets) == 2 and targets_count("image", targets) == 3
    assert loss_fn("image")(logits, targets).item() == pytest.approx(
        torch.nn.functional.cross_entropy(logits, targets).item()
    )
    text_logits = torch.zeros(2, 3, 4)
    text_logits[0, :, 1] = 1.0  # predicts 1 everywhere in the first window
    text_targets = torch.tensor([[1, 1, 2], [0, 3, 0]])
    assert correct_count("text", text_logits, text_targets) == 2 + 2  # second window predicts 0 (argmax tie)
    assert targets_count("text", text_targets) == 6
    expected = torch.nn.functional.cross_entropy(text_logits.reshape(6, 4), text_targets.reshape(6))
    assert loss_fn("text")(text_logits, text_targets).item() == pytest.approx(expected.item())
    with pytest.raises(ModelError):
        loss_fn("audio")


def test_example_batch_is_seeded_and_typed() -> None:
    a = example_batch("cnn-tiny", 4, generator=torch.Generator().manual_seed(1))
    b = example_batch("cnn-tiny", 4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a[0], b[0]) and a[1].dtype == torch.int64 and int(a[1].max()) < 10
    x, y = example_batch("chartransformer-small", 3)
    assert x.shape == y.shape == (3, 64) and int(x.max()) < VOCAB_SIZE


def _workload(name: str, model: torch.nn.Module | None = None):  # type: ignore[no-untyped-def]
    return model_workload(name, model if model is not None else build_model(name, seed=0))


def test_workload_costs_are_positive_and_grow_with_the_model() -> None:
    models = {n: build_model(n, seed=0) for n in ("cnn-tiny", "chartransformer-small")}
    loads = {n: model_workload(n, m) for n, m in models.items()}
    for name, w in loads.items():
        assert w.flops_per_sample > 0 and w.activation_bytes_per_sample > 0, name
        assert w.parameter_bytes == 4 * sum(p.numel() for p in models[name].parameters()) > 0
    wider = model_workload("cnn-tiny", build_model("cnn-tiny", width=32))
    assert wider.flops_per_sample > 2 * loads["cnn-tiny"].flops_per_sample
    assert wider.activation_bytes_per_sample > loads["cnn-tiny"].activation_bytes_per_sample


def _forward_flops(model: torch.nn.Module, x: torch.Tensor) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(x)
    return counter.get_total_flops() / len(x)


@pytest.mark.parametrize("name", ["resnet18-small", "mobilenetv2-small"])
def test_training_flops_are_about_three_forwards(name: str) -> None:
    """Backward ≈ 2× forward. torch's counter charges a depthwise conv's weight gradient as if it were
    dense (MobileNetV2 came out 7× too high); model_workload corrects it."""
    model = build_model(name, seed=0)
    w = model_workload(name, model)
    ratio = w.flops_per_sample / _forward_flops(model, example_batch(name, 2)[0])
    assert 2.5 < ratio < 3.5


def test_flop_table_is_restored_after_measuring() -> None:
    from torch.utils import flop_counter as fc

    before = dict(fc.flop_registry)
    model_workload("mobilenetv2-small", build_model("mobilenetv2-small"))
    assert fc.flop_registry == before


def test_attention_flops_are_counted_on_cpu() -> None:
    model = build_model("chartransformer-small", seed=0)
    w = model_workload("chartransformer-small", model)
    dense = 6 * sum(p.numel() for n, p in model.named_parameters() if "blocks" in n) * 64
    attention = 2 * (2 + 5) * 64 * 64 * 64  # 2 layers, fwd 2 + bwd 5 matmuls of T×T×d per layer
    assert w.flops_per_sample >= dense + attention


def test_model_workload_uses_the_models_context_length() -> None:
    w = model_workload("chartransformer-small", build_model("chartransformer-small", seq_len=16))
    assert w.input_shape == (16,)


@pytest.mark.slow
def test_full_size_costs() -> None:
    r, m, c = (_workload(n).flops_per_sample for n in ("resnet18", "mobilenetv2", "chartransformer"))
    assert 3.2e9 < r < 3.5e9  # 3 × 0.56 GMAC forward at 32×32
    assert 0.45e9 < m < 0.6e9
    assert c > 6 * 4.7e6 * 64
    assert r > _workload("resnet18-small").flops_per_sample
    assert m > _workload("mobilenetv2-small").flops_per_sample
    assert c > _workload("chartransformer-small").flops_per_sample


# --------------------------------------------------------------------------- training


def _train(
    name: str, train, steps: int, batch: int, lr: float, seed: int = 0
) -> tuple[torch.nn.Module, list[float]]:
    task = get_model_spec(name).task
    model = (
        build_model(name, train.num_classes, seed=seed, seq_len=train.x.shape[1])
        if task == "text"
        else (build_model(name, train.num_classes, seed=seed))
    )
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(steps):
        idx = torch.randint(0, len(train), (batch,), generator=g)
        loss = loss_fn(task)(model(train.x[idx]), train.y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def _accuracy(name: str, model: torch.nn.Module, ds) -> float:
    task = get_model_spec(name).task
    model.eval()
    with torch.no_grad():
        return correct_count(task, model(ds.x), ds.y) / targets_count(task, ds.y)


@pytest.mark.parametrize("name", FAST)
def test_a_few_steps_reduce_the_loss(name: str) -> None:
    task = get_model_spec(name).task
    if task == "image":
        data = synthetic_image(8)
        model = build_model(name, seed=0)
    else:
        data = synthetic_text(5_000, seq_len=32).subset(range(8))
        model = build_model(name, seed=0, seq_len=32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    losses = []
    for _ in range(6):  # the same batch: its loss must fall
        loss = loss_fn(task)(model(data.x), data.y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_synthetic_images_are_learnable_quickly() -> None:
    train, test = synthetic_image(2000), synthetic_image(300, split="test")
    model, _ = _train("cnn-tiny", train, steps=40, batch=32, lr=2e-3)
    assert _accuracy("cnn-tiny", model, test) > 0.45  # chance: 0.10


def test_synthetic_text_is_learnable_quickly() -> None:
    train, test = synthetic_text(40_000, seq_len=32), synthetic_text(40_000, seq_len=32, split="test")
    model, _ = _train("chartransformer-small", train, steps=40, batch=16, lr=3e-3)
    assert _accuracy("chartransformer-small", model, test) > 0.25  # chance 1/96, most frequent symbol ~0.09


@pytest.mark.slow
def test_synthetic_images_reach_the_tuned_plateau() -> None:
    train, test = synthetic_image(4000), synthetic_image(1000, split="test")
    model, _ = _train("cnn-tiny", train, steps=250, batch=32, lr=1e-3)
    assert 0.75 < _accuracy("cnn-tiny", model, test) < 0.97  # learnable, with a ceiling below 100%


@pytest.mark.slow
def test_synthetic_text_needs_two_characters_of_context() -> None:
    train, test = synthetic_text(), synthetic_text(split="test")
    model, _ = _train("chartransformer-small", train, steps=200, batch=32, lr=3e-3)
    acc = _accuracy("chartransformer-small", model, test)
    assert 0.44 < acc <= test.info["accuracy_ceiling"] + 0.02  # above order-1's ~0.37


@pytest.mark.slow
def test_batch_size_changes_samples_to_target() -> None:
    """What makes the relation vector meaningful: with sqrt-scaled learning rates, small batches reach
    the target on fewer samples than large ones."""
    train, test = synthetic_image(4000), synthetic_image(500, split="test")

    def samples_to(batch: int, target: float = 0.8) -> int:
        model = build_model("cnn-tiny", seed=0)
        opt = torch.optim.Adam(model.parameters(), lr=2e-3 * (batch / 128) ** 0.5)
        g = torch.Generator().manual_seed(0)
        seen = 0
        while seen < 20_000:
            order = torch.randperm(len(train), generator=g)
            for i in range(0, len(train) - batch + 1, batch):
                idx = order[i : i + batch]
                model.train()
                opt.zero_grad()
                loss_fn("image")(model(train.x[idx]), train.y[idx]).backward()
                opt.step()
                seen += batch
                if seen % 256 < batch and _accuracy("cnn-tiny", model, test) >= target:
                    return seen
        raise AssertionError(f"batch {batch} never reached {target}")

    assert samples_to(8) < 0.75 * samples_to(128)


def test_the_built_in_models_know_they_are_built_in() -> None:
    """Their networks live in `powerfed.training.networks`: a built-in's entry says so (the relation
    estimate treats a user's model as user code), a user's factory's does not."""
    from powerfed.training.models import BUILT_IN, model_spec

    assert BUILT_IN and all(get_model_spec(name).builtin for name in BUILT_IN)
    assert not model_spec("mine", lambda: torch.nn.Linear(2, 2), input_shape=(2,)).builtin
