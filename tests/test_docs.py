"""The documentation stays true to the tree: links resolve, the README stays short, code cites docs/,
and the reference pages' generated blocks (docs/generate.py, `make docs`) are what the code makes now."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 150

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


def test_the_public_faces_docstring_examples_run() -> None:
    """The examples in `powerfed`'s docstring are doctests: a change to what they show fails here."""
    import doctest

    import powerfed

    result = doctest.testmod(powerfed)
    assert result.attempted >= 5 and result.failed == 0, result


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail into docs/"
    )


HEX_RUN = re.compile(r"(?<![\w-])[0-9a-f]{7,40}(?![\w-])")


def _git_knows_commit(name: str) -> bool:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{name}^{{commit}}"], capture_output=True, check=False
        )
    except OSError:  # no git: a source tarball
        return False
    return done.returncode == 0


def commit_ids(text: str) -> list[str]:
    """The commit ids a text names: runs of 7 to 40 hex digits that are no part of a longer word, mixing
    digits and letters (a word such as 'defaced' is letters only, a count digits only) or known to git."""
    found = []
    for run in HEX_RUN.findall(text):
        mixed = any(c.isdigit() for c in run) and any(c.isalpha() for c in run)
        if mixed or _git_knows_commit(run):
            found.append(run)
    return found


def test_readme_names_no_commit():
    """The README is no lab notebook: a figure's commit, command and CPU live on its docs/results page."""
    found = commit_ids((ROOT / "README.md").read_text(encoding="utf-8"))
    assert not found, f"README.md names commits {found}: move the figure and its provenance to docs/results/"


def test_a_commit_id_is_found_and_a_hex_word_or_a_count_is_not():
    text = "at `91d2368`, see 4c89d61a; it defaced 1234567 rows (cafe1234x, sha-1ab2c3d4)"
    assert commit_ids(text) == ["91d2368", "4c89d61a"]
    if shutil.which("git") and (ROOT / ".git").exists():  # a commit of any digits, by git
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=7", "HEAD"], capture_output=True)
        assert _git_knows_commit(head.stdout.decode().strip())


def _python_files() -> list[Path]:
    """The checkout's Python files: hidden folders (.git, every virtual environment: .venv,
    .venv-torch113, .venv-flwr141) and outputs pruned before they are walked."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS]
        found += [Path(folder) / f for f in files if f.endswith(".py")]
    return sorted(found)


def test_code_cites_docs_not_the_design_file():
    found = []
    for path in _python_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if CITATION.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "cite a docs/ page instead (the design file is not in a clone):\n" + "\n".join(found)


def _generator() -> ModuleType:
    """docs/generate.py (a script, not a package module), loaded once."""
    if "docs_generate" not in sys.modules:
        spec = importlib.util.spec_from_file_location("docs_generate", ROOT / "docs" / "generate.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["docs_generate"] = module
        spec.loader.exec_module(module)
    return sys.modules["docs_generate"]


def _usage_python() -> str | None:
    """The Python version cli.md's usage blocks were written with."""
    found = re.search(r"under Python (\d+\.\d+)", (ROOT / "docs" / "reference" / "cli.md").read_text())
    return found.group(1) if found else None


def _generated_pages() -> list[Path]:
    gen = _generator()
    return [page for page in gen.pages() if page == gen.PYPROJECT or gen.blocks(page)]


