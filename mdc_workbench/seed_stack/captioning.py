"""Captioning of a seed stack's members (paper Sec. 4.2, Table 3), one read of the test images for all (issue 63,
item 3).

:func:`captioning_members` gives member k the result :func:`mdc_workbench.eval.captioning.captioning` gives the k-th
run of every stack (its captions, metrics and per-image items, so :func:`~mdc_workbench.eval.captioning.table3` of
it is the solo run's table): the test set is loaded once, each chunk of images read and normalised once per stack,
encoded for every member (mode ``each``: the members' own ``encode_image`` one after another; ``vmap``: one
vmapped encoder forward over the stacked weights, on the CPU under the math attention), then decoded per member
with the solo decoders (:func:`~mdc_workbench.eval.captioning.decode_chunk`). In ``each`` member k's captions are
its solo run's to the token.

What vmap cannot carry, so the decoding runs per member: the unmasking loop of :func:`mdc_core.sampler.sample`
reads the host to size and stop itself (``free = int((~fixed).sum(dim=1).max())`` for its number of steps, ``if not
bool(masked.any()): break`` when every row is finished), and each step scores only the masked positions
(``model.decode(..., select=masked)``, a boolean mask whose count differs per member, then ``masked_scatter``):
data-dependent shapes and control flow; ARC's :func:`mdc_core.ar_decode.greedy` stops when every row has written
``<eot>`` (``if bool(done.all())``) and its beam search reads its candidates on the host (``.tolist()``). A
vmapped sampler would be a second copy of those loops with fixed step counts and full-length logits.
Fine-tuning is a training run per member (``mdc train --members K`` stacks it); caption fine-tuned members here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mdc_core.config import RunConfig
from mdc_core.tokenizer import CaptionTokenizer
from mdc_workbench.eval.caption_metrics import ALL_METRICS, MeteorSession
from mdc_workbench.eval.captioning import (
    AUTO_RANGE,
    PAPER_BEAM,
    PAPER_LENGTHS,
    CaptionItem,
    arc_first,
    arc_lengths_of,
    caption_test_set,
    captioning_table,
    chunk_pixels,
    decode_chunk,
    decoded_empty,
    parse_lengths,
    plan_runs,
    scored_results,
    target_lengths,
)

from .claim import stack_mode
from .stacked import Encode, check_members, stack_models, vmap_members


def captioning_members(stacks: Sequence[Sequence[str | Path]], data: str | Path, *,
                       lengths: Sequence[int | str] = PAPER_LENGTHS, beam: int = PAPER_BEAM, limit: int | None = None,
                       metrics: Sequence[str] = ALL_METRICS, batch_size: int = 32, max_length: int | None = None,
                       device: str = "cpu", images: str | Path | None = None, auto_range: str = AUTO_RANGE,
                       mode: str = "auto") -> list[dict[str, Any]]:
    """Caption the test split of `data` with every member of every stack (module docstring).

    Args:
        stacks: stacks of K member run folders each, one objective per stack (e.g. the MDC members and the ARC
            members of a seed stack); member k of every stack is one seed's run.
        data, lengths, beam, limit, metrics, batch_size, max_length, device, images, auto_range: as for
            :func:`~mdc_workbench.eval.captioning.captioning` (no fine-tuning).
        mode: ``each``, ``vmap`` or ``auto`` (each on the CPU, vmap elsewhere): how the members' encoders run.
    Returns, per member k, what ``captioning([stack[k] for stack in stacks], data, ...)`` returns (the decoding
    ``seconds`` aside: a timing).
    """
    stacks = [list(s) for s in stacks]
    sizes = {len(s) for s in stacks}
    if not stacks or len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"give stacks of one number of members (>= 1) each; got sizes {sorted(sizes)}")
    members = sizes.pop()
    mode = stack_mode(mode, device)
    lengths = parse_lengths(lengths)
    plans = [plan_runs([s[k] for s in stacks], lengths, beam) for k in range(members)]  # the solo's checks
    items = caption_test_set(data, limit, str(images) if images else None)
    references = {it.key: list(it.references) for it in items}
    per_plan: list[dict[int, list[dict[str, Any]]]] = [{} for _ in range(members)]
    arc: list[list[int] | None] = [None] * members
    medians: list[int | None] = [None] * members
    with MeteorSession() if "METEOR" in metrics else contextlib.nullcontext():
        for i in arc_first(plans[0]):
            decoders = plans[0][i][1]
            models, cfgs = load_stack(stacks[i], device)
            lens = [target_lengths(items, cfg, arc[k]) for k, cfg in enumerate(cfgs)]
            decoded = caption_stack(models, cfgs[0], items, decoders, lens, batch_size=batch_size,
                                    max_length=max_length, auto_range=auto_range, mode=mode)
            for k, cfg in enumerate(cfgs):
                if arc[k] is None:  # member k's ARC sets member k's matched length
                    arc[k] = arc_lengths_of(decoded[k], decoders, items)
                medians[k] = lens[k][1]
                per_plan[k][i] = scored_results(stacks[i][k], None, cfg, decoded[k], references, metrics=metrics,
                                                median=lens[k][1], auto_range=auto_range)
    out = []
    for k in range(members):
        results = [r for i in range(len(stacks)) for r in per_plan[k][i]]
        out.append({"data": str(data), "n_images": len(items), "finetune_steps": 0, "median_length": medians[k],
                    "results": results, "table": captioning_table(results)})
    return out


def load_stack(runs: Sequence[str | Path], device: str) -> tuple[list[torch.nn.Module], list[RunConfig]]:
    """The members' models (eval mode) and configs; ValueError unless they share one architecture and objective."""
    from mdc_core.factory import load_model

    loaded = [load_model(run, device=device) for run in runs]
    models, cfgs = [m.eval() for m, _ in loaded], [c for _, c in loaded]
    check_members(models)
    if any(c.objective != cfgs[0].objective or c.model != cfgs[0].model for c in cfgs):
        raise ValueError(f"the stack {[str(r) for r in runs]} mixes objectives or model configs: one run config "
                         "(but the seed) per stack")
    return models, cfgs


