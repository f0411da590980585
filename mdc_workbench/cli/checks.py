"""Range checks of the command line's numeric flags, by flag name (one table for every verb).

argparse checks that ``--steps 0`` is an integer, not that it makes sense; :func:`check_numeric_args` runs on the
parsed arguments of any verb and raises ``ValueError`` naming the first flag outside its range, which
:func:`mdc_workbench.cli.main.main` prints as one ``mdc: error:`` line (exit 2) before anything runs. The sampler's
flags take the ranges their options declare (:func:`mdc_core.config.sampler_options`); any other flag not listed
below must be >= 1 (counts, sizes, steps, lengths); the tables list the exceptions.
"""

from __future__ import annotations

import argparse
import math

from mdc_core.config import sampler_options

NON_NEGATIVE = frozenset({  # 0 is meaningful: a seed, "off", "this process", "all"
    "seed", "workers", "finetune_steps", "threads", "profile", "weight_decay", "beta",
})
UNIT_INTERVAL = frozenset({"guidance_p_mask"})  # in [0, 1]
POSITIVE_REAL = frozenset({"lr"})  # > 0, need not be >= 1
ANY_REAL = frozenset({"guidance_scale"})  # any finite number (negative guidance is a valid experiment)
PORTS = frozenset({"port"})  # 1-65535


def _problem(dest: str, value: float) -> str | None:
    """Why `value` is not allowed for flag `dest`, or None."""
    if not math.isfinite(value):
        return "must be a finite number"
    if dest in ANY_REAL:
        return None
    declared = {opt.name: opt for opt in sampler_options() if opt.range is not None}
    if dest in declared:
        return declared[dest].problem(value)
    if dest in NON_NEGATIVE:
        return None if value >= 0 else "must be >= 0"
    if dest in UNIT_INTERVAL:
        return None if 0 <= value <= 1 else "must be in [0, 1]"
    if dest in POSITIVE_REAL:
        return None if value > 0 else "must be > 0"
    if dest in PORTS:
        return None if 1 <= value <= 65535 else "must be a port number in 1-65535"
    return None if value >= 1 else "must be >= 1"


def check_numeric_args(args: argparse.Namespace) -> None:
    """Raise ``ValueError`` for the first numeric flag of `args` out of its range (``None`` means "not given")."""
    for dest, value in vars(args).items():
        values = value if isinstance(value, list) else [value]
        for v in values:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                continue
            problem = _problem(dest, v)
            if problem:
                raise ValueError(f"--{dest.replace('_', '-')} {problem}, got {v}")
