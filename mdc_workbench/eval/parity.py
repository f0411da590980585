"""Parity of the compared objectives: what one training step of each costs and supervises.

The paper compares objectives at equal steps and data; this table says what "equal" means per step:

- **parameters**: trainable parameters of the model (the image encoder is the same architecture for every
  objective; the text side differs: a decoder for the captioners, a text tower for CLIP);
- **FLOPs per step**: *measured* with :class:`torch.utils.flop_counter.FlopCounterMode` over the forward and
  backward pass of one training batch (matrix products, convolutions and attention; element-wise operations and
  the optimizer update are not counted), on real captions of the data;
- **supervised tokens per step**: the caption tokens that carry a loss term in one batch, measured from the
  objective's own masking (:func:`mdc_core.objectives.prepare_batch`, averaged over noise draws) beside their
  expectation: ARC predicts every caption token and ``<eot>`` (n + 1 per caption of n tokens), MDC masks each
  token with probability t ~ U[w_l, w_u] (expected (w_l + w_u) / 2 x n; 0.75 n at [0.5, 1]), BERT with the fixed
  ratio r, the parallel objective all n. CLIP supervises no token: its loss is over the B x B image-caption pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from mdc_core.config import ObjectiveConfig


def parameter_count(model: torch.nn.Module) -> int:
    """Trainable parameters of `model`."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def step_flops(loss_fn: Callable[[], torch.Tensor]) -> int:
    """FLOPs of one training step's forward and backward pass: `loss_fn()` runs the forward pass and returns the
    scalar loss, which is then back-propagated (counted by :class:`torch.utils.flop_counter.FlopCounterMode`).
    The gradients it leaves are not cleared."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        loss_fn().backward()
    return int(counter.get_total_flops())


def expected_supervised_tokens(lengths: Sequence[int], cfg: ObjectiveConfig) -> float:
    """Expected loss-carrying tokens of captions of `lengths` caption tokens (no ``<sot>``/``<eot>``) under
    objective `cfg` (module docstring); 0 for CLIP and for objectives that do not mask tokens (D3PM noises all)."""
    from mdc_core.objectives import objective_spec

    return objective_spec(cfg.name).expected_loss_terms(lengths, cfg)


def measured_supervised_tokens(tokens: torch.Tensor, cfg: ObjectiveConfig, output_index: torch.Tensor | None,
                               draws: int = 16, seed: int = 0) -> float:
    """Loss-carrying tokens of the batch `tokens` (B, L) under objective `cfg`, averaged over `draws` noise draws
    of :func:`~mdc_core.objectives.prepare_batch` (what the trainer feeds the loss)."""
    from mdc_core.objectives import objective_spec, prepare_batch

    spec = objective_spec(cfg.name)
    if spec.family == "contrastive" or not spec.prepared:
        return 0.0 if spec.family == "contrastive" else float("nan")
    total = 0
    for d in range(draws):
        gen = torch.Generator().manual_seed(seed + d)
        p = prepare_batch(tokens, cfg, gen, output_index=output_index)
        total += int(p.loss_mask.sum())
    return total / draws


def parity_row(model: torch.nn.Module, cfg: Any, images: torch.Tensor, captions: list[str],
               seed: int = 0) -> dict[str, float]:
    """One objective's row for a batch of `images` and `captions` (a training batch's size): parameters,
    FLOPs per step (fwd + bwd, measured), supervised tokens per step (measured and expected), and caption
    tokens per step (the data every objective reads)."""
    from mdc_core.objectives import compute_loss, maskable_positions
    from mdc_core.tokenizer import CaptionTokenizer

    tokens, _ = CaptionTokenizer(cfg.model.context_length).tokenize_batch(captions)
    lengths = maskable_positions(tokens).sum(dim=1).tolist()
    model.train()
    gen = torch.Generator().manual_seed(seed)
    flops = step_flops(lambda: compute_loss(model, images, tokens, cfg.objective, gen).loss)
    model.zero_grad(set_to_none=True)
    model.eval()
    out_index = getattr(model, "output_index", None)
    return {"M parameters": parameter_count(model) / 1e6, "GFLOPs / step": flops / 1e9,
            "supervised tokens / step": measured_supervised_tokens(tokens, cfg.objective, out_index, seed=seed),
            "expected supervised": expected_supervised_tokens(lengths, cfg.objective),
            "caption tokens / step": float(sum(lengths))}


def parity_table(runs: dict[str, Any], *, batch_size: int, split: str = "val", seed: int = 0) -> dict[str, Any]:
    """The parity table of trained runs ({label: run folder}) on one batch of `batch_size` images and captions of
    each run's data `split`: a ``metrics.json`` table (values only, no verdict)."""
    from mdc_core.data import build_loader
    from mdc_core.factory import load_model

    values: dict[str, dict[str, float]] = {}
    batch = None
    for label, run in runs.items():
        model, cfg = load_model(run, device="cpu")
        if batch is None:
            loader = build_loader(cfg.data, split=split, image_size=cfg.model.image_size, batch_size=batch_size,
                                  shuffle=False)
            batch = next(iter(loader))
        values[label] = parity_row(model, cfg, batch["image"], batch["caption"], seed=seed)
    return {"metric": f"per training step of batch {batch_size}: parameters, FLOPs (forward + backward, measured "
                      "with torch's FlopCounterMode: matmuls, convolutions, attention), loss-carrying caption "
                      "tokens (measured over 16 noise draws; expected from the objective), caption tokens read",
            "values": values}
