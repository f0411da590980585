"""The numbered notebooks as static pages a student can read without running anything: each notebook executed with
its own defaults (papermill, kernel ``mdc``), timed, and converted to HTML (nbconvert) in ``docs/notebooks_html/``.

    python docs/notebooks_html.py                     # execute all (00-06) with their defaults, then convert
    python docs/notebooks_html.py --only 02 05        # some of them
    python docs/notebooks_html.py --convert-only      # convert what is executed already (papermill_runs/notebooks/)

    python docs/notebooks_html.py --offline-pages     # make the pages in docs/notebooks_html/ work offline in place,
                                                      # their solutions folded

``make notebooks-html`` runs the first. The pages need no network: their equations are MathML, rendered from the
LaTeX when the page is written (``latex2mathml``; browsers draw MathML themselves), and no script is loaded from a
CDN (nbconvert's pages load MathJax and require.js from one, which a class machine without network cannot reach).
Executed copies go to ``papermill_runs/notebooks/<name>.ipynb`` (ignored by git) with ``timings.json`` (wall
seconds of each execution, the kernel's start included, and the load average before and after: a load above the
core count means the machine was shared). The defaults share ``make demo``'s
data and model cache, so a notebook run after ``make demo`` (or after the notebooks before it) reuses their models
and takes less time than on a fresh clone; the notebooks say "reusing ..." when they do. The pages carry their
figures as PNG and no widget state (the trajectory explorer of 05 needs a kernel; its figures are shown). The
code of each exercise's hidden solution (cells tagged ``solution``) is folded into a ``<details>`` block, as
JupyterLab hides it: a student reads the question and the check first, and clicks to see the code.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"


def notebooks(only: list[str]) -> list[Path]:
    paths = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    chosen = [p for p in paths if not only or any(p.name.startswith(o) for o in only)]
    if not chosen:
        sys.exit(f"no notebook matches {only}; there are {', '.join(p.stem for p in paths)}")
    return chosen


def execute(path: Path, executed_dir: Path) -> dict:
    """Run one notebook with its defaults; returns its timing record."""
    import papermill

    from mdc_workbench.runs.plans import ensure_kernel

    target = executed_dir / path.name
    before = os.getloadavg()
    start = time.perf_counter()
    papermill.execute_notebook(str(path), str(target), kernel_name=ensure_kernel(), cwd=str(ROOT),
                               progress_bar=True, execution_timeout=1800)
    seconds = time.perf_counter() - start
    record = {"seconds": round(seconds, 1), "load_before": [round(x, 2) for x in before],
              "load_after": [round(x, 2) for x in os.getloadavg()], "cores": os.cpu_count(),
              "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    print(f"{path.stem}: {seconds / 60:.1f} min (load {before[0]:.1f} -> {record['load_after'][0]:.1f})")
    return record


CDN_SCRIPTS = re.compile(r"<!-- Load mathjax -->\s*|<!-- MathJax configuration -->\s*"
                         r"|<script[^>]*\bsrc=\"https?://[^\"]*\"[^>]*>\s*</script>\s*"
                         r"|<script type=\"text/x-mathjax-config\">.*?</script>\s*", re.S)
MARKDOWN = re.compile(r'(<div class="[^"]*jp-RenderedMarkdown[^"]*"[^>]*>)(.*?)(</div>)', re.S)
# in a rendered markdown cell: code and tags (left alone: a heading's anchor holds its text), $$display$$ or
# $inline$ LaTeX in the text (HTML-escaped by nbconvert)
MATH = re.compile(r"(<code>.*?</code>|<pre>.*?</pre>|<[^>]*>)|\$\$([^<]+?)\$\$|\$(?!\s)([^$<\n]+?)(?<![\s\\])\$",
                  re.S)


def mathml(tex: str, display: str) -> str:
    """One LaTeX formula as MathML; ValueError naming the formula when latex2mathml cannot read it."""
    from latex2mathml.converter import convert as to_mathml

    tex = re.sub(r"\\arg(?![a-zA-Z])", r"\\mathrm{arg}\\,", tex.strip())  # latex2mathml has no \arg
    try:
        return to_mathml(tex, display=display)
    except Exception as err:  # noqa: BLE001 - latex2mathml raises many kinds; name the formula instead
        raise ValueError(f"cannot render the formula {tex!r} as MathML: {err}") from err


# An absolute path under a usual root of home or work folders, not inside a URL, a base64 figure or a relative path.
MACHINE_PATH = re.compile(r"(?<![\w+/=.:~-])/(?:home|root|work|tmp|Users|mnt|srv|opt|var)/[\w.-]+(?:/[\w.-]+)*")


def machine_paths(page: str) -> list[str]:
    """The absolute paths a page shows: folders of the machine that executed it, which mean nothing to a reader
    (notebooks print their run folders relative to the checkout, ``wb.checkout_relative``)."""
    return sorted(set(MACHINE_PATH.findall(page)))


def offline(page: str) -> str:
    """An nbconvert page that works without network: the LaTeX of its markdown cells as MathML, the CDN scripts
    (MathJax, require.js) and MathJax's configuration removed."""
    def formula(m: re.Match) -> str:
        if m.group(1):
            return m.group(1)
        display, tex = ("block", m.group(2)) if m.group(2) is not None else ("inline", m.group(3))
        return mathml(html.unescape(tex), display)

    page = MARKDOWN.sub(lambda m: m.group(1) + MATH.sub(formula, m.group(2)) + m.group(3), page)
    return CDN_SCRIPTS.sub("", page)


