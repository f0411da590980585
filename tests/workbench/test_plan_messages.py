"""A plan's mistakes are one line naming what is wrong: a notebook without a kernelspec, invalid YAML, a value of
the wrong type for an untyped parameter (``x = 1``)."""

from pathlib import Path

import nbformat
import pytest

from mdc_workbench.runs.plans import load_plan
from tests.workbench.test_runs import write_notebook, write_plan


def _error(plan: Path, root: Path) -> str:
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        load_plan(plan, root=root)
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_a_notebook_without_a_kernelspec_is_named(tmp_path):
    nb = write_notebook(tmp_path / "toy.ipynb")
    book = nbformat.read(str(nb), as_version=4)
    del book.metadata["kernelspec"]
    nbformat.write(book, str(nb))
    message = _error(write_plan(tmp_path / "p.yaml", "notebooks: [toy.ipynb]\n"), tmp_path)
    assert str(nb) in message and "kernelspec" in message, message


def test_invalid_yaml_is_one_line_with_its_place(tmp_path):
    write_notebook(tmp_path / "toy.ipynb")
    message = _error(write_plan(tmp_path / "p.yaml", "notebooks:\n  - toy.ipynb\n parameters: {value: [1\n"), tmp_path)
    assert message.startswith(f"plan {tmp_path / 'p.yaml'} is not valid YAML") and "line 3" in message, message


@pytest.mark.parametrize("value, ok", [('"abc"', False), ("2", True), ("true", False), ("1.5", False)])
def test_an_untyped_parameter_takes_the_type_of_its_default(tmp_path, value, ok):
    write_notebook(tmp_path / "toy.ipynb", params='output_dir = "."  # run folder\nx = 1  # untyped')
    plan = write_plan(tmp_path / "p.yaml", f"notebooks:\n  - path: toy.ipynb\n    parameters: {{x: {value}}}\n")
    if ok:
        assert load_plan(plan, root=tmp_path).runs[0].parameters["x"] == 2
    else:
        assert "parameter 'x' of toy.ipynb is int" in _error(plan, tmp_path)
