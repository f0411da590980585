"""Fine-tuning a run before the captioning evaluation (paper Sec. 4.2; :mod:`mdc_workbench.eval.captioning`).

:func:`finetune` continues a run on a caption data set with :func:`mdc_core.train.train`: the run's own config with
``data.path`` set to the new data, a fresh optimizer and schedule of ``steps`` steps (warm-up cut to at most a tenth
of them), starting from the run's weights. The fine-tuned run is an ordinary run folder whose ``finetune_source.json``
records :func:`finetune_key` (the source run's weights, the data's fingerprint and the fine-tuning config): a complete
one of the same key is reused, an unfinished one resumed, a folder made from anything else never reused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mdc_core.config import RunConfig, apply_overrides
from mdc_core.sources import resolve_source
from mdc_core.tokenizer import CaptionTokenizer


def _has_splits(path: str, images: str | None = None) -> bool:
    """Whether `path` gives different train and test samples (Karpathy json, split folders); a plain COCO json
    or CSV gives the same rows for every split."""
    try:
        train, test = resolve_source(path, "auto", "train", images), resolve_source(path, "auto", "test", images)
    except FileNotFoundError:
        return False
    return (train.shards, [r["key"] for r in train.rows]) != (test.shards, [r["key"] for r in test.rows])


def _check_vocabulary(model: torch.nn.Module, cfg: RunConfig) -> None:
    """A corpus-vocabulary model can only be fine-tuned on captions made of its corpus words."""
    if not getattr(model, "restricted", False):
        return
    from mdc_core.data import iter_captions
    tok = CaptionTokenizer(cfg.model.context_length)
    known = set(model.output_ids.tolist())
    bad, n, words = 0, 0, set()
    for caption in iter_captions(cfg.data, split="train"):
        n += 1
        unknown = {i for i in tok.encode_text(caption) if i not in known}
        if unknown:
            bad += 1
            words.update(tok.token_string(i) for i in list(unknown)[:3])
    if bad:
        raise ValueError(f"the run's model has a corpus vocabulary of {len(known)} tokens (model.output_vocab="
                         f"'corpus'); {bad} of {n} fine-tuning captions use other tokens (e.g. "
                         f"{', '.join(sorted(words)[:8])}). Fine-tune a run trained with model.output_vocab=full")


FINETUNE_SOURCE = "finetune_source.json"  # in a fine-tuned run folder: what it was made from (finetune_key)


def finetune_key(run: str | Path, ft: RunConfig) -> dict[str, Any]:
    """What a fine-tune of `run` with config `ft` is made from, and its short ``key``: the SHA-256 of the source
    checkpoint's weights (its ``meta.json`` digest, verified on loading), the fine-tuning data's fingerprint
    (:func:`mdc_core.sources.data_fingerprint`) and `ft` without ``train.device`` (where it runs, not what)."""
    import hashlib

    from mdc_core.checkpoint import resolve_checkpoint
    from mdc_core.sources import data_fingerprint, file_sha256

    ckpt = resolve_checkpoint(run)
    try:
        weights = json.loads((ckpt / "meta.json").read_text())["sha256"]["model.safetensors"]
    except (OSError, ValueError, KeyError, TypeError):
        weights = file_sha256(ckpt / "model.safetensors")
    settings = ft.to_dict()
    settings["train"].pop("device", None)
    made_from = {"source_weights_sha256": weights, "data_fingerprint": data_fingerprint(ft.data),
                 "config": settings}
    digest = hashlib.sha256(json.dumps(made_from, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return {"key": digest, "source_run": str(Path(run).resolve()), "source_checkpoint": ckpt.name, **made_from}


def finetune(run: str | Path, data: str | Path, out: str | Path, steps: int, *, overrides: Sequence[str] = (),
             images: str | Path | None = None, progress: bool = True, key_in_name: bool = False) -> Path:
    """Fine-tune run `run` on `data` (its train split) for `steps` steps into run folder `out`; returns the folder.

    `overrides` are ``section.key=value`` strings applied after the fine-tuning settings (e.g.
    ``train.batch_size=32``, ``train.lr=1e-5``). The folder records :func:`finetune_key` in ``finetune_source.json``;
    a complete fine-tune of the same key is reused, an unfinished one resumed, and a folder that holds a run made
    from another source run, data or settings (or of unknown origin) is a ValueError. With `key_in_name`, the
    folder is ``<out>_<key>`` (what ``mdc eval captioning`` uses: each source gets its own folder).
    """
    from mdc_core import checkpoint as ckpt_io
    from mdc_core.factory import load_model
    from mdc_core.train import train
    if steps < 1:
        raise ValueError(f"fine-tuning steps must be >= 1, got {steps}")
    model, cfg = load_model(run)
    warmup = min(cfg.train.warmup_steps, steps // 10)
    ft = apply_overrides(cfg, [f"data.path={json.dumps(str(data))}", 'data.format="auto"', f"train.steps={steps}",
                               f"data.images={json.dumps(str(images or ''))}", 'data.path_as_given=""',
                               f"train.warmup_steps={warmup}", *overrides])
    ft.validate()
    made_from = finetune_key(run, ft)
    out = Path(out)
    if key_in_name:
        out = out.with_name(f"{out.name}_{made_from['key']}")
    _check_finetune_source(out, made_from)
    done = ckpt_io.latest_checkpoint(out)
    if done is not None and json.loads((done / "meta.json").read_text())["step"] >= steps:
        return out
    if done is None:
        resolve_source(str(data), "auto", "train", ft.data.images or None)  # fails before anything is written
        _check_vocabulary(model, ft)
    out.mkdir(parents=True, exist_ok=True)
    (out / FINETUNE_SOURCE).write_text(json.dumps(made_from, indent=1, sort_keys=True) + "\n")
    # a run that stopped before its first checkpoint starts over from the run's weights (init_from)
    train(ft, out, resume=done is not None or (out / "config.json").is_file(), init_from=run, progress=progress)
    return out


def _check_finetune_source(out: Path, made_from: dict[str, Any]) -> None:
    """ValueError unless `out` is empty or holds a fine-tune whose ``finetune_source.json`` has `made_from`'s key."""
    if not out.is_dir() or not any(out.iterdir()):
        return
    try:
        recorded = json.loads((out / FINETUNE_SOURCE).read_text())
    except (OSError, ValueError):
        recorded = None
    key = recorded.get("key") if isinstance(recorded, dict) else None
    if key != made_from["key"]:
        origin = (f"a fine-tune of {recorded.get('source_run')} (key {key})" if key else
                  f"a folder without a readable {FINETUNE_SOURCE}")
        raise ValueError(f"{out} holds {origin}, not a fine-tune of {made_from['source_run']} with these data and "
                         f"settings (key {made_from['key']}): pass another folder or delete it")


