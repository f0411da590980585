"""mdc_core: masked diffusion captioning (Feng, Wei, Owens 2025) as a small, typed workbench.

**The core** (this top level and :mod:`mdc_core.data`) trains and samples a captioner and imports no extension.
Reading order: :mod:`~mdc_core.config` -> :mod:`~mdc_core.tokenizer` -> :mod:`~mdc_core.encoders` ->
:mod:`~mdc_core.model` -> :mod:`~mdc_core.objectives` -> :mod:`~mdc_core.sampler` -> :mod:`~mdc_core.scoring` ->
:mod:`~mdc_core.train`, with :mod:`~mdc_core.checkpoint`, :mod:`~mdc_core.distributed`, :mod:`~mdc_core.factory`
(objective -> model), :mod:`~mdc_core.clip_model` (the CLIP baseline), :mod:`~mdc_core.ar_decode` (ARC decoding)
and :mod:`~mdc_core.auto_length` (``--length auto``), :mod:`~mdc_core.infill` (prompts with fixed words and their
conditional scores).

**Extensions** (subpackages that build on the core):

* :mod:`mdc_core.eval`: evaluations (probes, compositionality, captioning metrics, position signal, ...).
* :mod:`mdc_core.masked_conditional`: MC-Diffusion (D3PM, VQ image tokens, guidance, CLIPScore, the sweep).
* :mod:`mdc_core.workbench`: notebook helpers, plans of notebooks run by papermill, summaries, the paper's numbers,
  trajectory replay, attention maps and GIFs (:mod:`~mdc_core.workbench.animation`).
* :mod:`mdc_core.bench`: speed benchmarks.
* :mod:`mdc_core.cli`: the ``mdc`` command line.
"""

__version__ = "0.1.0"
