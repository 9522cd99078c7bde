"""Pre-training writes weights that rebuild the trained model; weights files are safe and checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from fl_server.pretrain import PretrainSettings, pretrain, report_path_for
from fl_server.weights import load_model, load_weights, save_weights, weights_hash
from powerfed.training.data import load_dataset, train_test_split
from powerfed.training.errors import DataError, ModelError
from powerfed.training.evaluation import evaluate
from powerfed.training.models import build_model

SAMPLES_32 = PretrainSettings(samples=32)


def test_pretrain_writes_weights_and_report_of_the_trained_model(tmp_path: Path) -> None:
    out = tmp_path / "w" / "cnn.safetensors"
    settings = PretrainSettings(samples=320, batch_size=16, lr=2e-3, limit=200)
    rep = pretrain("cnn-tiny", "synthetic-image", out=out, settings=settings, progress=False)
    assert rep.weights_path == out and rep.report_path == tmp_path / "w" / "cnn.report.json"
    data = json.loads(rep.report_path.read_text())
    assert data["schema"] == "fl_server.pretrain/2" and data["model"] == "cnn-tiny"
    train, test = train_test_split(load_dataset("synthetic-image", split="all", limit=200))
    assert data["samples"] == 320 and data["steps"] == 20
    assert (data["train_size"], data["test_size"]) == (len(train), len(test))
    assert data["curve"][0][0] == 0 and data["curve"][-1][0] == 320
    assert data["weights_sha256"] == weights_hash(out)
    # the saved weights are the trained ones: they score the reported accuracy on the same test split
    model, meta = load_model(out)
    assert meta.model == "cnn-tiny" and meta.num_classes == 10 and meta.task == "image"
    assert evaluate(model, "image", test.x, test.y) == pytest.approx(data["final_test_accuracy"])
    assert data["final_test_accuracy"] > data["curve"][0][2]  # and training did something


def test_pretrain_text_with_overrides_and_epochs(tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 80, encoding="utf-8")
    rep = pretrain(
        "chartransformer-small",
        f"text:{text}",
        out=tmp_path / "c.safetensors",
        settings=PretrainSettings(epochs=0.5, batch_size=8, overrides={"n_embd": 32, "seq_len": 16}),
        progress=False,
    )
    assert rep.data["seq_len"] == 16 and rep.data["overrides"] == {"n_embd": 32, "seq_len": 16}
    assert rep.data["samples"] == pytest.approx(0.5 * rep.data["train_size"], abs=8)
    model, meta = load_model(rep.weights_path)
    assert meta.overrides == {"n_embd": 32, "seq_len": 16} and model.wte.embedding_dim == 32


def test_pretrain_bad_inputs_write_nothing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found"):
        pretrain(
            "cnn-tiny",
            "npz:/no/such/file.npz",
            out=tmp_path / "w.safetensors",
            settings=SAMPLES_32,
            progress=False,
        )
    with pytest.raises(DataError, match="text model"):
        pretrain(
            "chartransformer-small",
            "synthetic-image",
            out=tmp_path / "w.safetensors",
            settings=PretrainSettings(samples=32, limit=50),
            progress=False,
        )
    with pytest.raises(DataError, match="directory"):
        pretrain("cnn-tiny", "synthetic-image", out=tmp_path, settings=SAMPLES_32, progress=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("name", "overrides"), [("resnet18-small", {}), ("chartransformer-small", {"n_layer": 1, "seq_len": 8})]
)
def test_weights_round_trip_same_outputs(tmp_path: Path, name: str, overrides: dict) -> None:
    model = build_model(name, seed=5, **overrides)
    with torch.no_grad():  # make BatchNorm statistics non-default, so buffers are checked too
        for b in model.buffers():
            if b.dtype.is_floating_point:
                b.add_(0.1)
    path = tmp_path / "m.safetensors"
    save_weights(
        path,
        model,
        model_name=name,
        num_classes=10 if name.startswith("resnet") else 96,
        overrides=overrides,
        extra={"note": "test"},
    )
    loaded, meta = load_model(path, expect_model=name)
    x = torch.randn(2, 3, 32, 32) if name.startswith("resnet") else torch.randint(0, 96, (2, 8))
    model.eval(), loaded.eval()
    assert torch.equal(model(x), loaded(x))
    assert meta.overrides == overrides and meta.extra == {"note": "test"}
    assert weights_hash(model) == weights_hash(loaded) == weights_hash(path)


def test_weights_hash_is_canonical_and_sensitive() -> None:
    state = build_model("cnn-tiny", seed=0).state_dict()
    reordered = dict(reversed(list(state.items())))
    assert weights_hash(state) == weights_hash(reordered)
    changed = {k: v.clone() for k, v in state.items()}
    changed["fc.bias"][0] += 1e-6
    assert weights_hash(changed) != weights_hash(state)
    assert weights_hash(build_model("cnn-tiny", seed=1)) != weights_hash(state)


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    msg = str(exc.value)
    assert msg and "\n" not in msg
    return msg


def test_bad_weights_files_are_one_line_errors(tmp_path: Path) -> None:
    good = tmp_path / "good.safetensors"
    save_weights(good, build_model("cnn-tiny", seed=0), model_name="cnn-tiny", num_classes=10)
    blob = good.read_bytes()
    cases = {
        "missing.safetensors": None,
        "garbage.safetensors": b"definitely not a weights file" * 4,
        "truncated.safetensors": blob[: len(blob) // 2],
        "flipped.safetensors": blob[:-3] + bytes([blob[-3] ^ 0xFF]) + blob[-2:],
    }
    for name, content in cases.items():
        path = tmp_path / name
        if content is not None:
            path.write_bytes(content)
        with pytest.raises(DataError) as err:
            load_model(path)
        assert name in _one_line(err)
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))  # a safetensors file, but not ours
    with pytest.raises(DataError, match=r"not a powerfed\.weights/1"):
        load_weights(foreign)
    with pytest.raises(ModelError) as err:
        load_model(good, expect_model="resnet18-small")
    assert "cnn-tiny" in _one_line(err)


def test_report_path_sits_next_to_weights() -> None:
    assert report_path_for("a/b/w.safetensors") == Path("a/b/w.report.json")
