"""Command line ``mdc`` (also ``python -m mdc_core``): the parser assembled from one module per verb group.

==========================  ===============================================================
``mdc data ...``            :mod:`mdc_core.cli.data`
``mdc train | demo | presets``  :mod:`mdc_core.cli.train`
``mdc sample | score``      :mod:`mdc_core.cli.sample`
``mdc eval ... | probe``    :mod:`mdc_core.cli.evaluate`
``mdc vqvae ...``           :mod:`mdc_core.cli.masked_conditional` (MC-Diffusion)
``mdc bench``               :mod:`mdc_core.cli.bench`
``mdc runs``                :mod:`mdc_core.cli.runs`
``mdc app``                 :mod:`mdc_core.cli.app`
``mdc export``              :mod:`mdc_core.cli.export`
==========================  ===============================================================

Every verb is a thin wrapper: it parses arguments, calls the library, prints a result. The shared flags come
from :mod:`mdc_core.cli.common`. Errors a user can fix (missing files, bad config keys, unreadable images) print
one line ``mdc: error: ...`` and exit with 2; a full disk is one line and exit 1; Ctrl-C at any moment (even
while torch is being imported) is ``mdc: interrupted`` and exit 130. Building the parser imports no torch, so
``mdc --help`` answers at once (``tests/test_cli_reliability.py`` checks it).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator

from mdc_core.cli import app, bench, data, evaluate, export, masked_conditional, runs, sample, train
from mdc_core.cli.checks import check_numeric_args
from mdc_core.cli.common import USER_ERRORS

GROUPS = (data, train, sample, evaluate, export, app, runs, bench, masked_conditional)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mdc", description="Masked diffusion captioning workbench.")
    sub = parser.add_subparsers(dest="verb", required=True)
    for group in GROUPS:
        group.add_parsers(sub)
    return parser


LIGHT_VERBS = frozenset({"presets", "runs"})  # verbs that import no torch
PRELOAD = {"app": ("mdc_core.train", "app.mdc_app")}  # default: mdc_core.train (torch, torchvision, timm)


@contextlib.contextmanager
def _exit_on_interrupt() -> Iterator[None]:
    """Ctrl-C in the block exits at once with ``mdc: interrupted`` (130). Meant for importing the libraries a verb
    needs: a KeyboardInterrupt raised inside torch's import (C++ callbacks) aborts the process, or is swallowed by
    the import machinery so that the command goes on; nothing has been written yet, so exiting loses nothing."""
    def stop(signum: int, frame: object) -> None:
        sys.stderr.write("mdc: interrupted\n")
        os._exit(130)

    usable = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is not signal.SIG_IGN  # a background job keeps ignoring it
    previous = signal.signal(signal.SIGINT, stop) if usable else None
    try:
        yield
    finally:
        if usable:
            signal.signal(signal.SIGINT, previous)


def _format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    line: str | None = None) -> str:
    """``mdc: warning: ...`` on one line for the warnings mdc gives (UserWarning), the usual form for the rest."""
    if issubclass(category, UserWarning):
        return f"mdc: warning: {message}\n"
    return _PYTHON_FORMAT(message, category, filename, lineno, line)


_PYTHON_FORMAT = warnings.formatwarning


def main(argv: list[str] | None = None) -> int:
    warnings.formatwarning = _format_warning  # printing only: recorded warnings (pytest.warns) are unchanged
    try:
        return _main(argv)
    finally:
        warnings.formatwarning = _PYTHON_FORMAT


def _main(argv: list[str] | None) -> int:
    try:
        with _exit_on_interrupt():
            args = build_parser().parse_args(argv)
            handler = {verb: fn for group in GROUPS for verb, fn in group.HANDLERS.items()}[args.verb]
            check_numeric_args(args)  # e.g. --steps 0: an error, never the preset's default
            for module in () if args.verb in LIGHT_VERBS else PRELOAD.get(args.verb, ("mdc_core.train",)):
                importlib.import_module(module)
        if getattr(args, "precision", None) is None:
            handler(args)
        else:  # --precision: the default of every sampling and scoring call the verb makes
            from mdc_core.precision import default_inference_precision
            with default_inference_precision(args.precision):
                handler(args)
    except USER_ERRORS as err:
        print(f"mdc: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # no import here: Ctrl-C may have cut one short
        signum = getattr(err, "signum", None)
        if signum:  # TrainingInterrupted: a checkpoint was written; say where, and how to go on
            print(f"mdc: {err}; continue with the same command and --resume", file=sys.stderr)
            return 128 + signum  # the shell's convention for a process stopped by a signal
        print("mdc: interrupted", file=sys.stderr)
        return 130
    except OSError as err:  # a full disk anywhere (checkpoints say what they kept; see mdc_core.checkpoint)
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        if type(err).__name__ == "DiskFullError":  # says what was kept and how to go on
            print(f"mdc: error: {err}", file=sys.stderr)
        else:
            where = f" (writing {err.filename})" if err.filename else ""
            print(f"mdc: error: no space left on the device{where}; free some space and run the command again (a "
                  "training run continues from its last checkpoint with --resume)", file=sys.stderr)
        return 1
    except RuntimeError as err:  # a training run stopped for a reason its message explains
        if type(err).__name__ not in ("TrainingDiverged", "RankFailure"):
            raise
        print(f"mdc: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
