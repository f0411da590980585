"""mdc_core: masked diffusion captioning (Feng, Wei, Owens 2025), the method and its training loop.

This package trains and samples a captioner and imports nothing of the workbench (:mod:`mdc_workbench`:
evaluation, evidence, notebooks and plans, benchmarks, export, MC-Diffusion, the ``mdc`` command line), as
``open_clip`` imports nothing of ``open_clip_train``.

**A reader's path.** Start with the lesson (``notebooks/00_masked_diffusion_captioning.ipynb``), then:
:mod:`~mdc_core.registry` (the objective table: MDC, its baselines, ARC, CLIP), :mod:`~mdc_core.schedule` (their
noise processes) and :mod:`~mdc_core.objectives` (their losses) -> :mod:`~mdc_core.model` (timm ViT encoder via
:mod:`~mdc_core.encoders` + cross-attention text decoder) -> :mod:`~mdc_core.sampler` (unmasking, infilling
prompts) and :mod:`~mdc_core.scoring` (likelihoods, ``--length auto``) -> :mod:`~mdc_core.train` (the loop, read
top to bottom: start or resume, then read -> step -> log / checkpoint / stop), with the run's bookkeeping beside
it: :mod:`~mdc_core.run_folder` (the folder: start or resume, the data fingerprint, restore) and
:mod:`~mdc_core.run_state` (what the run knows about itself: its train state and records, and the hooks that log
them). Around them: :mod:`~mdc_core.config` (typed sections), :mod:`~mdc_core.tokenizer`,
:mod:`~mdc_core.factory` (objective -> model), :mod:`~mdc_core.clip_model` (the CLIP baseline),
:mod:`~mdc_core.ar_decode` (ARC decoding), :mod:`mdc_core.data` (the readers), :mod:`~mdc_core.loss_step` (a
micro-batch's forward as the step runs it), :mod:`~mdc_core.checkpoint` (written, verified, loaded without
trusting a file), :mod:`~mdc_core.runlock` (one writer per folder), :mod:`~mdc_core.distributed`,
:mod:`~mdc_core.precision`.

Export formats (a trained encoder for timm, ``from_pretrained``) are the workbench's (:mod:`mdc_workbench.export`).
"""

__version__ = "0.1.0"
