"""Caption a held-out split and check the captions against the embedded data's labels.

For single-object scenes of the embedded generator the right caption must name the object's colour and
shape; :func:`caption_report` measures how often greedy captions do, and keeps every caption for reading.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch
from tqdm.auto import tqdm

from mdc_core.config import DataConfig, SamplerConfig
from mdc_core.data import build_loader
from mdc_core.model import Captioner
from mdc_core.sampler import sample
from mdc_core.tokenizer import CaptionTokenizer


def names_object(caption: str, colour: str, shape: str) -> bool:
    """True if `caption` contains the colour word and the shape word (singular or plural) as whole words."""
    words = set(re.findall(r"[a-z]+", caption.lower()))
    shapes = {shape, shape + "s", shape + "es"}
    return colour.lower() in words and bool(words & shapes)


@torch.no_grad()
def caption_report(model: Captioner, data: DataConfig, sampler: SamplerConfig, *, split: str = "test",
                   limit: int = 512, batch_size: int = 64, device: str | torch.device = "cpu",
                   progress: bool = True) -> dict[str, Any]:
    """Caption up to `limit` images of `split`; return captions and colour+shape accuracy on single objects."""
    model.eval().to(device)
    tokenizer = CaptionTokenizer(model.cfg.context_length)
    loader = build_loader(dataclasses.replace(data, num_workers=0), split=split, image_size=model.cfg.image_size,
                          batch_size=batch_size, shuffle=False, drop_last=False)
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=limit, desc=f"captioning {split}", unit="img", disable=not progress)
    for batch in loader:
        take = min(len(batch["caption"]), limit - len(rows))
        images = batch["image"][:take].to(device)
        out = sample(model, model.encode_image(images), sampler)
        for i in range(take):
            meta = batch["meta"][i]
            labels = meta.get("labels", {})
            row = {"key": batch["key"][i], "reference": batch["caption"][i],
                   "caption": tokenizer.decode(out.tokens[i]), "count": labels.get("count")}
            if labels.get("count") == 1:
                row["correct"] = names_object(row["caption"], labels["colour"], labels["shape"])
            rows.append(row)
        bar.update(take)
        if len(rows) >= limit:
            break
    bar.close()
    single = [r for r in rows if "correct" in r]
    return {
        "split": split,
        "n_images": len(rows),
        "n_single_object": len(single),
        "single_object_accuracy": sum(r["correct"] for r in single) / len(single) if single else None,
        "sampler": dataclasses.asdict(sampler),
        "captions": rows,
    }
