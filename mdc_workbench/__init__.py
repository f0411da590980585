"""mdc_workbench: everything around the method that :mod:`mdc_core` trains and samples.

``mdc_core`` is the model library and its training loop; this package builds on it and is never imported by it
(as ``open_clip_train`` builds on ``open_clip``):

* :mod:`mdc_workbench.eval`: evaluations and evidence (probes, compositionality, captioning metrics, the central
  claim, statistics with pre-declared verdicts, the paper's numbers).
* :mod:`mdc_workbench.runs`: batch runs and their verdicts (plans of notebooks run by papermill, the runner, the
  summaries with pre-declared claims, ``make gpu-check``).
* :mod:`mdc_workbench.viz`: trajectory replay, chips, heatmaps and animations (what the app and the notebooks share).
* :mod:`mdc_workbench.export`: encoder export with model cards, and the model shipped with the repository.
* :mod:`mdc_workbench.notebooks`: what the notebooks call (helpers, the lesson's figures, probe tables, exercises).
* :mod:`mdc_workbench.masked_conditional`: MC-Diffusion (D3PM, VQ image tokens, guidance, CLIPScore, the sweep); it
  registers its objective, encoders and config keys with :mod:`mdc_core.registry` through the entry point
  ``mdc_core.plugins``.
* :mod:`mdc_workbench.bench`: speed benchmarks against named peers, and the measurements behind single documents.
* :mod:`mdc_workbench.cli`: the ``mdc`` command line (``python -m mdc_workbench``); the app adds ``mdc app`` through
  the entry point group ``mdc_workbench.verbs``.
"""

__version__ = "0.1.0"
