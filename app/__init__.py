"""The MDC app (gradio), installed as ``mdc_app`` from the ``app/`` folder: ``build_app(models) -> gr.Blocks``; run
it with ``mdc app --run RUN``.

``mdc_app.render`` (captions, tables) imports without gradio; ``build_app``/``serve`` import it on first use. Analytics
and telemetry are switched off here, before any submodule imports gradio (no network access is needed).
"""

import os
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # set before any app module imports gradio: no telemetry
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

__all__ = ["build_app", "serve"]


def __getattr__(name: str) -> Any:
    if name == "build_app":
        from .layout import build_app
        return build_app
    if name == "serve":
        from .launch import serve
        return serve
    raise AttributeError(f"module 'mdc_app' has no attribute {name!r}")
