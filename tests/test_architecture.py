"""The house's shape: two packages and the app, no import cycles, and a thin core that imports neither.

The core is the package ``mdc_core`` (the method and its training loop); the workbench is the sibling package
``mdc_workbench`` (``eval``, ``bench``, ``masked_conditional``, ``notebooks``, ``cli``), and the app is the ``app/``
folder, installed as the package ``mdc_app``. The import graph is read with ``ast`` from
every ``import`` statement, also those inside functions (a cycle dodged by a lazy import is still a cycle).

Not importing an extension is not enough: the core's text (code, strings, docstrings, comments) must not name one
either, neither by module path nor by anything a plug-in registers (objective and encoder names, config keys), so a
config field or a ``"module:function"`` string pointing into an extension fails here too. The package's front page
(``mdc_core/__init__.py``) is exempt: it is the map of the whole house.
"""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"mdc_core": "mdc_core", "mdc_workbench": "mdc_workbench", "mdc_app": "app"}  # name -> folder (setup.py)
EXTENSIONS = ("mdc_workbench.eval", "mdc_workbench.bench", "mdc_workbench.masked_conditional",
              "mdc_workbench.notebooks", "mdc_workbench.cli", "mdc_workbench.seed_stack", "mdc_workbench", "mdc_app")
HEAVY_OPTIONAL = ("papermill", "gradio", "nbformat", "jupyter_client", "ipykernel", "matplotlib.pyplot",
                  "sklearn", "transformers", "open_clip",  # open_clip's package init pulls in the other two
                  "tensorboard")  # train.tensorboard=true imports it when a run asks (mdc_core.tensorboard_log)


def module_files() -> dict[str, Path]:
    """Dotted module name (as installed) -> file, for every module of mdc_core, mdc_workbench and the app."""
    modules = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [package, *path.relative_to(ROOT / folder).with_suffix("").parts]
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
    return sorted(name for name in module_files() if name == "mdc_core" or name.startswith("mdc_core."))


def is_extension(name: str) -> bool:
    return any(name == ext or name.startswith(ext + ".") for ext in EXTENSIONS)


def test_cycle_finder_finds_a_cycle_and_a_self_contained_graph_has_none():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_import_graph_reads_relative_lazy_and_submodule_imports():
    graph = import_graph()
    assert "mdc_core.model" in graph["mdc_core.objectives"]  # relative: from .model import ...
    assert "mdc_workbench.masked_conditional.d3pm" in graph["mdc_workbench.masked_conditional.diffusion"]
    assert "mdc_core.train" in graph["mdc_workbench.cli.train"]  # inside a function


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


