"""environment.yml (conda users) and pyproject.toml (pip users) describe the same dependencies."""

import importlib.metadata
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec, maxsplit=1)[0].lower().replace("_", "-")


def _pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return {_name(s): s for s in (ln.strip() for ln in lines) if s and not s.startswith("#")}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_environment_yml_matches_pyproject():
    project = _project()
    wanted = {_name(s): s for s in project["dependencies"] + sum(project["optional-dependencies"].values(), [])
              if _name(s) != project["name"]}  # an extra that names others of this project ("mdc-workbench[...]")
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    have = {_name(s): s for s in pip}
    assert set(have) == set(wanted), f"only in one file: {set(have) ^ set(wanted)}"
    pins = _pins()
    for name, spec in have.items():
        expected = pins.get(name, wanted[name])  # torch/torchvision: the exact pins of constraints.txt
        assert spec.replace(" ", "") == expected.replace(" ", ""), f"{name}: {spec} vs {expected}"


def test_constraints_pin_the_torch_stack():
    pins = _pins()
    assert pins["torch"] == "torch==2.14.1" and pins["torchvision"] == "torchvision==0.29.1"


def test_constraints_pin_what_pip_searched_at_the_versions_the_tests_run_with():
    """gradio and the packages pip backtracked through (issue 64: 16 gradio wheels) are pinned, and each pin is
    the installed version (the torch stack's local build tag aside, e.g. 2.14.1+cpu)."""
    pins = _pins()
    assert {"gradio", "gradio-client", "huggingface-hub", "transformers", "diffusers"} <= set(pins)
    for name, spec in pins.items():
        version = importlib.metadata.version(name).split("+")[0]
        assert spec == f"{spec.split('==')[0]}=={version}", f"{spec} pinned, {version} installed"


def test_license_citation_and_type_markers_ship():
    """MIT as pyproject says, a citation file for the paper and the software, and PEP 561's py.typed in both
    packages (package data, so a wheel holds them)."""
    assert _project()["license"] == "MIT"
    licence = (ROOT / "LICENSE").read_text()
    assert licence.startswith("MIT License") and "Copyright (c) 2026 the MDC workbench authors" in licence
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert {"cff-version", "message", "title", "authors"} <= set(cff) and cff["license"] == "MIT"
    paper = cff["preferred-citation"]
    assert paper["title"] == "Masked Diffusion Captioning for Visual Feature Learning" and paper["year"] == 2025
    assert [a["family-names"] for a in paper["authors"]] == ["Feng", "Wei", "Owens"]
    assert cff["version"] == _project()["version"]
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package in ("mdc_core", "mdc_workbench"):
        assert (ROOT / package / "py.typed").is_file() and "py.typed" in data[package]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make demo" in readme


CORE_FREE_OF = ("gradio", "gradio-client", "papermill", "nbformat", "ipykernel", "ipywidgets", "jupyterlab",
                "scikit-learn", "pycocoevalcap", "transformers", "diffusers", "matplotlib", "pyyaml", "tensorboard")


def test_core_install_pulls_no_app_notebook_or_eval_stack_and_make_installs_every_extra():
    project = _project()
    extras = project["optional-dependencies"]
    assert {_name(s) for s in project["dependencies"]}.isdisjoint(CORE_FREE_OF)
    assert {"app", "notebooks", "eval", "bench", "vqgan", "lab", "dev"} <= set(extras)
    for spec in extras["lab"]:  # self-references name existing extras
        if _name(spec) == project["name"]:
            assert set(re.search(r"\[(.*)\]", spec).group(1).split(",")) <= set(extras)
    makefile = (ROOT / "Makefile").read_text()
    installed = set(re.search(r"^EXTRAS := ([\w,]+)", makefile, re.M).group(1).split(","))
    assert installed == set(extras) - {"lab"}
    assert '-e ".[$(EXTRAS)]"' in makefile


