"""The MDC app (gradio): ``build_app(models) -> gr.Blocks``; run it with ``mdc app --run RUN``.

``app.render`` (captions, tables) imports without gradio; ``build_app``/``serve`` import it on first use. Analytics
and telemetry are switched off here, before any submodule imports gradio (no network access is needed).
"""

import os
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # set before any app module imports gradio: no telemetry
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

__all__ = ["build_app", "serve"]


def __getattr__(name: str) -> Any:
    if name == "build_app":
        from app import mdc_app
        return mdc_app.build_app
    if name == "serve":
        from app import launch
        return launch.serve
    raise AttributeError(f"module 'app' has no attribute {name!r}")