def test_an_mdc_run_loads_no_plug_in_and_its_config_holds_only_its_own_keys():
    """A fresh interpreter builds, saves and reloads an MDC run's config: MC-Diffusion's keys are not in it and its
    plug-in is never imported; the shipped model's config.json, which carries them from before, still loads."""
    code = ("import json, sys\n"
            "from mdc_core.config import RunConfig\n"
            "cfg = RunConfig.from_dict({'objective': {'name': 'mdc'}})\n"
            "saved = cfg.to_dict()\n"
            "assert RunConfig.from_dict(saved).to_dict() == saved\n"
            "print(json.dumps([sorted(saved['objective']), sorted(sys.modules)]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    keys, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"d3pm_steps", "guidance", "p_cond", "p_mask"}.isdisjoint(keys) and "t_low" in keys
    assert [m for m in loaded if m.startswith("mdc_workbench")] == []
    shipped = json.loads(next((ROOT / "mdc_core" / "pretrained").glob("*/config.json")).read_text())
    assert "guidance" in shipped["objective"]  # written before the split: the extension's keys at their defaults
    from mdc_core.config import RunConfig
    assert "guidance" not in RunConfig.from_dict(shipped).to_dict()["objective"]


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


def extension_words() -> set[str]:
    """What naming an extension means: its module paths (with and without ``mdc_workbench.``) and every name its
    plug-in registers with the core (objectives, encoders, config keys)."""
    from mdc_core import registry
    registry.load_plugins()
    words = {name for name in module_files() if is_extension(name)}
    words |= {name.removeprefix("mdc_workbench.") for name in words}
    words |= {name for name in registry.OBJECTIVES if name not in registry.CORE_OBJECTIVES} | set(registry.ENCODERS)
    words |= {key for rows in registry.SETTINGS.values() for settings in rows for key in settings.__dataclass_fields__}
    return words - {"app", "cli", "eval", "bench", "notebooks", "mdc_workbench"}  # plain words (the last is also
    # the project's distribution name); their dotted module paths still count


def naming_problems(source: str, words: set[str]) -> list[str]:
    """``line: word`` for each place `source` names one of `words` (whole words; dotted paths as a whole)."""
    pattern = re.compile(r"(?<!\w)(" + "|".join(sorted(map(re.escape, words), key=len, reverse=True)) + r")(?![\w])")
    return [f"{n}: {m.group(1)}" for n, line in enumerate(source.splitlines(), 1) for m in pattern.finditer(line)]


def test_the_name_check_fails_on_a_core_string_or_config_field_naming_an_extension():
    words = extension_words()
    assert {"d3pm", "vqvae", "guidance", "p_mask", "mdc_workbench.masked_conditional", "masked_conditional.guidance",
            "mdc_workbench.eval.probe", "mdc_app.render"} <= words
    leaky = (
        "@dataclass\n"
        "class ObjectiveConfig:\n"
        "    d3pm_steps: int = 100  # a plug-in's key as a core config field\n"
        "ENCODERS = {'vq': 'mdc_workbench.masked_conditional.vqvae:VQImageEncoder'}  # a string into an extension\n"
        "def f(cfg):\n"
        "    return cfg.guidance\n"
    )
    assert naming_problems(leaky, words) == ["3: d3pm_steps", "4: mdc_workbench.masked_conditional.vqvae",
                                             "6: guidance"]
    clean = "def loss(model, tokens):\n    return model.eval()  # mdc eval captioning; d3pmx, my_guidance_x\n"
    assert naming_problems(clean, words) == []


def test_the_core_names_no_extension_and_no_key_a_plug_in_registers():
    words = extension_words()
    files = module_files()
    found = {name: naming_problems(files[name].read_text(), words) for name in core_modules() if name != "mdc_core"}
    assert {name: problems for name, problems in found.items() if problems} == {}


LAYERS = {  # docs/design.md "Core and workbench": what each part may import besides the core (and itself)
    "mdc_workbench": {"mdc_workbench.cli"},  # python -m mdc_workbench
    "mdc_workbench.cli": {"mdc_app", "mdc_workbench.notebooks", "mdc_workbench.bench",
                          "mdc_workbench.masked_conditional", "mdc_workbench.eval"},
    "mdc_app": {"mdc_workbench.notebooks"},
    "mdc_workbench.notebooks": {"mdc_workbench.masked_conditional", "mdc_workbench.eval"},
    "mdc_workbench.bench": {"mdc_workbench.eval"},
    "mdc_workbench.seed_stack": {"mdc_workbench.bench"},  # its bench.py uses the bench's inputs and memory readers
    "mdc_workbench.masked_conditional": {"mdc_workbench.eval"},
    "mdc_workbench.eval": set(),
}


def part(name: str) -> str:
    return next((ext for ext in EXTENSIONS if name == ext or name.startswith(ext + ".")), "core")


def test_the_parts_import_as_the_picture_in_design_md_draws():
    graph = import_graph()
    arrows = {(part(a), part(b)) for a, deps in graph.items() for b in deps}
    assert {(a, b) for a, b in arrows if a != b and b != "core" and b not in LAYERS.get(a, set())} == set()
    assert ("mdc_app", "mdc_workbench.notebooks") in arrows  # the app draws trajectories with the workbench's code


def test_the_app_builds_on_the_workbench_never_the_reverse():
    """The app imports the workbench's drawings (trajectory_view, animation); no extension below the command line
    imports the app (only ``mdc app`` in mdc_workbench.cli launches it)."""
    graph = import_graph()
    assert "mdc_workbench.notebooks.trajectory_view" in graph["mdc_app.callbacks"]
    upward = {name: sorted(t for t in deps if t == "mdc_app" or t.startswith("mdc_app."))
              for name, deps in graph.items() if name.startswith(("mdc_core.", "mdc_workbench."))
              and not name.startswith(("mdc_workbench.cli", "mdc_workbench.__main__"))}
    assert {k: v for k, v in upward.items() if v} == {}


def folder_imports(source: str) -> list[str]:
    """Absolute imports of the top-level name ``app``: the app's folder, which is not an installed package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [n for n in names if n == "app" or n.startswith("app.")]
    return found


def test_nothing_imports_the_app_by_its_folder_name():
    """The app is installed as ``mdc_app``; ``import app`` only works by accident from the repository root (and
    would load a second copy of its modules), so no module, test or docs script writes it."""
    assert folder_imports("from app.launch import serve\nimport app.runs\nfrom . import app\nimport mdc_app\n") == [
        "app.launch", "app.runs"]
    paths = [*module_files().values(), *(ROOT / "tests").glob("*.py"), *(ROOT / "docs").glob("*.py")]
    assert {str(p.relative_to(ROOT)): f for p in paths if (f := folder_imports(p.read_text()))} == {}
