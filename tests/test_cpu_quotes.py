"""The per-CPU quotes the repeatable-run tests compare against: found on their pages, and a run must
print its own CPU's quote where the page has one, else one of the page's (tests/cpu_quotes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.cpu_quotes as cpu_quotes
from tests.test_fleet_run import MARK, _blocks
from tests.test_repeatable_run import _round_one_table

ROOT = Path(__file__).resolve().parents[1]
PAGES = {
    "fleet": (ROOT / "docs" / "results" / "fleets.md", MARK, "fleet tiny:", _blocks),
    "run": (ROOT / "docs/howto/flwr-run.md", "make run NODES=2", "[round 1] clients", _round_one_table),
}
PAGE = """\
## A quoted run

Run by `tests/x.py`. On an earlier machine (its CPU not recorded):

    [round 1] clients
    a 1
    b 2

On CPU `AVX2 AMD EPYC` (`abc1234`):

    [round 1] clients
    a 1
    b 3

## The next section

    [round 1] clients
    not this one
"""


def _block(text: str) -> list[str]:
    lines = [line.strip() for line in text.strip().splitlines()]
    return lines[: lines.index("")] if "" in lines else lines


@pytest.mark.parametrize("name", sorted(PAGES))
def test_each_page_quotes_its_run_for_this_projects_cpu(name: str) -> None:
    page, start, first, block = PAGES[name]
    found = cpu_quotes.quotes(page.read_text(encoding="utf-8"), start, first, block)
    assert "AVX2 AMD EPYC" in found and all(len(q) > 5 for q in found.values()), sorted(found)


def test_a_run_must_print_its_cpus_quote_or_one_of_the_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    found = cpu_quotes.quotes(PAGE, "tests/x.py", "[round 1] clients", _block)
    assert found == {
        "unrecorded": ["[round 1] clients", "a 1", "b 2"],
        "AVX2 AMD EPYC": ["[round 1] clients", "a 1", "b 3"],
    }  # up to the next heading only
    epyc, other = found["AVX2 AMD EPYC"], found["unrecorded"]
    page = Path("page.md")

    monkeypatch.setattr(cpu_quotes, "cpu_identity", lambda: "AVX2 AMD EPYC")
    cpu_quotes.check_against_quotes(epyc, page, found)
    with pytest.raises(AssertionError, match="quote for CPU `AVX2 AMD EPYC` is stale"):
        cpu_quotes.check_against_quotes(other, page, found)  # another CPU's numbers on this one

    monkeypatch.setattr(cpu_quotes, "cpu_identity", lambda: "AVX512 a third CPU")
    cpu_quotes.check_against_quotes(other, page, found)  # no quote of its own: one of the page's
    with pytest.raises(AssertionError, match="naming CPU `AVX512 a third CPU`"):
        cpu_quotes.check_against_quotes([*epyc[:-1], "b 4"], page, found)
