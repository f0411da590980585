"""mdc_core: masked diffusion captioning (Feng, Wei, Owens 2025), the method and its training loop.

This package trains and samples a captioner and imports nothing of the workbench (:mod:`mdc_workbench`:
evaluation, evidence, notebooks and plans, benchmarks, export, MC-Diffusion, the ``mdc`` command line), as
``open_clip`` imports nothing of ``open_clip_train``.

**A reader's path.** Start with the lesson (``notebooks/00_masked_diffusion_captioning.ipynb``), then:
:mod:`~mdc_core.registry` (the objective table and its noise schedules) and :mod:`~mdc_core.objectives` (the
losses) -> :mod:`~mdc_core.model` (timm image encoder + cross-attention text decoder) and :mod:`~mdc_core.factory`
(objective -> model, the CLIP baseline, ``load_model``) -> :mod:`~mdc_core.sampler` (unmasking, precision) and
:mod:`~mdc_core.scoring` (likelihoods, ``--length auto``), :mod:`~mdc_core.ar_decode` (ARC decoding) ->
:mod:`~mdc_core.train` (the loop, read top to bottom) with :mod:`~mdc_core.loss_step` (a micro-batch's forward)
and the run's bookkeeping beside it: :mod:`~mdc_core.run_folder` (start or resume, the data fingerprint, restore),
:mod:`~mdc_core.run_state` (train state, records, hooks), :mod:`~mdc_core.runlock` (one writer per folder),
:mod:`~mdc_core.checkpoint` (written and verified without trusting a file), :mod:`~mdc_core.distributed`. Around
them: :mod:`~mdc_core.config` (typed sections), :mod:`~mdc_core.tokenizer` (with infilling prompts) and the readers
:mod:`~mdc_core.data`, :mod:`~mdc_core.sources`, :mod:`~mdc_core.transforms`.
"""

__version__ = "0.1.0"
