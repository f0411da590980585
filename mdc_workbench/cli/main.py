"""Command line ``mdc`` (also ``python -m mdc_workbench``): the parser assembled from one module per verb group.

==========================  ===============================================================
``mdc data ...``            :mod:`mdc_workbench.cli.data`
``mdc train | demo | presets``  :mod:`mdc_workbench.cli.train`
``mdc sample | score``      :mod:`mdc_workbench.cli.sample`
``mdc eval ... | probe``    :mod:`mdc_workbench.cli.evaluate`
``mdc vqvae ...``           :mod:`mdc_workbench.cli.masked_conditional` (MC-Diffusion)
``mdc bench``               :mod:`mdc_workbench.cli.bench`
``mdc runs``                :mod:`mdc_workbench.cli.runs`
``mdc export``              :mod:`mdc_workbench.cli.export`
``mdc app``                 ``mdc_app.cli``, registered by the app (entry point group ``mdc_workbench.verbs``)
==========================  ===============================================================

A verb group is a module with ``add_parsers(sub)``, ``HANDLERS`` (verb -> function) and optionally ``CHECKS`` (what
a verb refuses before the heavy imports) and ``PRELOAD`` (those imports); groups outside the workbench register
under the entry point group :data:`VERB_GROUPS` (:func:`groups`), so the workbench imports none of them.
Every verb is a thin wrapper: it parses arguments, calls the library, prints a result. The shared flags come
from :mod:`mdc_workbench.cli.common`. Errors a user can fix (missing files, bad config keys, unreadable images) print
one line ``mdc: error: ...`` and exit with 2; a full disk is one line and exit 1; Ctrl-C at any moment (even
while torch is being imported, and also when SIGINT was inherited as ignored) is ``mdc: interrupted`` and exit 130
(SIGTERM: ``mdc: interrupted by SIGTERM``, 143). Building the parser imports no torch, so
``mdc --help`` answers at once (``tests/workbench/test_cli_reliability.py`` checks it); every help shows the flags'
defaults
(:class:`DefaultsFormatter`), ``mdc --version`` the package version. Progress bars written into a log rather than a
terminal redraw at most every 30 s (:func:`_progress_throttled_when_logged`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import importlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from types import ModuleType

from mdc_workbench.cli import bench, data, evaluate, export, masked_conditional, runs, sample, train
from mdc_workbench.cli.checks import check_numeric_args
from mdc_workbench.cli.common import USER_ERRORS, Parser, missing_extra

BUILT_IN = (data, train, sample, evaluate, export, runs, bench, masked_conditional)
VERB_GROUPS = "mdc_workbench.verbs"  # entry point group of verb groups from outside the workbench (the app's `mdc app`)


@functools.cache
def groups() -> tuple[ModuleType, ...]:
    """The workbench's verb groups, then those registered under the entry point group :data:`VERB_GROUPS` (in
    name order; pyproject.toml registers ``app = "mdc_app.cli"``). Loading one imports only its parser module."""
    from importlib.metadata import entry_points
    return BUILT_IN + tuple(ep.load() for ep in sorted(entry_points(group=VERB_GROUPS), key=lambda ep: ep.name))


class DefaultsFormatter(argparse.HelpFormatter):
    """argparse's ArgumentDefaultsHelpFormatter without its noise: a flag's help ends with its default unless the
    help already names one or there is none to show (None, False, an empty list: an absent flag)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (not action.option_strings or "default" in text.lower() or action.default is argparse.SUPPRESS
                or action.default in (None, False, [], ())):
            return text
        return text + " (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    from mdc_core import __version__
    parser = Parser(prog="mdc", description="Masked diffusion captioning workbench.")  # unknown flags named first
    parser.add_argument("--version", action="version", version=f"mdc {__version__} (mdc-workbench)")
    sub = parser.add_subparsers(dest="verb", required=True)
    for group in groups():
        group.add_parsers(sub)
    _show_defaults(parser)
    return parser


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Give `parser` and every verb and sub-verb under it :class:`DefaultsFormatter` (the verbs' modules build
    their parsers with argparse's default formatter)."""
    parser.formatter_class = DefaultsFormatter
    for action in parser._actions:  # argparse keeps its subparsers here; there is no public accessor
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _show_defaults(child)


LIGHT_VERBS = frozenset({"presets", "runs"})  # verbs that import no torch
DEFAULT_PRELOAD = ("mdc_core.train",)  # torch, torchvision, timm; a group's PRELOAD names other imports for a verb


def preload(verb: str) -> tuple[str, ...]:
    """The modules `verb` imports before it runs, while a Ctrl-C still exits at once (:func:`_exit_now`)."""
    if verb in LIGHT_VERBS:
        return ()
    return next((g.PRELOAD[verb] for g in groups() if verb in getattr(g, "PRELOAD", {})), DEFAULT_PRELOAD)


SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived while a verb ran (outside a training loop, which checkpoints instead)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupted(signum: int) -> str:
    return "mdc: interrupted" + ("" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}")


def _exit_now(signum: int, frame: object) -> None:
    """While a verb imports torch and its libraries: an exception raised inside torch's import (C++ callbacks)
    aborts the process, or is swallowed by the import machinery so that the command goes on; nothing has been
    written yet, so exiting at once loses nothing."""
    sys.stderr.write(_interrupted(signum) + "\n")
    os._exit(128 + signum)


def _raise(signum: int, frame: object) -> None:
    """Afterwards: an exception, so that each verb's cleanup runs (a run that could not start leaves no folder)."""
    raise Interrupted(signum)


@contextlib.contextmanager
def _signal_handling() -> Iterator[Callable[[Callable[[int, object], None]], None]]:
    """Own SIGINT and SIGTERM for the block, whatever the inherited disposition (a background job of a
    non-interactive shell starts with SIGINT ignored, and a Ctrl-C meant for it must not be lost); yields a function
    that sets the handler of both. The previous handlers come back at the end (``main`` is also called in-process)."""
    usable = threading.current_thread() is threading.main_thread()
    previous = {s: signal.getsignal(s) for s in SIGNALS} if usable else {}

    def use(handler: Callable[[int, object], None]) -> None:
        for s in previous:
            signal.signal(s, handler)
    try:
        yield use
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


OS_ERRORS = {  # errno -> what it means for the path it names
    errno.EROFS: "is on a read-only file system: write somewhere else",
    errno.EACCES: ": permission denied (this user may not read or write it)",
    errno.EPERM: ": operation not permitted (this user may not change it)",
    errno.EEXIST: "is in the way: a file is there where a folder is needed",
    errno.ENOTDIR: ": a part of this path is a file, not a folder",
    errno.EISDIR: "is a folder where a file is needed",
    errno.ENOENT: "does not exist",
}


def describe_os_error(err: OSError) -> str:
    """One line naming the path of an OSError the system raised (``[Errno 30] Read-only file system: 'x'`` ->
    ``x is on a read-only file system: write somewhere else``); a message written by mdc is kept as it is."""
    if not err.filename or not str(err).startswith("[Errno"):
        return str(err)
    path = f"{err.filename} -> {err.filename2}" if err.filename2 else str(err.filename)
    what = OS_ERRORS.get(err.errno, f": {(err.strerror or '').lower()}")
    return f"{path}{what}" if what.startswith(":") else f"{path} {what}"


def _format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    line: str | None = None) -> str:
    """``mdc: warning: ...`` on one line for the warnings mdc gives (UserWarning), the usual form for the rest."""
    if issubclass(category, UserWarning):
        return f"mdc: warning: {message}\n"
    return _PYTHON_FORMAT(message, category, filename, lineno, line)