def test_make_lab_installs_lab_registers_the_notebooks_kernel_and_serves_on_loopback(tmp_path):
    """`make -n lab` (a dry run) prints the install of [lab], the kernel registration under the name every
    notebook's kernelspec and `mdc runs` use, and JupyterLab on 127.0.0.1 in notebooks/ (--allow-root only as root)."""
    import json
    import subprocess

    from mdc_workbench.runs.plans import KERNEL_NAME

    out = subprocess.run(["make", "-n", "-B", "lab", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    registered = re.search(r"-m ipykernel install --sys-prefix --name (\S+)", out).group(1)
    assert '-m pip install --progress-bar off -c constraints.txt -e ".[lab]"' in out
    lab = out[out.index("-m jupyterlab"):]
    assert "--notebook-dir=notebooks" in lab and "--ip=127.0.0.1" in lab
    assert 'if [ "$(id -u)" = 0 ]; then echo --allow-root; fi' in lab
    assert out.index("ipykernel install") < out.index("-e \".[lab]\"") < out.index("-m jupyterlab")
    names = {json.loads(p.read_text())["metadata"]["kernelspec"]["name"] for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert names == {registered} == {KERNEL_NAME}


def test_the_install_holds_the_two_packages_and_the_app_as_mdc_app_never_a_top_level_app(tmp_path):
    """The app's folder is ``app/``; installed, it is ``mdc_app`` (setup.py), so site-packages gets no generic
    ``app``. Imported from outside the checkout, ``mdc_app`` is that folder and ``app`` is nothing."""
    top = importlib.metadata.distribution(_project()["name"]).read_text("top_level.txt").split()
    assert sorted(top) == ["mdc_app", "mdc_core", "mdc_workbench"]
    code = ("import importlib.util, json, mdc_app\n"
            "print(json.dumps([mdc_app.__file__, importlib.util.find_spec('app') is None,"
            " callable(mdc_app.build_app)]))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    file, no_app, builds = json.loads(out.stdout.strip().splitlines()[-1])
    assert Path(file).parent.name == "app" and no_app and builds


def _core_imports() -> tuple[set[str], set[str]]:
    """Third-party top-level names mdc_core imports: (at module level, only inside functions)."""
    import ast

    top, lazy = set(), set()
    for path in (ROOT / "mdc_core").rglob("*.py"):
        tree = ast.parse(path.read_text())
        module_level = {id(n) for n in tree.body} | {id(c) for n in tree.body if isinstance(n, ast.Try)
                                                     for c in n.body + n.orelse}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                first = name.split(".")[0]
                if first in sys.stdlib_module_names or first in ("mdc_core", "__future__"):
                    continue
                (top if id(node) in module_level else lazy).add(first)
    return top, lazy - top


def test_the_core_depends_on_what_it_imports_and_nothing_more():
    """pyproject's core dependencies are the distributions of mdc_core's imports (lazy ones may be extras')."""
    dists = importlib.metadata.packages_distributions()
    project = _project()
    core = {_name(s) for s in project["dependencies"]}
    extras = {_name(s) for specs in project["optional-dependencies"].values() for s in specs}
    top, lazy = _core_imports()
    as_dist = {name: {d.lower().replace("_", "-") for d in dists.get(name, [name])} for name in top | lazy}
    assert {n for n in top if not as_dist[n] & core} == set(), "imported at module level, not a core dependency"
    assert {n for n in lazy if not as_dist[n] & (core | extras)} == set(), "imported lazily, in no extra"
    imported = set().union(*as_dist.values())
    assert core - imported == set(), "a core dependency mdc_core never imports"


def test_the_app_registers_its_verb_and_without_the_app_extra_mdc_app_says_which_to_install(tmp_path):
    """`mdc app` is the app's own verb group, found through the entry point group ``mdc_workbench.verbs``
    (pyproject.toml and the installed metadata agree; no workbench module imports the app). With the [app] extra's
    gradio absent, `mdc app` is one line naming the extra and exit 2, before torch or gradio is imported."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared["mdc_workbench.verbs"] == {"app": "mdc_app.cli"}
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="mdc_workbench.verbs")}
    assert installed == declared["mdc_workbench.verbs"], "reinstall (make setup): the metadata predates pyproject"
    code = ("import json, sys\n"
            "sys.modules['gradio'] = None  # as if the [app] extra were not installed\n"
            "from mdc_workbench.cli import main\n"
            "code = main(['app', '--root', '.'])\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'gradio') and sys.modules[m])\n"
            "print(json.dumps([code, heavy]))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [2, []]
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("mdc: error: ") and "[app] extra" in line and "gradio" in line  # which extra, what lacks
