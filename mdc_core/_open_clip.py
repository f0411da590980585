"""open_clip's tokenizer and image constants without importing the ``open_clip`` package.

``import open_clip.tokenizer`` first runs ``open_clip/__init__``, which imports its whole model zoo (CoCa ->
Hugging Face ``transformers`` -> scikit-learn when those are installed: seconds of start-up and a core that
silently depends on the extensions' libraries). The two files the core needs, ``tokenizer.py`` (CLIP's BPE) and
``constants.py`` (the image mean / std), import nothing from their package, so they are executed here from the
installed package's folder as stand-alone modules. If ``open_clip`` is already imported, its own modules are used.
The CLIP baseline (:mod:`mdc_core.clip_model`) still imports open_clip's text tower and loss, when it is built.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType


@cache
def load(name: str) -> ModuleType:
    """open_clip's module `name` (``tokenizer`` or ``constants``), without running the package's ``__init__``."""
    if f"open_clip.{name}" in sys.modules:
        return sys.modules[f"open_clip.{name}"]
    package = importlib.util.find_spec("open_clip")  # locates the package; does not execute it
    if package is None or not package.submodule_search_locations:
        raise ImportError("open_clip_torch is not installed (pip install open_clip_torch); the caption tokenizer "
                          "and the image normalisation come from it")
    path = Path(next(iter(package.submodule_search_locations))) / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"mdc_core._open_clip_{name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} from the installed open_clip_torch")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