_PYTHON_FORMAT = warnings.formatwarning


PROGRESS_INTERVAL_S = 30  # a progress bar written into a log (no terminal) redraws at most this often
THROTTLE = ("TQDM_MININTERVAL", "TQDM_MAXINTERVAL")  # tqdm's defaults, read from the environment when it is imported


@contextlib.contextmanager
def _progress_throttled_when_logged() -> Iterator[None]:
    """tqdm redraws a bar up to 10 times a second, each redraw a carriage-return line in a log (``make demo > log``
    grew to megabytes); when stderr is no terminal, at most every :data:`PROGRESS_INTERVAL_S` seconds. Set as
    tqdm's environment defaults, so that the processes a verb starts (notebook kernels, torchrun ranks) follow; a
    value the user set stays, and the environment is restored afterwards (``main`` is also called in-process)."""
    previous = {key: os.environ.get(key) for key in THROTTLE}
    if not sys.stderr.isatty():
        for key in THROTTLE:
            os.environ.setdefault(key, str(PROGRESS_INTERVAL_S))
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def main(argv: list[str] | None = None) -> int:
    warnings.formatwarning = _format_warning  # printing only: recorded warnings (pytest.warns) are unchanged
    try:
        with _progress_throttled_when_logged():  # before any verb imports tqdm
            return _main(argv)
    finally:
        warnings.formatwarning = _PYTHON_FORMAT


def _main(argv: list[str] | None) -> int:
    with _signal_handling() as use:
        use(_exit_now)
        try:
            return _run(argv, use)
        except KeyboardInterrupt as err:  # no import here: Ctrl-C may have cut one short
            use(_exit_now)  # another signal while this is printed: no traceback
            signum = getattr(err, "signum", signal.SIGINT)
            if isinstance(err, Interrupted) or not getattr(err, "signum", 0):
                print(_interrupted(signum), file=sys.stderr)
            else:  # TrainingInterrupted: a checkpoint was written; say where, and how to go on
                print(f"mdc: {err}; continue with the same command and --resume", file=sys.stderr)
            return 128 + signum  # the shell's convention for a process stopped by a signal


def _run(argv: list[str] | None, use: Callable[[Callable[[int, object], None]], None]) -> int:
    try:
        args = build_parser().parse_args(argv)
        handler = {verb: fn for group in groups() for verb, fn in group.HANDLERS.items()}[args.verb]
        check_numeric_args(args)  # e.g. --steps 0: an error, never the preset's default
        for group in groups():  # what a verb can refuse before the imports below (mdc app: a port in use)
            getattr(group, "CHECKS", {}).get(args.verb, lambda _: None)(args)
        for module in preload(args.verb):
            importlib.import_module(module)
        use(_raise)
        if getattr(args, "precision", None) is None:
            handler(args)
        else:  # --precision: the default of every sampling and scoring call the verb makes
            from mdc_core.sampler import default_inference_precision
            with default_inference_precision(args.precision):
                handler(args)
    except USER_ERRORS as err:
        print(f"mdc: error: {describe_os_error(err) if isinstance(err, OSError) else err}", file=sys.stderr)
        return 2
    except ImportError as err:  # an extra not installed (pip install . alone): which one, in one line
        verb = next((a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")), "")
        message = missing_extra(err, verb)
        if message is None:
            raise
        print(f"mdc: error: {message}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk anywhere (checkpoints say what they kept; see mdc_core.checkpoint)
        if err.errno == errno.EROFS:
            print(f"mdc: error: {describe_os_error(err)}", file=sys.stderr)
            return 2
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
