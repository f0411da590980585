"""mdc_workbench: everything around the method that :mod:`mdc_core` trains and samples.

``mdc_core`` is the model library and its training loop; this package builds on it and is never imported by it
(as ``open_clip_train`` builds on ``open_clip``):

* :mod:`mdc_workbench.eval`: evaluations and evidence (probes, compositionality, captioning metrics, the central
  claim, statistics with pre-declared verdicts, the paper's numbers).
* :mod:`mdc_workbench.notebooks`: notebook helpers, plans of notebooks run by papermill, their summaries, exercises,
  export with model cards, trajectory replay and animations.
* :mod:`mdc_workbench.masked_conditional`: MC-Diffusion (D3PM, VQ image tokens, guidance, CLIPScore, the sweep); it
  registers its objective, encoders and config keys with :mod:`mdc_core.registry` through the entry point
  ``mdc_core.plugins``.
* :mod:`mdc_workbench.bench`: speed benchmarks against named peers.
* :mod:`mdc_workbench.cli`: the ``mdc`` command line (``python -m mdc_workbench``).
"""

__version__ = "0.1.0"
