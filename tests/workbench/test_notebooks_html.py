"""docs/notebooks_html.py (`make notebooks-html`): an executed notebook becomes a static page with its figures and
outputs, without the widget state (no kernel serves it; it would only add size)."""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path

import nbformat
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "docs" / "notebooks_html.py"
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8ffff3f0005fe02fea7d6a4280000000049454e44ae426082")).decode()


def _script():
    spec = importlib.util.spec_from_file_location("notebooks_html", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_executed_notebook_becomes_a_page_with_its_figures_and_no_widget_state(tmp_path: Path) -> None:
    pytest.importorskip("nbconvert")
    nb = nbformat.v4.new_notebook()
    figure = nbformat.v4.new_code_cell("fig", execution_count=1, outputs=[nbformat.v4.new_output(
        "display_data", data={"image/png": PNG, "text/plain": "<Figure>"})])
    widget = nbformat.v4.new_code_cell("widgets.interact(show)", execution_count=2, outputs=[nbformat.v4.new_output(
        "display_data", data={"application/vnd.jupyter.widget-view+json": {"model_id": "abc", "version_major": 2,
                                                                           "version_minor": 0},
                              "text/plain": "interactive(children=...)"})])
    nb.cells = [nbformat.v4.new_markdown_cell("# A lesson"), figure, widget]
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"abc": {"x": "y" * 5000}}}}
    executed = tmp_path / "07_example.ipynb"
    nbformat.write(nb, str(executed))
    page = _script().convert(executed, tmp_path)
    html = page.read_text()
    assert page.name == "07_example.html" and "A lesson" in html
    assert f"data:image/png;base64,{PNG}" in html  # the figure is in the page
    assert "widget-state+json" not in html and "y" * 5000 not in html


def test_the_notebooks_are_found_by_prefix() -> None:
    module = _script()
    assert [p.stem[:2] for p in module.notebooks([])] == ["00", "01", "02", "03", "04", "05", "06"]
    assert [p.stem for p in module.notebooks(["05"])] == ["05_captioning"]
    with pytest.raises(SystemExit, match="no notebook matches"):
        module.notebooks(["99"])


def test_a_page_renders_its_equations_without_network(tmp_path: Path) -> None:
    """The page's LaTeX becomes MathML when it is written and no script comes from a CDN: a class machine without
    network shows equations, not raw LaTeX. Code (in markdown and in code cells) keeps its dollars."""
    pytest.importorskip("nbconvert")
    pytest.importorskip("latex2mathml")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("## Masking ($\\alpha_t = 1 - t$)\n\nThe weight $1/t$ with `$HOME` "
                                              "left alone:\n\n$$\\mathcal L = \\frac{1}{t}\\sum_i x_i < 2$$"),
                nbformat.v4.new_code_cell('print("$C_t$")', execution_count=1)]
    executed = tmp_path / "08_math.ipynb"
    nbformat.write(nb, str(executed))
    page = _script().convert(executed, tmp_path).read_text()
    assert page.count('<math xmlns="http://www.w3.org/1998/Math/MathML" display="inline">') == 2
    assert page.count('display="block"') == 1 and "<mfrac>" in page and "<mo>&#x0003C;</mo>" in page  # "<" read
    assert "$HOME" in page and "$C_t$" in page and "$$" not in page.split("jp-RenderedMarkdown", 1)[1]
    assert 'src="http' not in page and "x-mathjax-config" not in page and "require.min.js" not in page


def test_an_unreadable_formula_is_named() -> None:
    pytest.importorskip("latex2mathml")
    with pytest.raises(ValueError, match=r"cannot render the formula '\\\\left\( x'"):
        _script().mathml("\\left( x", "inline")


def test_the_committed_pages_work_offline_and_show_no_folder_of_the_machine_that_ran_them() -> None:
    module = _script()
    pages = sorted((SCRIPT.parent / "notebooks_html").glob("*.html"))
    assert pages
    for page in pages:
        html = page.read_text(encoding="utf-8")
        assert 'src="http' not in html and "x-mathjax-config" not in html, page.name
        assert "<math" in html or "$" not in html, page.name
        assert module.machine_paths(html) == [], page.name


def test_a_page_that_shows_the_executing_machines_folders_is_caught() -> None:
    module = _script()
    shown = ("<pre>run folder: /work/demo/papermill_runs/cpu_demo/_models/mdc-34266d8522; loss 3.9</pre>"
             "<pre>CLIP  -&gt; /home/ada/mdc/papermill_runs/x</pre>")
    assert module.machine_paths(shown) == ["/home/ada/mdc/papermill_runs/x",
                                           "/work/demo/papermill_runs/cpu_demo/_models/mdc-34266d8522"]
    fine = ('<pre>run folder: papermill_runs/cpu_demo/_models/mdc-34266d8522</pre><a href="https://x.org/home/a">'
            '<img src="data:image/png;base64,AAAA+/home/BB=/tmp/CC"> $HOME/work/x ~/work/y '
            '<math xmlns="http://www.w3.org/1998/Math/MathML">')
    assert module.machine_paths(fine) == []


SOLUTION_LINE = '<span class="c1"># Solution'  # the first line of every hidden solution, as nbconvert highlights it


def _outside_details(page: str) -> int:
    """How many solution first lines a page shows outside a <details> block."""
    import re

    outside, depth = 0, 0
    for m in re.finditer(r"<details\b|</details>|" + re.escape(SOLUTION_LINE), page):
        if m.group() == "<details":
            depth += 1
        elif m.group() == "</details>":
            depth -= 1
        elif depth == 0:
            outside += 1
    return outside


def test_a_page_folds_the_hidden_solutions_into_details(tmp_path: Path) -> None:
    """As JupyterLab hides a solution cell's code (source_hidden), the page folds it into <details>: the question,
    the attempt and the check stay in view, the solution's output (the check's verdict) too."""
    pytest.importorskip("nbconvert")
    nb = nbformat.v4.new_notebook()
    solution = nbformat.v4.new_code_cell("# Solution: click to show\nanswer = 42", execution_count=2, outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="the hidden solution passes this check\n")])
    solution.metadata["tags"] = ["solution"]
    solution.metadata["jupyter"] = {"source_hidden": True}
    nb.cells = [nbformat.v4.new_markdown_cell("### Exercise"), nbformat.v4.new_code_cell("attempt = None"),
                solution]
    executed = tmp_path / "07_example.ipynb"
    nbformat.write(nb, str(executed))
    module = _script()
    page = module.convert(executed, tmp_path).read_text()
    assert module.shown_solutions(page) == [] and _outside_details(page) == 0
    folded = page[page.index("<details"):page.index("</details>")]
    assert "answer" in folded and "attempt" not in folded and "passes this check" not in folded
    assert "passes this check" in page and "attempt" in page
    unfolded = page.replace(module.SOLUTION_SUMMARY, "").replace("\n</details>", "")
    assert _outside_details(unfolded) == 1 and len(module.shown_solutions(unfolded)) == 1  # the test can fail
    assert module.hide_solutions(page) == page  # folding twice changes nothing


def test_no_committed_page_shows_a_solution_outside_details() -> None:
    pages = sorted((SCRIPT.parent / "notebooks_html").glob("*.html"))
    assert len(pages) == 7
    module = _script()
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert text.count(SOLUTION_LINE) >= 2, page.name  # the pages hold their exercises' solutions
        assert _outside_details(text) == 0 and module.shown_solutions(text) == [], page.name
