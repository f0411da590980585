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

**Downstream code** takes a trained encoder with ``encoder, preprocess = mdc_core.load_encoder(path)``
(:mod:`~mdc_core.encoder_io`; ``mdc export`` writes the folders it reads). It resolves on first use, so
``import mdc_core`` imports no torch.
"""

__version__ = "0.1.0"
__all__ = ["load_encoder"]


def __getattr__(name: str):
    if name == "load_encoder":  # PEP 562: imported on first use
        from .encoder_io import load_encoder
        return load_encoder
    raise AttributeError(f"module 'mdc_core' has no attribute {name!r}")