@torch.no_grad()
def caption_stack(models: Sequence[torch.nn.Module], cfg: RunConfig, items: Sequence[CaptionItem],
                  decoders: Sequence[str], lens: Sequence[tuple[list[int], int, list[int] | None]], *,
                  batch_size: int = 32, max_length: int | None = None, auto_range: str = AUTO_RANGE,
                  mode: str = "each") -> list[dict[str, dict[str, Any]]]:
    """Every member's :func:`~mdc_workbench.eval.captioning.caption_items` result: each chunk of images read once,
    encoded for all members (`mode` ``each`` or ``vmap``), decoded per member; `lens[k]`: member k's
    :func:`~mdc_workbench.eval.captioning.target_lengths`."""
    if mode not in ("each", "vmap"):
        raise ValueError(f"caption_stack mode {mode!r}: choose each or vmap")
    tok = CaptionTokenizer(cfg.model.context_length)
    device = next(models[0].parameters()).device
    stacked = stack_models(models).eval() if mode == "vmap" else None
    out = [decoded_empty(decoders) for _ in models]
    for start in range(0, len(items), batch_size):
        chunk = items[start:start + batch_size]
        pixels = chunk_pixels(chunk, cfg.model.image_size).to(device)  # (B, 3, S, S): one read for all members
        if stacked is None:
            image_tokens = [m.encode_image(pixels) for m in models]  # (B, M, D) each, the solo's call
        else:
            image_tokens = vmap_members(Encode(stacked), stacked, pixels, in_dims=(None,)).unbind(0)
        for k, model in enumerate(models):
            targets, median, arc = lens[k]
            decode_chunk(model, image_tokens[k], chunk, start, decoders, out[k], tok, max_length=max_length,
                         lengths=targets, median=median, auto_range=auto_range, arc_lengths=arc)
    return out
