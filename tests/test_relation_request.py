"""What a relation estimate is (`RelationRequest`): its key is the cache's file name, unchanged for the same
inputs, and its settings are checked by the run settings' own declarations."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import fl_server.app as server_app
import powerfed.training.numerics as numerics
from fl_server import shipped
from fl_server.relation import RelationCompute, RelationSettings, estimate_relation
from fl_server.run_config import parse_server_config
from powerctl.errors import ArgumentError
from powerctl.records.relation import RelationVector
from strategies.settings import SETTINGS, key_of


def test_the_shipped_vector_is_found_under_the_key_its_recipe_makes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The estimate the default run asks for, on the machine the shipped vector was made on, is keyed as
    the shipped file says: caches made before are still found."""
    monkeypatch.setenv("POWERFED_CACHE", str(tmp_path / "cache"))
    manifest = json.loads((shipped.SHIPPED_DIR / shipped.MANIFEST).read_text())
    made_on = manifest["made_on"]
    entry = next(e for e in manifest["files"] if e["kind"] == "relation")
    relation_file = shipped.SHIPPED_DIR / entry["file"]
    key = json.loads(relation_file.read_text())["cache_key"]
    monkeypatch.setattr(numerics, "cpu_identity", lambda: made_on["cpu"])
    monkeypatch.setattr(numerics, "torch_minor", lambda: made_on["torch"])
    cfg = parse_server_config({})
    weights = server_app.pretrained_weights(cfg)  # the shipped weights, unpacked
    assert server_app.is_shipped(weights)
    cache = tmp_path / "relation"
    cache.mkdir()
    shutil.copy(relation_file, cache / f"relation-{key[:40]}.json")
    threads = torch.get_num_threads()
    torch.set_num_threads(made_on["threads"])
    try:
        found = estimate_relation(
            cfg.model,
            weights,
            cfg.proxy_data,
            target_accuracy=cfg.target_accuracy,
            batch_sizes=cfg.batch_sizes,
            settings=server_app.relation_settings(cfg),
            how=RelationCompute(compute=False, cache_dir=cache, progress=False),
        )
    finally:
        torch.set_num_threads(threads)
    assert found.to_dict() == RelationVector.load(relation_file).to_dict()


@pytest.mark.parametrize(
    ("field", "attr", "value"),
    [
        ("max_samples", "relation_max_samples", 10**10),
        ("eval_every_samples", "eval_every_samples", 10**10),
        ("max_seeds", "relation_max_seeds", 65),
        ("vector", "relation_values", "mean"),
    ],
)
def test_a_setting_is_refused_as_the_run_config_refuses_it(field: str, attr: str, value: object) -> None:
    """A relation setting that is a run setting has the run setting's range: what a run config refuses
    is refused here too, in one line naming the call and the setting."""
    declared = SETTINGS[key_of(attr)]
    with pytest.raises(ArgumentError) as err:
        RelationSettings(**{field: value})
    assert str(err.value).startswith(f"estimate_relation: {field!r} must be {declared.kind.expected}")
