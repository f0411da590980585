"""Which packages the wheel holds (everything else is in pyproject.toml): ``mdc_core`` (the method and its training
loop), ``mdc_workbench`` (evaluation, evidence, notebooks and plans, benchmarks, export, MC-Diffusion, the command
line) and the app, whose folder
is ``app/`` and whose installed name is ``mdc_app`` (a top-level ``app`` in site-packages would clash with anyone's).
A folder installed under another name needs ``package_dir``, which pyproject's ``packages.find`` cannot combine with
a search; editable installs (``pip install -e .``, what ``make`` does) map it too.
"""

from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["mdc_core*", "mdc_workbench*"]), "mdc_app"], package_dir={"mdc_app": "app"})
