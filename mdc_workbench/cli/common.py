"""What the verbs of ``mdc`` share: the repeated flags as argparse parent parsers, and the user errors.

A verb takes its shared flags with ``parents=[flags(run=..., device=True, json=...)]``: each keyword names a flag
of :data:`FLAGS`; ``True`` keeps its standard definition, a string replaces its help text, a dict overrides any
of its ``add_argument`` keywords. Everything else a verb defines itself.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from mdc_core.config import PRECISIONS, ConfigError, list_presets
from mdc_core.runlock import RunFolderBusy


class MissingExtra(ImportError):
    """A verb needs an optional extra that is not installed; the message names the extra and how to install it."""


# -> "mdc: error: ...", exit 2 (PermissionError: a shared run or folder this user may not read or write)
USER_ERRORS = (ConfigError, FileNotFoundError, FileExistsError, ValueError, PermissionError, IsADirectoryError,
               NotADirectoryError, RunFolderBusy, MissingExtra)

FLAGS: dict[str, tuple[str, dict[str, Any]]] = {  # keyword -> (flag, standard add_argument keywords)
    "run": ("--run", {"required": True, "help": "run or checkpoint folder"}),
    "runs": ("--run", {"action": "append", "required": True, "help": "run folder (repeatable)"}),
    "data": ("--data", {"required": True, "help": "data path (shard folder, brace pattern, CSV/TSV or COCO JSON)"}),
    "image": ("--image", {"required": True, "help": "image file"}),
    "device": ("--device", {"default": "cpu", "help": "cpu | cuda | cuda:N"}),
    "precision": ("--precision", {"default": "auto", "choices": PRECISIONS, "help": "sampling and scoring: auto = "
                                  "bf16 autocast on a GPU with bf16 (Ampere+), else fp32 (default); bf16 on a CPU "
                                  "is slow"}),
    "ema": ("--ema", {"action": "store_true", "help": "use the EMA weights"}),
    "split": ("--split", {"default": "test", "help": "data split (default test)"}),
    "limit": ("--limit", {"type": int, "help": "at most N images"}),
    "batch_size": ("--batch-size", {"type": int, "help": "images per batch"}),
    "seed": ("--seed", {"type": int, "default": 0}),
    "set": ("--set", {"action": "append", "default": [], "metavar": "SECTION.KEY=VALUE",
                      "help": "override any config key, e.g. --set train.lr=1e-3 (repeatable)"}),
    "out": ("--out", {"required": True, "help": "output folder"}),
    "json": ("--json", {"action": "store_true", "help": "print the result as JSON"}),
    "quiet": ("--quiet", {"action": "store_true", "help": "no progress bar"}),
}


def flags(**chosen: bool | str | dict[str, Any]) -> argparse.ArgumentParser:
    """A parent parser holding the shared flags named by `chosen`, in the order given (see the module docstring)."""
    parent = argparse.ArgumentParser(add_help=False)
    for name, override in chosen.items():
        flag, kwargs = FLAGS[name]
        if isinstance(override, str):
            kwargs = {**kwargs, "help": override}
        elif isinstance(override, dict):
            kwargs = {**kwargs, **override}
        parent.add_argument(flag, **kwargs)
    return parent


class Parser(argparse.ArgumentParser):
    """argparse's parser, except that an unknown flag is named before a missing required one: argparse checks the
    required flags first, so ``mdc train --bogus`` said "the following arguments are required: --out" (the verbs'
    sub-parsers are of this class too: argparse builds them with their parent's class)."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        if message.startswith("the following arguments are required"):
            unknown = [a for a in getattr(self, "_given", []) if self._unknown_flag(a)]
            if unknown:
                message = f"unrecognized arguments: {' '.join(unknown)}"
        super().error(message)

    def _unknown_flag(self, arg: str) -> bool:
        """`arg` looks like a flag (not a value such as -1 or a lone -) that this parser does not know, whole or as
        argparse's unique abbreviation."""
        if not isinstance(arg, str) or not arg.startswith("-") or arg in ("-", "--") or \
                self._negative_number_matcher.match(arg):
            return False
        name = arg.split("=", 1)[0]
        known = self._option_string_actions
        return name not in known and not (self.allow_abbrev and name.startswith("--")
                                          and any(flag.startswith(name) for flag in known))


def check_preset(args: argparse.Namespace) -> None:
    """An unknown ``--preset`` is an error before the verb imports torch (a preset is a JSON file's name)."""
    name = getattr(args, "preset", None)
    if name is not None and name not in list_presets():
        raise ConfigError(f"unknown preset {name!r}; available: {', '.join(list_presets())}")


# pyproject.toml's optional dependencies by the name they are imported as -> the extras that install them
# (tests/workbench/test_extras.py checks the table against pyproject.toml), and the extra each verb's own job needs
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "gradio": ("app",), "gradio_client": ("app",), "matplotlib": ("app", "notebooks", "eval"),
    "papermill": ("notebooks",), "nbformat": ("notebooks",), "ipykernel": ("notebooks",),
    "ipywidgets": ("notebooks",), "nbconvert": ("notebooks",), "latex2mathml": ("notebooks",),
    "yaml": ("notebooks",), "filelock": ("notebooks",),
    "sklearn": ("eval",), "scipy": ("eval",), "threadpoolctl": ("eval",), "pycocoevalcap": ("eval",),
    "huggingface_hub": ("export",), "transformers": ("bench",), "diffusers": ("vqgan",),
    "tensorboard": ("tensorboard",), "submitit": ("cluster",),
    "jupyterlab": ("lab",), "pytest": ("dev",), "ruff": ("dev",), "statsmodels": ("dev",),
}
VERB_EXTRAS = {"app": "app", "runs": "notebooks", "eval": "eval", "probe": "eval", "bench": "bench",
               "vqvae": "vqgan", "export": "export"}


def missing_extra(err: ImportError, verb: str) -> str | None:
    """One line saying which extra installs the module `err` (or the ModuleNotFoundError it was raised from) could
    not import, or None when no extra does (a broken install of the core: the traceback is the better message)."""
    cause = err if isinstance(err, ModuleNotFoundError) else err.__cause__
    module = (getattr(cause, "name", None) or "").split(".")[0] if isinstance(cause, ModuleNotFoundError) else ""
    extras = EXTRA_MODULES.get(module)
    if not extras:
        return None
    if VERB_EXTRAS.get(verb) in extras:
        extras = (VERB_EXTRAS[verb],)
    which = " or ".join(f"[{e}]" for e in extras)
    return (f"mdc {verb} needs {module}, which the {which} extra installs: pip install -c constraints.txt -e "
            f"\".[{extras[0]}]\" in the workbench's checkout (make setup installs every extra but [lab])")
