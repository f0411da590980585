"""The probe feature of each architecture (torch- and sklearn-free, so ``mdc export`` reads it without the [eval]
extra): GAP over the patch tokens for captioners (the paper's choice), the CLS token for CLIP. The probes
(:mod:`mdc_workbench.eval.probe_data`) and the exported encoders (:mod:`mdc_workbench.export.encoder_io`: timm's
pooling that equals this feature) both read it here.
"""

from __future__ import annotations

from mdc_core.registry import objective_spec

PROBE_POOL: dict[str, str] = {"captioner": "gap", "clip": "cls"}


def probe_pool(objective: str) -> str:
    """The pooling (``"gap"`` or ``"cls"``) that gives the probe feature of a run with this objective."""
    return PROBE_POOL[objective_spec(objective).model]
