"""Command line ``mdc`` (also ``python -m mdc_core``): the parser assembled from one module per verb group.

==========================  ===============================================================
``mdc data ...``            :mod:`mdc_core.cli.data`
``mdc train | demo | presets``  :mod:`mdc_core.cli.train`
``mdc sample | score``      :mod:`mdc_core.cli.sample`
``mdc eval ... | probe``    :mod:`mdc_core.cli.evaluate`
``mdc vqvae ...``           :mod:`mdc_core.cli.masked_conditional` (MC-Diffusion)
``mdc bench``               :mod:`mdc_core.cli.bench`
``mdc runs | app``          :mod:`mdc_core.cli.workbench`
==========================  ===============================================================

Every verb is a thin wrapper: it parses arguments, calls the library, prints a result. The shared flags come
from :mod:`mdc_core.cli.common`. Errors a user can fix (missing files, bad config keys, unreadable images) print
one line ``mdc: error: ...`` and exit with 2. Building the parser imports no torch.
"""

from __future__ import annotations

import argparse
import sys

from mdc_core.cli import bench, data, evaluate, masked_conditional, sample, train, workbench
from mdc_core.cli.checks import check_numeric_args
from mdc_core.cli.common import USER_ERRORS

GROUPS = (data, train, sample, evaluate, workbench, bench, masked_conditional)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mdc", description="Masked diffusion captioning workbench.")
    sub = parser.add_subparsers(dest="verb", required=True)
    for group in GROUPS:
        group.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = {verb: fn for group in GROUPS for verb, fn in group.HANDLERS.items()}[args.verb]
    try:
        check_numeric_args(args)  # e.g. --steps 0: an error, never the preset's default
        if getattr(args, "precision", None) is None:
            handler(args)
        else:  # --precision: the default of every sampling and scoring call the verb makes
            from mdc_core.precision import default_inference_precision
            with default_inference_precision(args.precision):
                handler(args)
    except USER_ERRORS as err:
        print(f"mdc: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:
        from mdc_core.train import TrainingInterrupted
        if isinstance(err, TrainingInterrupted):  # a checkpoint was written: say where, and how to go on
            print(f"mdc: {err}; continue with the same command and --resume", file=sys.stderr)
            return 128 + err.signum  # the shell's convention for a process stopped by a signal
        print("mdc: interrupted", file=sys.stderr)
        return 130
    except RuntimeError as err:  # a training run stopped for a reason its message explains
        from mdc_core.distributed import RankFailure
        from mdc_core.train import TrainingDiverged
        if not isinstance(err, (TrainingDiverged, RankFailure)):
            raise
        print(f"mdc: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
