"""The package's shape: no import cycles, and a thin core that imports no extension.

The core is every module at the top level of ``mdc_core`` (except ``__main__``) plus ``mdc_core.data``; the
extensions are the other subpackages (``eval``, ``bench``, ``masked_conditional``, ``workbench``, ``cli``) and the
top-level ``app``. The import graph is read with ``ast`` from every ``import`` statement, also those inside
functions (a cycle dodged by a lazy import is still a cycle).
"""

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("mdc_core", "app")
EXTENSIONS = ("mdc_core.eval", "mdc_core.bench", "mdc_core.masked_conditional", "mdc_core.workbench", "mdc_core.cli",
              "app")
HEAVY_OPTIONAL = ("papermill", "gradio", "nbformat", "jupyter_client", "ipykernel", "matplotlib.pyplot",
                  "sklearn", "transformers", "open_clip",  # open_clip's package init pulls in the other two
                  "tensorboard")  # train.tensorboard=true imports it when a run asks (mdc_core.tensorboard_log)


def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of mdc_core and app."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (``from pkg import sub`` counts as importing ``pkg.sub``)."""
    modules = module_files()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in node.names]
            for target in targets:
                while target and target not in modules:  # `import a.b.c` of a non-module attribute: its module
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def core_modules() -> list[str]:
    return sorted(name for name in module_files()
                  if name.startswith("mdc_core") and name != "mdc_core.__main__"
                  and not any(name == ext or name.startswith(ext + ".") for ext in EXTENSIONS))


def is_extension(name: str) -> bool:
    return any(name == ext or name.startswith(ext + ".") for ext in EXTENSIONS)


def test_cycle_finder_finds_a_cycle_and_a_self_contained_graph_has_none():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_import_graph_reads_relative_lazy_and_submodule_imports():
    graph = import_graph()
    assert "mdc_core.model" in graph["mdc_core.objectives"]  # relative: from .model import ...
    assert "mdc_core.masked_conditional.d3pm" in graph["mdc_core.masked_conditional.diffusion"]  # from pkg import mod
    assert "mdc_core.train" in graph["mdc_core.cli.train"]  # inside a function


def test_no_import_cycles_in_the_package_or_the_app():
    assert find_cycles(import_graph()) == []


def test_core_modules_never_import_an_extension_even_lazily():
    graph = import_graph()
    core = core_modules()
    assert {"mdc_core.config", "mdc_core.encoders", "mdc_core.model", "mdc_core.objectives", "mdc_core.sampler",
            "mdc_core.scoring", "mdc_core.train", "mdc_core.checkpoint", "mdc_core.distributed",
            "mdc_core.data.loaders"} <= set(core)
    upward = {name: sorted(t for t in graph[name] if is_extension(t)) for name in core}
    assert {k: v for k, v in upward.items() if v} == {}


def test_importing_the_core_loads_no_extension_nor_the_notebook_and_app_stacks():
    """One fresh interpreter imports every core module and lists what got imported."""
    code = ("import json, sys\n"
            f"for name in {core_modules()!r}:\n"
            "    __import__(name)\n"
            "from mdc_core.tokenizer import CaptionTokenizer\n"  # tokenizing reads open_clip's BPE file only
            "assert CaptionTokenizer(8)(['a red circle']).shape == (1, 8)\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "mdc_core.train" in loaded and "torch" in loaded
    assert [m for m in loaded if is_extension(m)] == []
    assert [m for m in loaded if m.split(".")[0] in HEAVY_OPTIONAL or m in HEAVY_OPTIONAL] == []
