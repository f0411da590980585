"""The README and docs/ stay true: short README, links that resolve, design references that exist, and every
``mdc`` command line they show parses (verb, sub-verb and each ``--flag``) with the real parser."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
CODE_DIRS = ("mdc_core", "mdc_workbench", "app", "tests", "notebooks", "plans")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![alt](target)
DESIGN_REF = re.compile(r'docs/design\.md "([^"]+)"')  # how code cites a section: docs/design.md "Decisions"


def _code_files() -> list[Path]:
    files = [ROOT / "Makefile"]
    for folder in CODE_DIRS:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".ipynb", ".yaml") and p.is_file()]
    return files


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {opt for action in parser._actions for opt in action.option_strings}


def _commands(text: str) -> list[str]:
    """Every ``mdc ...`` command of a page: inline code spans and code-block lines, continuation lines joined."""
    commands, in_block, lines = [], False, text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("```"):
            in_block = not in_block
            continue
        if in_block:
            stripped = re.sub(r"^.*?-m mdc_workbench ", "mdc ", line.split("  #")[0].split(" # ")[0])  # torchrun
            if re.match(r"\s*mdc ", stripped):
                j = i + 1
                while j < len(lines) and lines[j].startswith(" ") and not lines[j].lstrip().startswith(("#", "mdc ")):
                    stripped += " " + lines[j].split(" # ")[0].strip()
                    j += 1
                commands.append(stripped.strip())
        else:
            commands += [m.group(1) for m in re.finditer(r"`(mdc [^`]*)`", line)]
    return commands


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    missing = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # web addresses and anchors within the page
        path = (page.parent / target.split("#")[0]).resolve()
        if not path.exists():
            missing.append(target)
    assert not missing, f"{page.name}: links to missing files {missing}"


def test_docs_cite_no_file_outside_the_repository() -> None:
    for page in PAGES:
        assert "../shared" not in page.read_text(), f"{page.name} cites a file outside the repository"


def test_design_references_resolve_to_docs_design() -> None:
    headings = {m.group(1).strip() for m in re.finditer(r"^## (.+)$", (ROOT / "docs" / "design.md").read_text(), re.M)}
    stale, unknown, cited = [], [], 0
    for path in _code_files():
        if path == Path(__file__).resolve():
            continue  # this file names the patterns it looks for
        text = path.read_text(errors="replace")
        rel = path.relative_to(ROOT)
        if "DESIGN" in text or "../shared" in text:
            stale.append(str(rel))
        for section in DESIGN_REF.findall(text):
            cited += 1
            if section not in headings:
                unknown.append(f"{rel}: {section!r}")
    assert not stale, f"references to a design document that is not docs/design.md: {stale}"
    assert not unknown, f"sections missing from docs/design.md (it has {sorted(headings)}): {unknown}"
    assert cited >= 5  # the tokenizer, objectives, scoring, scene generator and objective tests cite it


def test_commands_in_the_docs_parse() -> None:
    """Each ``mdc VERB [SUB] --flag`` on a page names a real verb, sub-verb and flag of ``mdc``'s parser."""
    from mdc_workbench.cli import build_parser

    verbs = _subparsers(build_parser())
    problems, checked = [], 0
    for page in PAGES:
        for command in _commands(page.read_text()):
            words = command.split()
            verb = words[1] if len(words) > 1 else ""
            if verb not in verbs:
                problems.append(f"{page.name}: unknown verb in {command!r}")
                continue
            parsers = [verbs[verb]]
            subs = _subparsers(verbs[verb])
            if subs and len(words) > 2 and re.fullmatch(r"[a-z][a-z-]*(\|[a-z][a-z-]*)*", words[2]):
                names = words[2].split("|")
                problems += [f"{page.name}: unknown sub-verb {n!r} of mdc {verb}" for n in names if n not in subs]
                parsers = [subs[n] for n in names if n in subs]
            flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", command))
            for parser in parsers:
                known = _options(parser) | _options(verbs[verb])
                problems += [f"{page.name}: {flag} is not a flag of {parser.prog!r} in {command!r}"
                             for flag in sorted(flags - known)]
            checked += 1
    assert not problems, "\n".join(problems)
    assert checked >= 40


def test_code_the_docs_name_exists() -> None:
    """Paths (`mdc_workbench/eval/probe.py`, `plans/cpu_demo.yaml`) and dotted names (`mdc_core.scoring.METHODS`,
    `mdc_workbench/masked_conditional/diffusion.py: d3pm_loss`) in the README and docs/ exist in this tree."""
    import importlib

    missing, names = [], set()
    for page in [*PAGES, ROOT / "benchmarks" / "README.md"]:
        text = page.read_text()
        for path in re.findall(r"`((?:mdc_core|mdc_workbench|app|notebooks|plans|tests|benchmarks|docs)/[^`\s:]*)",
                               text):
            if not re.search(r"[*<{]|\.\.\.", path) and not (ROOT / path.rstrip("/")).exists():
                missing.append(f"{page.name}: {path}")
        names |= set(re.findall(r"`((?:mdc_core|mdc_workbench|mdc_app)(?:\.\w+)+)", text))
        cited = re.findall(r"`((?:mdc_core|mdc_workbench)/[\w/]+\.py): (\w+)`", text)  # `mdc_core/x.py: name`
        names |= {f"{f[:-3].replace('/', '.')}.{attr}" for f, attr in cited}
    for name in sorted(names):
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:k]))
                break
            except ModuleNotFoundError:
                continue
        for attr in parts[k:]:
            obj = getattr(obj, attr, None)
        if obj is None:
            missing.append(name)
    assert not missing, f"the docs name code that does not exist: {missing}"
    assert len(names) >= 10


