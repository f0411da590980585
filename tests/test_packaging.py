"""environment.yml (conda users) and pyproject.toml (pip users) describe the same dependencies."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec, maxsplit=1)[0].lower().replace("_", "-")


def _pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return {_name(s): s for s in (ln.strip() for ln in lines) if s and not s.startswith("#")}


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(s): s for s in project["dependencies"] + sum(project["optional-dependencies"].values(), [])}
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


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "make test" in ci and "make test" in readme and "make demo" in readme
