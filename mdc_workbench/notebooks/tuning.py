"""A small learning-rate sweep, so that no compared objective is handicapped by a learning rate shared with the
others: each objective is trained at each learning rate (one training seed, cached like every notebook model) and
gets the one with the lowest loss of its own objective on the **validation** split (never the test split, which
the comparisons report). Losses are compared only within an objective (an ARC loss and an MDC bound are not on
one scale), each under the same fixed noise draws for every learning rate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mdc_workbench.runs.progress import report, track


def validation_loss(model: Any, cfg: Any, *, split: str = "val", limit: int = 512, batch_size: int = 64,
                    draws: int = 4, seed: int = 0) -> float:
    """Mean loss of `model`'s objective over the first `limit` images of `split` of its data, each batch under
    `draws` fixed noise draws (the same for every model with this objective). Captions with a word outside a
    corpus-vocabulary model's tables are left out (models of one objective trained on one data set share them)."""
    import torch

    from mdc_core.data import build_loader
    from mdc_core.objectives import compute_loss
    from mdc_core.tokenizer import CaptionTokenizer

    tok = CaptionTokenizer(cfg.model.context_length)
    device = next(model.parameters()).device
    total, count, seen = 0.0, 0, 0
    model.eval()
    loader = build_loader(cfg.data, split=split, image_size=cfg.model.image_size, batch_size=batch_size,
                          shuffle=False, drop_last=False)
    with torch.no_grad():
        for batch in loader:
            if seen >= limit:
                break
            images, captions = batch["image"][: limit - seen], batch["caption"][: limit - seen]
            tokens, _ = tok.tokenize_batch(captions)
            known = _in_vocabulary(model, tokens)  # a corpus-vocabulary model cannot score unseen words
            if not bool(known.all()):
                images, tokens = images[known], tokens[known]
                captions = [c for c, k in zip(captions, known.tolist(), strict=True) if k]
                if not captions:
                    continue
            for d in range(draws):
                gen = torch.Generator(device=device).manual_seed(seed + 1000 * seen + d)
                loss = compute_loss(model, images.to(device), tokens.to(device), cfg.objective, gen).loss
                total += float(loss) * len(captions)
                count += len(captions)
            seen += len(captions)
    if count == 0:
        raise ValueError(f"the {split} split of {cfg.data.path} holds no image to score the learning rates on")
    return total / count


def _in_vocabulary(model: Any, tokens: Any) -> Any:
    """(B,) bool: captions whose every token has a row in the model's input and output tables (all True for a
    model with the full vocabulary)."""
    import torch

    from mdc_core.tokenizer import PAD_ID, SOT_ID

    ok = torch.ones(tokens.shape[0], dtype=torch.bool)
    targets = (tokens != PAD_ID) & (tokens != SOT_ID)  # what the output head predicts: caption tokens and <eot>
    for name, where in (("input_index", torch.ones_like(targets)), ("output_index", targets)):
        index = getattr(model, name, None)
        if index is not None:
            ok &= ((index.cpu()[tokens] >= 0) | ~where).all(dim=1)
    return ok


def best_learning_rates(losses: Mapping[str, Mapping[float, float]]) -> dict[str, float]:
    """{objective: {lr: validation loss}} -> {objective: the lr of the lowest loss} (the smaller lr on a tie)."""
    return {obj: min(per_lr, key=lambda lr: (per_lr[lr], lr)) for obj, per_lr in losses.items() if per_lr}


def lr_sweep(objectives: Sequence[str], lrs: Sequence[float], make_config: Callable[[str, float], Any],
             models_dir: str | Path, *, limit: int = 512) -> dict[str, Any]:
    """Train each objective at each of `lrs` (``make_config(objective, lr)`` gives the run's config), score each
    on the validation split (:func:`validation_loss`), and pick the best per objective.

    Returns ``{"losses": {objective: {lr: loss}}, "best": {objective: lr}, "runs": {objective: {lr: folder}}}``
    and a ``table`` for ``metrics.json`` (rows objective, columns ``val loss @ lr=...``; no verdict)."""
    from mdc_workbench.notebooks import notebook as wb

    if not lrs or any(float(lr) <= 0 for lr in lrs):
        raise ValueError(f"learning rates must be positive numbers; got {list(lrs)}")
    losses: dict[str, dict[float, float]] = {}
    runs: dict[str, dict[float, str]] = {}
    for obj in objectives:
        for lr in track([float(x) for x in lrs], f"lr sweep ({obj})"):
            model, cfg, run = wb.train_cached(make_config(obj, lr), models_dir)
            report(stage=f"validation loss: {obj} at lr {lr:g}")
            losses.setdefault(obj, {})[lr] = validation_loss(model, cfg, limit=limit)
            runs.setdefault(obj, {})[lr] = str(run)
    best = best_learning_rates(losses)
    table = {"metric": f"learning-rate sweep: each objective's own loss on the validation split ({limit} images, "
                       "fixed noise draws; lower is better, compared within an objective only); best: "
                       + ", ".join(f"{o} {lr:g}" for o, lr in best.items()),
             "values": {o: {f"val loss @ lr={lr:g}": v for lr, v in per.items()} for o, per in losses.items()}}
    return {"losses": losses, "best": best, "runs": runs, "table": table}
