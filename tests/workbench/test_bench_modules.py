"""The measurements that were scripts in ``benchmarks/`` are modules of :mod:`mdc_workbench.bench`: importing one runs
nothing (each runs as ``python -m mdc_workbench.bench.NAME``), and each refuses what it cannot measure in one line."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "mdc_workbench" / "bench"
INERT = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign)


def statements_run_on_import(source: str) -> list[int]:
    """Line numbers of top-level statements that do work when the module is imported: anything but imports,
    definitions, assignments, the docstring and the ``if __name__ == "__main__":`` block."""
    found = []
    for i, node in enumerate(ast.parse(source).body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        main_guard = isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'",)
        if not (isinstance(node, INERT) or docstring or main_guard):
            found.append(node.lineno)
    return found


def test_the_check_finds_a_script_body_and_passes_a_module():
    script = '"""doc"""\nimport sys\nroot = sys.argv[1]\nif root:\n    print(root)\nfor x in []:\n    pass\nrun()\n'
    assert statements_run_on_import(script) == [4, 6, 8]
    module = '"""doc"""\nimport sys\nTASKS = ["a"]\ndef main():\n    pass\nif __name__ == "__main__":\n    main()\n'
    assert statements_run_on_import(module) == []


@pytest.mark.parametrize("name", ["fast_recipe", "probe_protocols", "central_claim_device_check", "precision_curves"])
def test_a_bench_module_runs_nothing_when_imported_and_has_a_main(name: str):
    source = (BENCH / f"{name}.py").read_text()
    assert statements_run_on_import(source) == []
    assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(source).body)


def test_fast_recipe_runs_as_a_module():
    out = subprocess.run([sys.executable, "-m", "mdc_workbench.bench.fast_recipe", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("usage: python -m mdc_workbench.bench.fast_recipe")
    assert all(verb in out for verb in ("run", "eval", "profile", "probe", "plot"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a CUDA machine the check runs")
def test_the_central_claim_device_check_refuses_a_machine_without_cuda():
    from mdc_workbench.bench.central_claim_device_check import main

    with pytest.raises(SystemExit, match="needs a CUDA device"):
        main(4)
