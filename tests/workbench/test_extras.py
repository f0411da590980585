"""An install that says what it needs (issue 64 item 4): with only the core installed (`pip install .`), every
`mdc` verb either works or says in one line which extra to install, never a traceback; the table behind those lines
agrees with pyproject.toml's extras."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from PIL import Image

from mdc_workbench.cli.common import EXTRA_MODULES, VERB_EXTRAS

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "mdc_core" / "pretrained" / "mdc_tiny_lean_easy"
CORE_PULLS = {"yaml", "filelock", "huggingface_hub"}  # in an extra, but the core's dependencies pull them too


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _extras() -> dict[str, set[str]]:
    """pyproject.toml's extras -> the distributions each names itself (normalised; "mdc-workbench[notebooks,eval]"
    in [lab] names other extras, not distributions)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {extra: {_norm(re.split(r"[<>=!~ \[]", spec, maxsplit=1)[0]) for spec in specs}
             for extra, specs in project["optional-dependencies"].items()}
    return {extra: found - {_norm(project["name"])} for extra, found in names.items()}


def test_the_extra_table_agrees_with_pyproject():
    """Each module of EXTRA_MODULES belongs to a distribution that each extra it names lists, and every
    distribution of every extra has its module in the table (so a missing one is always explained)."""
    extras = _extras()
    dists = importlib.metadata.packages_distributions()
    provided = {module: {_norm(d) for d in dists.get(module, [module])} for module in EXTRA_MODULES}
    for module, names in EXTRA_MODULES.items():
        for extra in names:
            assert provided[module] & extras[extra], (module, extra)
    for extra, names in extras.items():
        for name in names:
            assert any(name in provided[m] and extra in EXTRA_MODULES[m] for m in EXTRA_MODULES), (extra, name)
    assert set(VERB_EXTRAS.values()) <= set(extras)


CHILD = """
import contextlib, io, json, sys
for name in json.loads(sys.argv[1]):  # `pip install .`: the extras' packages are not there
    sys.modules[name] = None
from mdc_workbench.cli import main
results = []
for argv in json.loads(sys.argv[2]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(argv)
        except SystemExit as exit:
            rc = exit.code
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            import traceback
            traceback.print_exc()
            rc = "raised " + type(exc).__name__
    results.append({"argv": argv, "rc": rc, "out": out.getvalue()[-500:], "err": err.getvalue()[-2000:]})
print(json.dumps(results))
"""


def test_every_verb_works_or_names_its_extra_with_only_the_core_installed(tmp_path):
    """One interpreter in which the extras' modules cannot be imported runs each verb: the core's verbs work (mdc
    sample did not: the trajectory record imported matplotlib), the others end in one line naming the extra."""
    Image.new("RGB", (80, 60), (200, 30, 30)).save(tmp_path / "img.png")
    data, shipped = str(tmp_path / "data"), str(SHIPPED)
    image = ["--image", str(tmp_path / "img.png")]
    works = [["data", "synth", "--out", data, "--n", "16", "--image-size", "32", "--shard-size", "8"],
             ["presets"],
             ["sample", "--run", shipped, *image],
             ["score", "--run", shipped, *image, "--caption", "a red circle", "--method", "heuristic"],
             ["export", shipped, "--out", str(tmp_path / "export"), "--format", "timm"]]
    needs = [(["sample", "--run", shipped, *image, "--gif", str(tmp_path / "t.gif")], "matplotlib", "app"),
             (["app", "--root", str(tmp_path)], "gradio", "app"),
             (["runs", str(ROOT / "plans" / "cpu_demo.yaml"), "--dry-run"], None, None),
             (["probe", "--run", shipped, "--data", data], "sklearn", "eval"),
             (["eval", "captioning", "--run", shipped, "--data", data, "--limit", "2"], "pycocoevalcap", "eval"),
             (["vqvae", "show", "--path", data], "diffusers", "vqgan"),
             (["train", "--data", data, "--out", str(tmp_path / "run"), "--steps", "1", "--tensorboard"], None,
              "tensorboard")]
    hidden = sorted(set(EXTRA_MODULES) - CORE_PULLS)
    calls = works + [argv for argv, _, _ in needs]
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(hidden), json.dumps(calls)], capture_output=True,
                         text=True, timeout=900, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)
    for result in results[:len(works)]:
        assert result["rc"] == 0, result
    assert "a" in results[2]["out"]  # the caption
    for result, (_, module, extra) in zip(results[len(works):], needs, strict=True):
        lines = result["err"].strip().splitlines()
        assert result["rc"] == 2 and "Traceback" not in result["err"], result
        assert lines[-1].startswith("mdc: error: ") and re.search(r"\[\w+\]", lines[-1]), result
        if module:
            assert f"needs {module}," in lines[-1], result
        if extra:
            assert f"[{extra}]" in lines[-1], result
    assert not (tmp_path / "t.gif").exists() and not (tmp_path / "run").exists()
