"""docs/notebooks_html.py (`make notebooks-html`): an executed notebook becomes a static page with its figures and
outputs, without the widget state (no kernel serves it; it would only add size)."""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path

import nbformat
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "docs" / "notebooks_html.py"
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