SOLUTION_CELL = re.compile(r'<div class="jp-Cell [^"]*\bcelltag_solution\b[^"]*"[^>]*>\s*')
SOLUTION_SUMMARY = '<details class="mdc-solution"><summary>Solution (click to show the code)</summary>\n'


def _div_end(page: str, start: int) -> int:
    """The index just after the ``</div>`` closing the ``<div`` at `start` (code on a page is escaped, so every
    ``<div`` and ``</div>`` in it is a tag)."""
    depth, i = 0, start
    for m in re.compile(r"<div\b|</div>").finditer(page, start):
        depth += 1 if m.group() == "<div" else -1
        if depth == 0:
            return m.end()
        i = m.end()
    raise ValueError(f"unclosed <div> at character {start} (after {i})")


def hide_solutions(page: str) -> str:
    """The code of every cell tagged ``solution`` folded into a ``<details>`` block, as JupyterLab shows it hidden
    (``source_hidden``): a reader clicks to see it; the cell's output (the check's verdict) stays shown. A page
    already folded is left as it is."""
    parts, pos = [], 0
    for m in SOLUTION_CELL.finditer(page):
        if page.startswith(SOLUTION_SUMMARY, m.end()):
            continue
        if not page.startswith('<div class="jp-Cell-inputWrapper"', m.end()):
            raise ValueError(f"a solution cell at character {m.start()} has no input area where nbconvert puts it")
        end = _div_end(page, m.end())
        parts += [page[pos:m.end()], SOLUTION_SUMMARY, page[m.end():end], "\n</details>"]
        pos = end
    return "".join(parts) + page[pos:]


def shown_solutions(page: str) -> list[str]:
    """The ids of the solution cells whose code a page shows outside a ``<details>`` block."""
    return [m.group() for m in SOLUTION_CELL.finditer(page) if not page.startswith(SOLUTION_SUMMARY, m.end())]


def convert(executed: Path, out_dir: Path) -> Path:
    """One executed notebook as an HTML page, without widget state (it would only add size: no kernel serves it)."""
    import nbformat
    from nbconvert import HTMLExporter

    nb = nbformat.read(str(executed), as_version=4)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            out.get("data", {}).pop("application/vnd.jupyter.widget-view+json", None)
    exporter = HTMLExporter(template_name="lab")
    exporter.exclude_input_prompt = False
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": executed.stem}})
    page = out_dir / f"{executed.stem}.html"
    page.write_text(hide_solutions(offline(body)), encoding="utf-8")
    if paths := machine_paths(body):
        print(f"warning: {page.name} shows absolute paths of this machine: {', '.join(paths[:3])}", file=sys.stderr)
    return page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="notebook number prefixes, e.g. 02 05")
    parser.add_argument("--convert-only", action="store_true", help="convert the executed copies; run nothing")
    parser.add_argument("--executed", default=str(ROOT / "papermill_runs" / "notebooks"),
                        help="folder of the executed copies (and timings.json)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "notebooks_html"), help="folder of the HTML pages")
    parser.add_argument("--offline-pages", action="store_true",
                        help="rewrite the pages already in --out to work offline (MathML, no CDN scripts) with their "
                             "solutions folded (<details>); run nothing")
    args = parser.parse_args(argv)
    executed_dir, out_dir = Path(args.executed), Path(args.out)
    if args.offline_pages:
        for page in sorted(out_dir.glob("*.html")):
            page.write_text(hide_solutions(offline(page.read_text(encoding="utf-8"))), encoding="utf-8")
            print(f"{page.name}: offline, solutions folded")
        return 0
    executed_dir.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    timings_path = executed_dir / "timings.json"
    timings = json.loads(timings_path.read_text()) if timings_path.is_file() else {}
    for path in notebooks(args.only):
        if not args.convert_only:
            timings[path.stem] = execute(path, executed_dir)
            timings_path.write_text(json.dumps(timings, indent=1) + "\n")
        executed = executed_dir / path.name
        if not executed.is_file():
            sys.exit(f"{executed} is missing: run without --convert-only first")
        page = convert(executed, out_dir)
        print(f"{page.relative_to(ROOT) if page.is_relative_to(ROOT) else page}: {page.stat().st_size / 1e6:.1f} MB")
    total = sum(p.stat().st_size for p in out_dir.glob("*.html"))
    print(f"{out_dir}: {total / 1e6:.1f} MB of HTML")
    return 0


if __name__ == "__main__":
    sys.exit(main())