@pytest.mark.parametrize("page", _generated_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_generated_blocks_are_what_the_code_makes_now(page):
    """Every generated block (settings tables, usage blocks, pyproject's app config) equals what the
    declaration and the parsers make now. argparse's layout differs a little between Python versions,
    so the usage blocks are compared under the version that wrote them."""
    gen = _generator()
    kinds = set(gen.MAKERS)
    if _usage_python() != gen.python_version():
        kinds -= {"usage", "usage-python"}
    _, changed = gen.regenerated(page, kinds=kinds)
    assert not changed, f"{page.relative_to(ROOT)} is stale, run make docs: {'; '.join(changed)}"


def test_every_setting_group_and_command_has_one_block():
    gen = _generator()
    names = [name for page in gen.pages() if page != gen.PYPROJECT for name in gen.blocks(page)]
    wanted = [f"settings {g}" for g in gen.GROUPS] + [f"usage {c}" for c in gen.every_command()]
    wanted += ["usage-python", "fleet-places"]
    missing = [w for w in wanted if w not in names]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not missing and not twice, f"docs/ lacks blocks {missing}, has twice {twice}"
    assert all(s.group in gen.GROUPS for s in gen.SETTINGS.values())


def test_a_changed_block_is_named_stale_and_made_again():
    """The check can fail: a default edited by hand in run-config.md, and a flag dropped from a usage
    block of cli.md, are named, and regenerating gives the page back as it was."""
    gen = _generator()
    page = ROOT / "docs" / "reference" / "run-config.md"
    text = page.read_text(encoding="utf-8")
    edited = text.replace("| `num-server-rounds` | `2` |", "| `num-server-rounds` | `3` |")
    assert edited != text
    again, changed = gen.regenerated(page, edited)
    assert changed == ["settings rounds"] and again == text

    cli = ROOT / "docs" / "reference" / "cli.md"
    text = cli.read_text(encoding="utf-8")
    edited = text.replace("[--relation-rule {", "[--rule {", 1)
    assert edited != text
    again, changed = gen.regenerated(cli, edited, kinds={"usage"})
    assert changed == ["usage powerctl select"] and again == text


def test_an_unknown_block_or_a_setting_without_a_group_is_one_clear_error(monkeypatch):
    gen = _generator()
    page = ROOT / "docs" / "reference" / "run-config.md"
    unknown = "<!-- generated by make docs: setings task -->\n<!-- end generated -->\n"
    with pytest.raises(gen.GenerateError, match="unknown generated block 'setings task'"):
        gen.regenerated(page, unknown)
    ungrouped = dict(gen.SETTINGS, seed=dataclasses.replace(gen.SETTINGS["seed"], group=""))
    monkeypatch.setattr(gen, "SETTINGS", ungrouped)
    with pytest.raises(gen.GenerateError, match="setting seed has no group"):
        gen.regenerated(page)


def test_check_names_stale_pages_and_writes_nothing(tmp_path, monkeypatch, capsys):
    gen = _generator()
    page = tmp_path / "page.md"
    stale = "<!-- generated by make docs: usage-python -->\nold\n<!-- end generated -->\n"
    page.write_text(stale)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    monkeypatch.setattr(gen, "pages", lambda: [page])
    assert gen.main(["--check"]) == 1
    assert "page.md: stale: usage-python (run make docs)" in capsys.readouterr().out
    assert page.read_text() == stale
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
    assert "under Python" in page.read_text()


def test_run_config_reference_has_every_key_with_its_default():
    """Read back through TOML and the page's tables, independently of the generator."""
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
    assert not problems, "docs/reference/run-config.md (run make docs):\n" + "\n".join(problems)


def test_node_config_reference_names_every_node_key_and_dataset_kind():
    """node-config.md is written by hand (the node keys have no help to generate from): it names every
    key `fl_client.node` reads and every kind of dataset file `powerfed.training.data` loads."""
    from fl_client.node import NODE_KEYS
    from powerfed.training.data import SPECS
    from powerfed.training.data.load import _FILE_LOADERS

    page = (ROOT / "docs" / "reference" / "node-config.md").read_text(encoding="utf-8")
    first_cells = re.findall(r"^\|([^|]*)\|", page, re.M)
    named = {span.partition(":")[0] for cell in first_cells for span in re.findall(r"`([^`]+)`", cell)}
    missing = [k for k in NODE_KEYS if k not in named]
    missing += [f"{kind}:" for kind in _FILE_LOADERS if kind not in named]
    missing += [s for s in SPECS if ":" not in s and s not in named]
    assert not missing, f"docs/reference/node-config.md lacks {missing}"


SESSION = re.compile(r"((?:^    \$ powerctl [^\n]*\n(?:^    (?!\$)[^\n]*\n|^\n(?=    [^$\n]))*)+)", re.M)


def quoted_sessions() -> list[tuple[str, str]]:
    """(page, block) for every quoted `$ powerctl …` session outside docs/results/ (a result page's
    long outputs carry the commit they came from instead)."""
    out = []
    for page in markdown_files():
        if "results" in page.relative_to(ROOT).parts:
            continue
        for block in SESSION.findall(page.read_text(encoding="utf-8")):
            out.append((str(page.relative_to(ROOT)), block))
    return out


def session_steps(block: str) -> list[tuple[list[str], list[str]]]:
    """The session as (argv, the lines it printed) per `$` command; a trailing `\\` continues a command."""
    import shlex

    steps: list[tuple[list[str], list[str]]] = []
    command = ""
    for raw in block.splitlines():
        line = raw[4:] if raw.startswith("    ") else raw
        if command or line.startswith("$ "):
            command += " " + (line[2:] if line.startswith("$ ") else line.strip())
            if command.endswith("\\"):
                command = command[:-1]
                continue
            steps.append((shlex.split(command), []))
            command = ""
        elif line.strip():
            steps[-1][1].append(line.rstrip())
    return steps


@pytest.mark.parametrize(("page", "block"), quoted_sessions(), ids=[p for p, _ in quoted_sessions()])
def test_quoted_powerctl_sessions_print_what_the_page_says(page, block, tmp_path):
    """Each quoted `$ powerctl …` session is run again in an empty folder (with docs/ reachable, for
    docs/examples/) and must print what the page quotes: short outputs stay what the code prints now."""
    import subprocess
    import sys

    (tmp_path / "docs").symlink_to(ROOT / "docs")
    powerctl = str(Path(sys.executable).with_name("powerctl"))
    for argv, expected in session_steps(block):
        assert argv[0] == "powerctl", f"{page}: a quoted session runs powerctl only, not {argv[0]}"
        done = subprocess.run(
            [powerctl, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
        )
        printed = [x.rstrip() for x in (done.stdout + done.stderr).splitlines() if x.strip()]
        assert printed == expected, (
            f"{page}: `{' '.join(argv)}` prints something else now; paste its output:\n" + "\n".join(printed)
        )


# Guides that cannot drift: every Python block of the README and the how-to guides runs here, or is
# marked as an excerpt of an example app or patch that tests/test_examples.py runs; every repo path,
# module and README section the hand-written pages name exists.

EXCERPT = re.compile(r"<!-- excerpt: (?P<path>\S+?) -->")
FENCED = re.compile(
    r"^(?P<marker><!-- excerpt:[^\n]*-->\n)?```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^```", re.S | re.M
)
PYTHON_LINE = re.compile(
    r"^ {4,}(?:>>> |from [\w.]+ import |import [\w.]+\s*$|def \w+\(|class \w+[(:])", re.M
)
ELIDED = {"...", "…"}


def guide_pages() -> list[Path]:
    """The pages whose Python blocks must run or be excerpts: the README and the how-to guides."""
    return [ROOT / "README.md", *sorted((ROOT / "docs" / "howto").glob("*.md"))]


@dataclasses.dataclass(frozen=True)
class Block:
    """A fenced block of a page: its language, its text, the excerpt marker right above it (if any)."""

    page: str
    line: int
    lang: str
    body: str
    marker: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def fenced_blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    name = page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name
    return [
        Block(name, text.count("\n", 0, m.start("lang")) + 1, m["lang"], m["body"], m["marker"])
        for m in FENCED.finditer(text)
    ]


def _excerpt_lines(body: str, sign: str | None) -> list[str]:
    """The block's lines that must be in the file, stripped, elisions (`...`) left out; in a diff, the
    lines of one side: `sign` '-' the old file's (removed and context), '+' the new file's."""
    out = []
    for raw in body.splitlines():
        line = raw
        if sign is not None:
            if raw[:1] not in (sign, " ", ""):
                continue
            line = raw[1:]
        if line.strip() and line.strip() not in ELIDED:
            out.append(line.strip())
    return out


def _missing_in_order(lines: list[str], have: list[str]) -> str | None:
    """The first of `lines` not found in `have` (stripped lines) after the previous one, else None."""
    at = 0
    for line in lines:
        try:
            at = have.index(line, at) + 1
        except ValueError:
            return line
    return None


def _run_by_tests(path: str) -> bool:
    """An example app's file or an example patch, that tests/test_examples.py runs or applies."""
    parts = Path(path).parts
    examples = (ROOT / "tests" / "test_examples.py").read_text(encoding="utf-8")
    return len(parts) > 1 and parts[0] == "examples" and f'"{parts[1]}"' in examples


def excerpt_problems(block: Block) -> list[str]:
    """What is wrong with an excerpt block: its marker's files, and its lines not in them in order."""
    found = EXCERPT.fullmatch(block.marker.strip()) if block.marker else None
    if found is None:
        return [f"{block}: the marker must read <!-- excerpt: PATH -->"]
    path = found["path"]
    if (block.lang == "diff") != path.endswith(".patch"):
        return [f"{block}: a diff is an excerpt of an example's .patch, other blocks of an app's file"]
    if not (ROOT / path).is_file() or not _run_by_tests(path):
        return [f"{block}: {path} is not a file of an example app or patch tests/test_examples.py runs"]
    text = (ROOT / path).read_text(encoding="utf-8")
    problems = []
    for sign in ("-", "+") if block.lang == "diff" else (None,):  # a patch's old side, then its new one
        have = _excerpt_lines(text, sign) if sign else [x.strip() for x in text.splitlines()]
        if (line := _missing_in_order(_excerpt_lines(block.body, sign), have)) is not None:
            problems.append(f"{block}: not in {path} (in this order): {line}")
    return problems


def python_block_problems(page: Path) -> list[str]:
    """Blocks of a guide page that cannot be checked: Python in a block without a language, and diffs
    or Python not marked as excerpts (those marked are checked by excerpt_problems)."""
    problems = []
    text = FENCED.sub("", page.read_text(encoding="utf-8"))
    name = page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name
    if (m := PYTHON_LINE.search(text)) is not None:
        problems.append(f"{name}: Python in an indented block ({m[0].strip()}): fence it as ```python")
    for block in fenced_blocks(page):
        if block.lang in ("", "text") and PYTHON_LINE.search("    " + block.body.replace("\n", "\n    ")):
            problems.append(f"{block}: Python in a block without a language: fence it as ```python")
        elif block.lang == "diff" and not block.marker:
            problems.append(f"{block}: a diff must be an excerpt: <!-- excerpt: PATCH --> right above it")
        elif block.marker:
            problems += excerpt_problems(block)
    return problems


def runnable_blocks() -> list[Block]:
    return [b for p in guide_pages() for b in fenced_blocks(p) if b.lang in ("python", "py") and not b.marker]


@pytest.mark.parametrize("page", guide_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_guide_block_of_python_runs_or_is_an_excerpt_of_a_tested_example(page: Path) -> None:
    problems = python_block_problems(page)
    assert not problems, "\n".join(problems)


def run_block(block: Block, folder: Path) -> subprocess.CompletedProcess[str]:
    """The block as a script in an empty folder: the checkout importable, a private cache, one thread."""
    script = folder / "block.py"
    script.write_text(block.body, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "POWERFED_CACHE": str(folder / "cache")}
    env.update(OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    return subprocess.run(
        [sys.executable, str(script)], cwd=folder, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("block", runnable_blocks(), ids=str)
def test_each_guide_python_block_runs(block: Block, tmp_path: Path) -> None:
    done = run_block(block, tmp_path)
    assert done.returncode == 0, f"{block} fails as it stands:\n{(done.stdout + done.stderr)[-3000:]}"


def test_a_stale_excerpt_or_an_unmarked_block_is_named(tmp_path: Path) -> None:
    """The checks can fail: a diff whose added line the example no longer has, a diff without a marker,
    Python in an indented block, and a Python block that raises are each named."""
    app = "examples/quickstart-powerfed/pytorchexample/server_app.py"
    patch = "examples/pytorch-to-powerfed.patch"
    page = tmp_path / "page.md"
    good = f"<!-- excerpt: {patch} -->\n```diff\n+from powerfed import PowerAware\n```\n"
    page.write_text(good)
    assert python_block_problems(page) == [
        f"page.md:2: not in {patch} (in this order): from powerfed import PowerAware"
    ]
    real = next(x for x in _excerpt_lines((ROOT / app).read_text(), None) if x.startswith("from powerfed"))
    page.write_text(good.replace("+from powerfed import PowerAware", f"+{real}\n ...\n-{real}"))
    assert python_block_problems(page) == [f"page.md:2: not in {patch} (in this order): {real}"]
    page.write_text(good.replace("+from powerfed import PowerAware", f"+{real}"))
    assert python_block_problems(page) == []
    page.write_text(good.replace(patch, app).replace("+from powerfed import PowerAware", f"+{real}"))
    assert python_block_problems(page) == [
        "page.md:2: a diff is an excerpt of an example's .patch, other blocks of an app's file"
    ]
    page.write_text("```diff\n+x = 1\n```\n\n    import powerfed\n")
    assert python_block_problems(page) == [
        "page.md: Python in an indented block (import powerfed): fence it as ```python",
        "page.md:1: a diff must be an excerpt: <!-- excerpt: PATCH --> right above it",
    ]
    page.write_text("```python\n1/0\n```\n")
    (block,) = fenced_blocks(page)
    done = run_block(block, tmp_path)
    assert done.returncode != 0 and "ZeroDivisionError" in done.stderr


REPO_TOPS = sorted(
    p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in SKIP_DIRS
)
"""The checkout's top folders: a path in a page that starts with one of them is a path in the repo."""
REPO_PATH = re.compile(r"(?<![\w./$~-])((?:" + "|".join(map(re.escape, REPO_TOPS)) + r")/[\w./-]*\w)")
MODULE_NAME = re.compile(
    r"`((?:powerctl|powerfed|fl_client|fl_server|strategies|simulations)(?:\.\w+)+)(?:\(\))?`"
)
README_ANCHOR = re.compile(r"((?:[\w./]*/)?README\.md)#([\w-]+)")
FILE_SUFFIX = re.compile(r"\.(?:png|json|md|py|csv|yaml|toml|txt|pt|safetensors)$")


def _resolves(dotted: str) -> bool:
    """A module, or a name inside one, that imports now."""
    import importlib

    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            if not hasattr(obj, part):
                return False
            obj = getattr(obj, part)
        return True
    return False


def named_things_missing(page: Path) -> list[str]:
    """Repo paths (`fl_client/app.py`, in prose, spans or blocks), modules and names (`fl_server.results`)
    and README sections (README.md#a-heading, linked or not) that a page names and the tree lacks."""
    text = page.read_text(encoding="utf-8")
    missing = [p for p in REPO_PATH.findall(text) if not (ROOT / p).exists()]
    missing += [m for m in MODULE_NAME.findall(text) if not FILE_SUFFIX.search(m) and not _resolves(m)]
    for readme, anchor in README_ANCHOR.findall(text):
        dest = (page.parent / readme).resolve()
        if dest.is_file() and anchor not in anchors(dest):
            missing.append(f"{readme}#{anchor} (no such section)")
    return sorted(set(missing))


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_modules_and_readme_sections_a_page_names_exist(page: Path) -> None:
    missing = named_things_missing(page)
    assert not missing, f"{page.relative_to(ROOT)} names what the tree lacks: " + "; ".join(missing)


def test_a_path_module_or_section_that_is_gone_is_named(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "The work in `fl_client/work.py`, the round in fl_client/round.py, `fl_server.results.client_table`,"
        " `fl_server.results.no_such_name`, [x](README.md#no-such-heading), plots in `strategies.png`.\n"
    )
    (tmp_path / "README.md").write_text("# Title\n\n## A heading\n")
    assert named_things_missing(page) == [
        "README.md#no-such-heading (no such section)",
        "fl_client/work.py",
        "fl_server.results.no_such_name",
    ]


def test_every_bench_script_is_in_the_bench_readme() -> None:
    """A bench that can be run (`python bench/NAME.py`) is in bench/README.md's table and usage."""
    readme = (ROOT / "bench" / "README.md").read_text(encoding="utf-8")
    runnable = [p for p in sorted((ROOT / "bench").glob("*.py")) if '__name__ == "__main__"' in p.read_text()]
    missing = [p.name for p in runnable if f"`{p.name}`" not in readme or f"bench/{p.name}" not in readme]
    assert runnable and not missing, f"bench/README.md lacks {missing}"


PUBLIC_CALL = re.compile(r"\b([A-Z]\w*|[a-z_]\w*)(?:\.([a-z_]\w*))?\(([^()`]*)\)")


def stale_calls(page: Path) -> list[str]:
    """Calls of `powerfed`'s public names in a page (`estimate_relation(..., how=...)`,
    `TrainInstructions.for_relation(rel, num_classes=4)`) whose method or keywords the name no longer has."""
    import inspect

    import powerfed

    problems = []
    for m in PUBLIC_CALL.finditer(page.read_text(encoding="utf-8")):
        name, method, args = m.groups()
        if name not in powerfed.__all__:
            continue
        obj = getattr(powerfed, name)
        if method is not None:
            if not hasattr(obj, method):
                problems.append(f"{name}.{method}: no such method")
                continue
            obj = getattr(obj, method)
        try:
            params = inspect.signature(obj).parameters
        except (TypeError, ValueError):  # a signature inspect cannot read
            continue
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            continue
        unknown = [k for k in re.findall(r"\b(\w+)=(?!=)", args) if k not in params]
        if unknown:
            problems.append(f"{m[0][:60]}: {', '.join(unknown)} not an argument of {name}")
    return problems


@pytest.mark.parametrize(
    "page",
    [p for p in markdown_files() if "results" not in p.relative_to(ROOT).parts],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_public_calls_a_page_shows_take_the_keywords_it_gives(page: Path) -> None:
    problems = stale_calls(page)
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_a_call_with_a_keyword_that_is_gone_is_named(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        '`estimate_relation(Net, proxy=p, target_accuracy=0.8, batch_sizes=[8], cache_key="1", loss=f)`, '
        '`TrainInstructions.for_relations(rel)`, `RelationCompute(cache_key="1")`, `print(x=1)`\n'
    )
    assert stale_calls(page) == [
        "estimate_relation(Net, proxy=p, target_accuracy=0.8, batch_s: cache_key, loss not an argument of "
        "estimate_relation",
        "TrainInstructions.for_relations: no such method",
    ]
