"""A page's quotes of a seeded run, one per CPU that printed it, for the tests that tie a run to its quote.

Sample counts are reproducible on one machine, not across CPUs (docs/results/fleets.md: two 2-core
machines, the same code, two relation vectors), so a page quotes each machine's output under a line
naming its CPU — `powerfed.training.numerics.cpu_identity()` in backquotes after "CPU", or an unrecorded
one. A run must print the quote of its own CPU where the page has one, else one of the page's quotes;
either way a change that moves the numbers fails until the quotes are run again and pasted.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from powerfed.training.numerics import cpu_identity

LABEL = re.compile(r"CPU `([^`]+)`")


def quotes(text: str, start: str, first_line: str, block: Callable[[str], list[str]]) -> dict[str, list[str]]:
    """Every quote in the section that begins at the line holding `start` (up to the next heading): each
    quote begins at a line starting `first_line` and is cut by `block`; its key is the CPU the nearest
    label before it names."""
    section = text[text.index(start) :]
    heading = re.search(r"^#", section, flags=re.MULTILINE)
    section = section[: heading.start()] if heading else section
    found: dict[str, list[str]] = {}
    for match in re.finditer(rf"^\s*{re.escape(first_line)}", section, flags=re.MULTILINE):
        labels = LABEL.findall(section[: match.start()])
        cpu = labels[-1] if labels else "unrecorded"
        found[cpu] = block(section[match.start() :])
    return found


def check_against_quotes(printed: list[str], page: Path, found: dict[str, list[str]]) -> None:
    """`printed` is this CPU's quote, or (where the page quotes no run of this CPU) one of the page's."""
    cpu = cpu_identity()
    assert found, f"{page}: no quote found"
    if cpu in found:
        assert printed == found[cpu], (
            f"{page}: the quote for CPU `{cpu}` is stale; paste this run's:\n" + "\n".join(printed)
        )
    else:
        assert printed in found.values(), (
            f"{page}: this run matches none of the quotes (CPUs {sorted(found)}); paste it under a line "
            f"naming CPU `{cpu}`:\n" + "\n".join(printed)
        )
