"""``mdc bench``: speed of training, captioning and scoring, against OpenCLIP CoCa, in one run.

:func:`run_bench` (:mod:`mdc_workbench.bench.run`) returns the JSON-ready report, :func:`format_report` its tables; the
rows live in :mod:`~mdc_workbench.bench.training`, :mod:`~mdc_workbench.bench.decoding` and the peer model in
:mod:`~mdc_workbench.bench.coca`; ``mdc bench step`` (the trainer's step by phase, and its host synchronisations) in
:mod:`~mdc_workbench.bench.step_phases`; :mod:`~mdc_workbench.cli.bench` is the command line. Imports are lazy so that
building the ``mdc`` parser does not load torch.

The measurements behind single documents run as modules (their results stay in ``benchmarks/`` and ``docs/``):
``python -m mdc_workbench.bench.fast_recipe`` (accuracy against CPU training time, docs/fast_recipe.md),
``python -m mdc_workbench.bench.probe_protocols`` (converged vs CLIP-benchmark probe, docs/evidence.md),
``python -m mdc_workbench.bench.central_claim_device_check`` (the central claim's measure on CPU vs CUDA) and
``python -m mdc_workbench.bench.precision_curves`` (fp32 vs bf16 loss curves).
"""

from __future__ import annotations

from typing import Any

__all__ = ["BenchConfig", "format_report", "run_bench"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from mdc_workbench.bench import core, run
        return getattr(core if name == "BenchConfig" else run, name)
    raise AttributeError(f"module 'mdc_workbench.bench' has no attribute {name!r}")
