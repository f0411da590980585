"""Launching the app: which run it opens on, and :func:`serve` (the CLI verb ``mdc app``), which builds the
:func:`mdc_app.layout.build_app` Blocks and serves them on 127.0.0.1 until Ctrl-C or SIGTERM, then deletes the app's
temporary files. The shipped model (:mod:`mdc_workbench.export.shipped`) is always in the run menu, and the default
run when nothing was trained yet.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gradio as gr

from mdc_core.factory import load_model
from mdc_workbench.export.shipped import SHIPPED_DIR, SHIPPED_LABEL, load_shipped

from . import explore
from .callbacks import MAX_UPLOAD_BYTES
from .layout import PAGE_CSS, build_app
from .ports import check_port_free, port_message

DEFAULT_ROOT = "."  # run folders under it (4 levels deep, hidden folders skipped) are offered in the run menu
DEMO_METRICS = "papermill_runs/cpu_demo/01_pretraining/metrics.json"  # names the model `make demo` trains
DEFAULT_RUN = "outputs/demo/run"  # the run `mdc demo` trains


def default_run() -> str:
    """The run the app opens without ``--run``: the MDC model of `make demo`'s notebook 01 when that plan has
    run, else the run of `mdc demo` when it exists, else the small model shipped with the repository
    (:mod:`mdc_workbench.export.shipped`), so that the app opens on a trained captioner straight after set-up."""
    try:
        run_dir = json.loads(Path(DEMO_METRICS).read_text())["run_dir"]
    except (OSError, ValueError, KeyError):
        run_dir = ""
    if run_dir and Path(run_dir).is_dir():
        return run_dir
    return DEFAULT_RUN if Path(DEFAULT_RUN).is_dir() else str(SHIPPED_DIR)


THEME = gr.themes.Default(primary_hue="orange")
LAUNCH_KW: dict[str, Any] = {"max_file_size": MAX_UPLOAD_BYTES, "theme": THEME, "show_error": False, "css": PAGE_CSS}


def serve(run: str | Path | None = None, *, root: str | Path | None = DEFAULT_ROOT, host: str = "127.0.0.1",
          port: int | None = None, share: bool = False, block: bool = True) -> gr.Blocks:
    """Load `run` (default: :func:`default_run`), build the app (the shipped model is in its run menu too) and
    launch it on `host` (loopback unless told otherwise). With `block`, serve until Ctrl-C or SIGTERM, then delete
    the app's temporary files. A port in use is a ValueError that says so."""
    if port is not None:
        check_port_free(host, port)  # before minutes of loading: a port in use is known at once
    run = str(run or default_run())
    shipped = SHIPPED_DIR.resolve()
    models: dict[str, tuple[Any, ...]] = {}
    if Path(run).resolve() == shipped:
        default = SHIPPED_LABEL
    else:
        default = str(Path(run).resolve())
        models[default] = (*load_model(run), default)
    if (shipped / "model.safetensors").is_file():
        models[SHIPPED_LABEL] = (*load_shipped(), shipped)
    else:
        load_shipped()  # the default run is the shipped model and it is missing: say so
    _gradio_files_in_our_temp_folder()
    demo = build_app(models, root=root if root and Path(root).is_dir() else None, default=default)
    demo.queue(default_concurrency_limit=4)
    warnings.filterwarnings("ignore", message=GRADIO_422_WARNING)  # a StarletteDeprecationWarning (a UserWarning)
    try:
        with _sigterm_stops(block):
            demo.launch(server_name=host, server_port=port, share=share, prevent_thread_lock=True, quiet=True,
                        **LAUNCH_KW)
            print(console_text(demo.local_url, share), flush=True)
            if block:
                demo.block_thread()  # until Ctrl-C or SIGTERM
    except OSError as err:
        if "port" not in str(err).lower():
            raise
        raise ValueError(port_message(host, port)) from None
    finally:
        if block:
            explore.cleanup_temp()
    return demo


def console_text(local_url: str, share: bool) -> str:
    """What `serve` prints once the app is up (gradio's own lines are silenced: they advise ``share=True`` in
    ``launch()``, a call the user never writes): the local URL, the API page, and how to get a public link."""
    lines = [f"* Running on local URL:  {local_url}",
             f"* API (gradio_client, named parameters): {local_url.rstrip('/')}/?view=api"]
    if not share:
        lines.append("* To create a public link, start it with `mdc app --share` (a gradio.live tunnel: anyone with "
                     "the link can use the app)")
    return "\n".join(lines)


_OWN_GRADIO_DIR = ""  # the GRADIO_TEMP_DIR this process set (inside the app's temporary folder)


def _gradio_files_in_our_temp_folder() -> None:
    """Unless the user chose GRADIO_TEMP_DIR, gradio keeps its copies of uploads and downloads inside the app's
    ``mdc-app-*`` folder, so that they are deleted with it when the app stops."""
    global _OWN_GRADIO_DIR
    if os.environ.get("GRADIO_TEMP_DIR", "") in ("", _OWN_GRADIO_DIR):
        _OWN_GRADIO_DIR = os.environ["GRADIO_TEMP_DIR"] = str(explore.temp_folder() / "gradio")


# gradio <= 6.19 reads starlette's deprecated HTTP_422 constant on every queued request (gradio-app/gradio#13548)
GRADIO_422_WARNING = r"'HTTP_422_UNPROCESSABLE_ENTITY' is deprecated"


@contextlib.contextmanager
def _sigterm_stops(active: bool) -> Iterator[None]:
    """While serving in the main thread, SIGTERM stops the app as Ctrl-C does (gradio closes its server and deletes
    its temporary files, and so does :func:`serve`) instead of killing the process on the spot."""
    if not active or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
