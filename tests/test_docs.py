"""The documentation stays true to the tree: links resolve, the README stays short, code cites docs/,
and the reference pages name every command-line option and run config key the code defines."""

from __future__ import annotations

import argparse
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
CITATION = re.compile(r"DESIGN(?:\.md|\s*§)")
SKIP_DIRS = {".git", ".venv", "runs", "build", "dist", "node_modules"}


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose(text: str) -> str:
    """The text without fenced blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = CODE_SPAN.sub(lambda m: m.group(0).strip("`"), heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path.read_text(encoding="utf-8"))) if not re.match(r"[a-z]+:", t)]


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_at_files_and_headings(page):
    problems = []
    for target in relative_links(page):
        file_part, _, fragment = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        rel = dest.relative_to(ROOT).as_posix() if dest.is_relative_to(ROOT) else str(dest)
        if not dest.exists():
            problems.append(f"{target}: no such file {rel}")
            continue
        if fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            problems.append(f"{target}: no heading #{fragment} in {rel}")
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail into docs/"
    )


def test_code_cites_docs_not_the_design_file():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if SKIP_DIRS & set(path.relative_to(ROOT).parts):
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if CITATION.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "cite a docs/ page instead (the design file is not in a clone):\n" + "\n".join(found)


def _options(parser: argparse.ArgumentParser, prog: str) -> list[tuple[str, str]]:
    """(command, option) for every option of `parser` and its subcommands, --help left out."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += _options(sub, f"{prog} {name}")
        else:
            out += [(prog, o) for o in action.option_strings if o not in ("-h", "--help")]
    return out


def test_cli_reference_names_every_option():
    from fl_server.cli import build_parser as fl_server_parser
    from powerctl.cli import build_parser as powerctl_parser
    from simulations.__main__ import build_parser as simulations_parser

    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    commands = {
        "powerctl": powerctl_parser(),
        "fl-server": fl_server_parser(),
        "python -m simulations": simulations_parser(),
    }
    sections = dict(re.findall(r"^#+ `([^`]+)`[^\n]*\n(.*?)(?=^#|\Z)", page, re.S | re.M))
    missing = []
    for prog, parser in commands.items():
        for command, option in _options(parser, prog):
            if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", sections.get(command, "")):
                missing.append(f"{command} {option}")
    assert not missing, "docs/reference/cli.md lacks (regenerate its usage blocks):\n" + "\n".join(missing)


def test_run_config_reference_has_every_key_with_its_default():
    tomllib = pytest.importorskip("tomllib")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["flwr"]["app"][
        "config"
    ]
    page = (ROOT / "docs" / "reference" / "run-config.md").read_text(encoding="utf-8")
    rows = {}
    for line in page.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`"):
            keys = re.findall(r"`([a-z0-9-]+)`", cells[0])
            defaults = re.findall(r"`([^`]*)`", cells[1])
            if len(defaults) == 1:
                defaults *= len(keys)
            rows.update(zip(keys, defaults, strict=True))

    def toml(value: object) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        return f'"{value}"' if isinstance(value, str) else repr(value)

    problems = [f"{k}: not in the page" for k in declared if k not in rows]
    problems += [
        f"{k}: the page says {rows[k]}, pyproject.toml {toml(v)}"
        for k, v in declared.items()
        if k in rows and rows[k] != toml(v)
    ]
    problems += [f"{k}: in the page, not declared" for k in rows if k not in declared]
    assert not problems, "docs/reference/run-config.md:\n" + "\n".join(problems)
