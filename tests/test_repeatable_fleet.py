"""`make fleet`'s default fleet at a reduced size prints what docs/results/fleets.md quotes of it: the
default task, seeds and methods' rules (simulations/fleets/default.yaml) on one board of each kind, with
fewer rounds, relation seeds and batch sizes, a smaller pre-training and round budget — the way
tests/test_repeatable_run.py ties `make run` to its quote. A change that moves the fleet's numbers
(a default, a seed, the relation estimate) fails here until the quote is re-run and pasted (one quote
per CPU: tests/cpu_quotes.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulations.fleet import load_fleet_spec
from simulations.runner import run_fleet
from tests.cpu_quotes import check_against_quotes, quotes
from tests.test_repeatable_run import REDUCED

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT / "simulations" / "fleets" / "default.yaml"
QUOTED = ROOT / "docs" / "results" / "fleets.md"
"""The page that quotes this run's summary (the block after the line naming this test)."""
MARK = "tests/test_repeatable_fleet.py"


def reduced_fleet(path: Path) -> Path:
    """default.yaml at a reduced size, written to `path`: the first group of each board kind, one round,
    two ranks of the relation vector from one seed, 256 pre-training samples, 512 samples a round.
    Only sizes change: the model, data, target, learning rate, seeds and evaluation grid are the
    default fleet's."""
    fleet: dict[str, Any] = yaml.safe_load(DEFAULT.read_text(encoding="utf-8"))
    fleet["name"] = "default-reduced"
    first = {g["device"]: g for g in reversed(fleet["groups"])}
    fleet["groups"] = [g for g in fleet["groups"] if first[g["device"]] is g]
    fleet["task"].update({"pretrain-samples": 256, "batch-sizes": [32, 64]})
    fleet["rounds"] = 1
    fleet["seeds"]["relation"] = [0]
    fleet["budget"]["samples"] = 512
    fleet["evaluation"]["max-samples"] = 100
    fleet["methods"] = ["ours", "state-of-practice"]
    path.write_text(yaml.safe_dump(fleet, sort_keys=False), encoding="utf-8")
    return path


def _blocks(text: str) -> list[str]:
    """The summary's method table and round-1 choices table: every line from `fleet NAME:` through the
    choices table, without the definitions paragraph between them."""
    lines = [line.strip() for line in text.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.startswith("fleet default-reduced:"))
    table = lines[start : lines.index("", start)]
    first = next(i for i, line in enumerate(lines) if i > start and line.startswith("round 1: device"))
    end = next((i for i in range(first, len(lines)) if not lines[i]), len(lines))
    return table + lines[first:end]


def _quoted() -> dict[str, list[str]]:
    """The page's quotes of this run, by the CPU that printed each."""
    return quotes(QUOTED.read_text(encoding="utf-8"), MARK, "fleet default-reduced:", _blocks)


@pytest.mark.slow
def test_the_default_fleet_at_a_reduced_size_prints_its_quote(
    tmp_path: Path, seeded_cache: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # the reduced fleet's pre-training and relation vector are the reduced run's (the same keys): built
    # once per test run, shared with tests/test_repeatable_run.py
    monkeypatch.setenv("POWERFED_CACHE", str(seeded_cache(REDUCED)))
    spec = load_fleet_spec(reduced_fleet(tmp_path / "default-reduced.yaml"))
    default = load_fleet_spec(DEFAULT)
    assert spec.settings.model == default.settings.model == "resnet18-small"  # the default task
    assert spec.settings.target_accuracy == default.settings.target_accuracy
    assert sorted(b.device for b in spec.boards) == ["sim:jetson-nano", "sim:jetson-tx2nx"]
    results = run_fleet(spec, tmp_path / "out", spec.methods, echo=lambda _: None, plots=False)
    assert results["failures"] == [] and not results["processes"]["alive_after"]
    printed = (tmp_path / "out" / "summary.txt").read_text(encoding="utf-8")
    check_against_quotes(_blocks(printed), QUOTED.relative_to(ROOT), _quoted())
