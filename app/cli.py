"""``mdc app``: the Gradio app (watch a caption being unmasked) on 127.0.0.1.

The app registers this verb group with the command line itself, through the entry point group
``mdc_workbench.verbs`` (pyproject.toml), so that no module of the workbench imports the app. The app is imported
when ``mdc app`` runs, never when the parser is built: this module imports neither gradio nor torch, and
:data:`PRELOAD` names what ``mdc app`` imports before it runs (torch and gradio, in the command line's interruptible
import phase; see :mod:`mdc_workbench.cli.main`).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from mdc_workbench.cli.common import MissingExtra

APP_EXTRA = ("gradio", "gradio_client", "matplotlib")  # what the [app] extra installs (pyproject.toml)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    app = sub.add_parser("app", help="the gradio app: watch a caption being unmasked (binds 127.0.0.1)")
    app.add_argument("--run", help="run folder selected at start (default: the MDC model of `make demo`, "
                     "else outputs/demo/run of `mdc demo`, else the model shipped in mdc_core/pretrained/)")
    app.add_argument("--root", default=".", help="run folders under it (4 levels deep) are offered in the run menu")
    app.add_argument("--host", default="127.0.0.1", help="interface to bind (other than loopback: on purpose only)")
    app.add_argument("--port", type=int, help="port (default: gradio's first free one from 7860)")
    app.add_argument("--share", action="store_true", help="also open a public gradio.live link (off by default)")


def check_app(args: argparse.Namespace) -> None:
    """What ``mdc app`` can tell before importing torch and gradio (tens of seconds on a busy machine): the [app]
    extra not installed, a missing --root, a --port in use."""
    missing = [name for name in APP_EXTRA if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(f"mdc app needs {missing[0]}, which the [app] extra installs ({', '.join(missing)} not "
                           "installed): pip install -c constraints.txt -e \".[app]\" in the workbench's checkout "
                           "(make setup installs every extra but [lab])")
    from pathlib import Path
    if not Path(args.root).is_dir():
        raise FileNotFoundError(f"--root {args.root} is not a folder (the run menu offers the run folders under it)")
    if args.port is not None:
        from .ports import check_port_free
        check_port_free(args.host, args.port)


def cmd_app(args: argparse.Namespace) -> None:
    from .launch import serve
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"mdc app: binding {args.host}: anyone who can reach this machine can use the app", file=sys.stderr)
    serve(args.run, root=args.root, host=args.host, port=args.port, share=args.share)


HANDLERS = {"app": cmd_app}
CHECKS = {"app": check_app}  # run before the imports of PRELOAD (mdc_workbench.cli.main)
PRELOAD = {"app": ("mdc_core.train", "mdc_app.layout")}  # torch, torchvision, timm; gradio
