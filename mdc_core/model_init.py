"""Where a run's model starts: freshly initialised (:func:`init_model`, with the corpus output vocabulary built from
the training captions when the config asks for one) or from another run's weights (:func:`init_from_weights`,
``train(..., init_from=RUN)``). Both return the model and the run's config as it must be saved."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import checkpoint as ckpt_io
from .config import RunConfig
from .data import iter_captions
from .factory import create_model
from .tokenizer import CaptionTokenizer, build_output_vocab


def init_model(cfg: RunConfig, progress: bool = False) -> tuple[torch.nn.Module, RunConfig]:
    """A freshly initialised model for the run `cfg` (a captioner, or CLIP for objective "clip"; built by
    :func:`mdc_core.factory.create_model`) and the run's config as it must be saved: with ``output_vocab="corpus"``
    the id table is built from the training captions and the returned config is a copy with its size in
    ``model.output_vocab_size`` (so ``config.json`` rebuilds the same shape); `cfg` itself is never changed."""
    if cfg.model.output_vocab != "corpus":
        return create_model(cfg, cfg.objective.name), cfg
    captions = tqdm(iter_captions(cfg.data, split="train"), desc="corpus vocabulary: reading the training captions",
                    unit=" captions", leave=False, delay=1.0, disable=not progress)  # shown when reading takes a while
    output_ids = build_output_vocab(captions, CaptionTokenizer(cfg.model.context_length))
    if progress:
        tqdm.write(f"corpus vocabulary: {len(output_ids)} token ids from {captions.n} training captions")
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, output_vocab_size=len(output_ids)))
    return create_model(cfg, cfg.objective.name, output_ids), cfg


def init_from_weights(cfg: RunConfig, source: str | Path) -> tuple[torch.nn.Module, RunConfig]:
    """A model for the run `cfg` holding the weights (not the EMA) of run or checkpoint folder `source`, and the
    run's config as it must be saved (a corpus head's size taken from `source` when `cfg` leaves it 0). Raises
    ``ValueError`` when `source`'s model differs from ``cfg.model`` (the encoder's ``pretrained`` settings aside:
    the weights replace them) or its weights do not fit `cfg`'s objective."""
    source_model, saved = ckpt_io.load_model(source)
    arch = cfg.model
    if arch.output_vocab == "corpus" and arch.output_vocab_size == 0:
        arch = dataclasses.replace(arch, output_vocab_size=saved.model.output_vocab_size)
    there, here = dataclasses.asdict(saved.model), dataclasses.asdict(arch)
    diffs = [f"model.{k} {there[k]!r} there, {here[k]!r} here" for k in here
             if k not in ("pretrained", "pretrained_path") and there.get(k) != here[k]]
    if diffs:
        raise ValueError(f"init_from {source}: its model differs from this run's ({'; '.join(diffs[:4])})")
    model = create_model(dataclasses.replace(arch, pretrained=False, pretrained_path=""), cfg.objective.name)
    try:
        model.load_state_dict(source_model.state_dict())
    except (RuntimeError, ValueError) as err:  # CLIPModel says ValueError
        raise ValueError(f"init_from {source}: the weights of its {saved.objective.name} model do not fit a "
                         f"{cfg.objective.name} model ({str(err).splitlines()[0][:160]})") from None
    return model, dataclasses.replace(cfg, model=arch)
