"""The per-CPU quotes the repeatable-run tests compare against: found on their pages, and a run must
print its own CPU's quote where the page has one (tests/cpu_quotes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.cpu_quotes as cpu_quotes
from tests.test_repeatable_fleet import MARK, _blocks
from tests.test_repeatable_run import _round_one_table

ROOT = Path(__file__).resolve().parents[1]
PAGES = {
    "fleet": (ROOT / "docs" / "results" / "fleets.md", MARK, "fleet default-reduced:", _blocks),
    "run": (ROOT / "docs/howto/flwr-run.md", "make run NODES=2", "[round 1] clients", _round_one_table),
}


@pytest.mark.parametrize("name", sorted(PAGES))
def test_each_page_quotes_its_run_per_cpu(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    page, start, first, block = PAGES[name]
    found = cpu_quotes.quotes(page.read_text(encoding="utf-8"), start, first, block)
    assert set(found) == {"unrecorded", "AVX2 AMD EPYC"} and all(len(q) > 5 for q in found.values())
    epyc, other = found["AVX2 AMD EPYC"], found["unrecorded"]
    assert epyc != other

    monkeypatch.setattr(cpu_quotes, "cpu_identity", lambda: "AVX2 AMD EPYC")
    cpu_quotes.check_against_quotes(epyc, page, found)
    with pytest.raises(AssertionError, match="quote for CPU `AVX2 AMD EPYC` is stale"):
        cpu_quotes.check_against_quotes(other, page, found)  # another CPU's numbers on this one

    monkeypatch.setattr(cpu_quotes, "cpu_identity", lambda: "AVX512 a third CPU")
    cpu_quotes.check_against_quotes(other, page, found)  # no quote of its own: one of the page's
    moved = [*epyc[:-1], epyc[-1] + " changed"]
    with pytest.raises(AssertionError, match="naming CPU `AVX512 a third CPU`"):
        cpu_quotes.check_against_quotes(moved, page, found)
