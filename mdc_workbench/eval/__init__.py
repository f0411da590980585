"""Evaluations of trained runs: linear probes, compositionality, captioning metrics, position signal, decoding.

* :mod:`mdc_workbench.eval.probe`: :func:`linear_probe` (converged L-BFGS by default, or the CLIP-benchmark protocol)
  and :func:`cached_features`.
* :mod:`mdc_workbench.eval.caption_metrics`: :func:`caption_metrics` (BLEU, METEOR, ROUGE-L, CIDEr, SPICE via
  pycocoevalcap).

Both take plain tensors / strings; loading models and data is the caller's job.

Run-level evaluations (they load runs and data themselves; import the module to use them):

* :mod:`mdc_workbench.eval.compositionality` (+ :mod:`mdc_workbench.eval.composition_sets`): ``mdc eval
  compositionality``.
* :mod:`mdc_workbench.eval.captioning`: ``mdc eval captioning``.
* :mod:`mdc_workbench.eval.object_curve`: ``mdc eval objects`` (single-object accuracy at every checkpoint).
* :mod:`mdc_workbench.eval.central_claim`: ``mdc eval central-claim`` (the paper's central claim, both caption kinds,
  and its consequence for features); :mod:`mdc_workbench.eval.parallel_decoding`: ``mdc eval parallel-decoding``;
  :mod:`mdc_workbench.eval.probe_data`: ``mdc probe``.
* :mod:`mdc_workbench.eval.report`: the held-out caption report of ``mdc demo`` and notebook 01.
* :mod:`mdc_workbench.eval.repetition`: the repetition rate (a metric of ``mdc eval captioning``);
  :mod:`mdc_workbench.eval.remasking`: greedy vs remasking (``python -m mdc_workbench.eval.remasking``, notebook 05).
* :mod:`mdc_workbench.eval.budget_curve`: probe gain at several training budgets (checkpoints of one run per method);
  :mod:`mdc_workbench.eval.parity`: parameters, FLOPs and supervised tokens per training step (notebook 03, ``make
  evidence``).
Note: ``mdc_workbench.eval.caption_metrics`` names the function here; the module is
``sys.modules["mdc_workbench.eval.caption_metrics"]`` (or ``importlib.import_module``).

Torch-free (numpy/scipy): :mod:`mdc_workbench.eval.stats` (intervals, differences, verdicts),
:mod:`mdc_workbench.eval.claims` (the paper's ordering claims), :mod:`mdc_workbench.eval.variance` (the variance
budget of a deciding difference), :mod:`mdc_workbench.eval.power` (the seeds and test images a declared test needs),
:mod:`mdc_workbench.eval.items` (per-item results, ``items.npz``) and :mod:`mdc_workbench.eval.probe_tables`. The
probe's and the caption metrics' names below are imported on first use, so that importing these pulls neither torch
nor pycocoevalcap. :mod:`mdc_workbench.eval.recompute` rebuilds every table and verdict from per-item files (its
central-claim tables load torch); :mod:`mdc_workbench.eval.content_words` holds the central sentence's statistic.
"""

from __future__ import annotations

import importlib
from typing import Any

# imported on first use: the probe's names pull torch, the caption metrics' pycocoevalcap (the [eval] extra), which
# `mdc runs` and the evidence summary do not need (a GPU machine may run them without it)
_LAZY = {**dict.fromkeys(("CLIP_BENCHMARK_WD_GRID", "ProbeResult", "cached_features", "linear_probe"),
                         "mdc_workbench.eval.probe"),
         **dict.fromkeys(("ALL_METRICS", "score_captions", "simple_tokenize"), "mdc_workbench.eval.caption_metrics")}

__all__ = [
    "ALL_METRICS", "CLIP_BENCHMARK_WD_GRID", "ProbeResult", "cached_features", "score_captions", "linear_probe",
    "simple_tokenize",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'mdc_workbench.eval' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
