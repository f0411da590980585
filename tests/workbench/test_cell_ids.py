"""Notebooks carry nbformat 4.5 cell ids, so JupyterLab does not mark them changed when it opens them (it upgrades a
4.4 notebook and invents ids, and a save then rewrites the tracked file); the normalizer adds them once, stably."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from mdc_workbench.notebooks.cell_ids import VALID_ID, kernel_language_info, main, normalize, normalized_text

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
OLD_STYLE = pytest.mark.filterwarnings("ignore:Cell is missing an id field",  # nbformat warns about what is tested
                                       "ignore:Non-unique cell id")


def _old_style(tmp_path: Path) -> Path:
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# title"]},
                    {"cell_type": "code", "execution_count": None, "metadata": {"tags": ["parameters"]},
                     "outputs": [], "source": ["x: int = 1  # a parameter"]},
                    {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": ["x"]}],
          "metadata": {"kernelspec": {"display_name": "MDC workbench", "language": "python", "name": "mdc"}},
          "nbformat": 4, "nbformat_minor": 4}
    path = tmp_path / "old.ipynb"
    path.write_text(json.dumps(nb, indent=1) + "\n")
    return path


@OLD_STYLE
def test_normalize_adds_stable_ids_once_and_keeps_everything_else(tmp_path: Path) -> None:
    path = _old_style(tmp_path)
    before = nbformat.read(str(path), as_version=4)
    assert normalize(path) is True and normalize(path) is False  # a second run changes nothing
    after = nbformat.read(str(path), as_version=4)
    assert after.nbformat_minor == 5 and [c.source for c in after.cells] == [c.source for c in before.cells]
    ids = [c.id for c in after.cells]
    assert len(set(ids)) == 3 and all(VALID_ID.match(i) for i in ids)
    assert after.cells[1].metadata == {"tags": ["parameters"]}
    assert after.metadata.language_info == kernel_language_info()  # what the kernel writes when it starts
    data = json.loads(path.read_text())
    data["cells"][2]["id"] = data["cells"][0]["id"]  # a duplicated id (a copied cell) is replaced, the first kept
    path.write_text(json.dumps(data))
    assert normalize(path) is True
    fixed = [c["id"] for c in json.loads(path.read_text())["cells"]]
    assert fixed[0] == ids[0] and len(set(fixed)) == 3


@OLD_STYLE
def test_the_command_line_checks_and_rewrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _old_style(tmp_path)
    assert main(["--check", str(path)]) == 1 and "would change" in capsys.readouterr().out
    assert main([str(path)]) == 0 and main(["--check", str(path)]) == 0


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_notebook_has_cell_ids_and_is_what_a_save_would_write(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    assert (nb.nbformat, nb.nbformat_minor) == (4, 5) and all("id" in c for c in nb.cells)
    assert set(nb.metadata.language_info) >= set(kernel_language_info())  # nothing for the kernel to fill in
    assert normalized_text(text) == text, f"run: python -m mdc_workbench.notebooks.cell_ids {path.name}"