def test_cli_reference_covers_every_verb() -> None:
    from mdc_workbench.cli import build_parser

    text = (ROOT / "docs" / "cli.md").read_text()
    verbs = _subparsers(build_parser())
    missing = [v for v in verbs if f"## `mdc {v}`" not in text]
    assert not missing, f"docs/cli.md has no section for {missing}"


def test_reliability_names_tests_that_exist() -> None:
    """docs/reliability.md states each promise with the test that holds it: every such test must exist."""
    named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", (ROOT / "docs" / "reliability.md").read_text())
    assert len(named) >= 20
    for file, name in named:
        found = list((ROOT / "tests").rglob(file))
        assert len(found) == 1 and f"def {name}(" in found[0].read_text(), f"reliability.md names {file}::{name}"



LESSON_TIME = re.compile(r"\*\*(\d+(?:\.\d+)?) (s|min)\*\*")


def lesson_time(text: str, anchor: str) -> str | None:
    """The first bold time (``**99 s**``) within 300 characters after `anchor` in `text`, or None."""
    at = text.find(anchor)
    found = LESSON_TIME.search(text[at:at + 300]) if at >= 0 else None
    return f"{found.group(1)} {found.group(2)}" if found else None


def test_the_lesson_time_is_one_measured_figure_wherever_it_is_quoted():
    """Notebook 00's opening, README's start and docs/notebooks.md's timing table quote the same time."""
    import json

    nb = json.loads((ROOT / "notebooks" / "00_masked_diffusion_captioning.ipynb").read_text())
    table_row = next(line for line in (ROOT / "docs" / "notebooks.md").read_text().splitlines()
                     if line.startswith("| `00_masked_diffusion_captioning` | **"))
    quoted = {"notebook 00": lesson_time("".join(nb["cells"][0]["source"]), "By default nothing is trained"),
              "README.md": lesson_time((ROOT / "README.md").read_text(), "00_masked_diffusion_captioning.ipynb`"),
              "docs/notebooks.md": lesson_time(table_row, "00_masked")}
    assert None not in quoted.values() and len(set(quoted.values())) == 1, quoted
    # and it tells another figure apart
    assert lesson_time("`00_masked_diffusion_captioning`: **2 min** on a laptop", "00_masked") == "2 min"
    assert lesson_time("nothing timed here", "00_masked") is None


PAGE_IMPORT = re.compile(r"^\s*from ((?:mdc_core|mdc_workbench|mdc_app)[\w.]*) import \(?([\w, \n]+?)\)?\s*$", re.M)


def missing_page_imports(page_html: str) -> list[str]:
    """The ``from mdc_* import NAME`` lines of an executed notebook's page (docs/notebooks_html/) whose module or
    name no longer exists: a page that kept code a reader would copy after the code moved."""
    import html
    import importlib

    text = html.unescape(re.sub(r"<[^>]+>", "", page_html))
    missing = []
    for module_name, names in PAGE_IMPORT.findall(text):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            missing.append(module_name)
            continue
        for name in (n.strip().split(" as ")[0] for n in names.replace("\n", " ").split(",") if n.strip()):
            if not hasattr(module, name) and not (hasattr(module, "__path__") and
                                                  importlib.util.find_spec(f"{module_name}.{name}")):
                missing.append(f"{module_name}.{name}")
    return missing


def test_the_executed_notebook_pages_import_only_names_that_exist():
    pages = sorted((ROOT / "docs" / "notebooks_html").glob("[0-9][0-9]_*.html"))
    assert len(pages) == len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))
    stale = {p.name: m for p in pages if (m := missing_page_imports(p.read_text()))}
    assert stale == {}, f"re-execute these pages (python docs/notebooks_html.py --only NN): {stale}"
    # and a page with a name that moved away is caught (nbconvert wraps each token in a span)
    moved = ('<span class="kn">from</span> <span class="nn">mdc_core.sampler</span> <span class="kn">import</span> '
             '<span class="n">sample</span><span class="p">,</span> <span class="n">trajectory</span>\n')
    assert missing_page_imports(moved) == ["mdc_core.sampler.trajectory"]
    assert missing_page_imports(moved.replace("mdc_core.sampler", "mdc_core.nowhere")) == ["mdc_core.nowhere"]
