"""What the verbs of ``mdc`` share: the repeated flags as argparse parent parsers, and the user errors.

A verb takes its shared flags with ``parents=[flags(run=..., device=True, json=...)]``: each keyword names a flag
of :data:`FLAGS`; ``True`` keeps its standard definition, a string replaces its help text, a dict overrides any
of its ``add_argument`` keywords. Everything else a verb defines itself.
"""

from __future__ import annotations

import argparse
from typing import Any

from mdc_core.config import PRECISIONS, ConfigError
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
                                  "bf16 autocast on CUDA, fp32 on the CPU (default); bf16 on a CPU is slow"}),
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
