"""Integration: the `tiny` preset, trained with the MDC objective on 32 synthetic pairs, memorises them so that
greedy confidence unmasking (Eq. 6) at each caption's own length reproduces the caption."""

import dataclasses

import torch

from mdc_core.config import load_preset
from mdc_core.data import build_loader
from mdc_core.factory import load_model
from mdc_core.sampler import sample
from mdc_core.tokenizer import CaptionTokenizer
from mdc_core.train import train
from mdc_workbench.data import write_synthetic_dataset


def test_tiny_preset_overfits_32_pairs(tmp_path):
    data = tmp_path / "data"
    write_synthetic_dataset(data, 32, seed=1, image_size=64, captions="short", n_val=0, n_test=0, n_compgen=0,
                            progress=False, workers=1)
    cfg = load_preset("tiny", [f'data.path="{data}"', "train.steps=200", "train.batch_size=32", "train.lr=2e-3",
                               "train.warmup_steps=20", "train.weight_decay=0.0", "train.log_every=50",
                               "train.ckpt_every=200", "data.shuffle_buffer=0"])
    result = train(cfg, tmp_path / "run", progress=False)
    assert result.final_loss < 0.1

    model, cfg = load_model(tmp_path / "run")
    tok = CaptionTokenizer(cfg.model.context_length)
    batch = next(iter(build_loader(cfg.data, split="train", image_size=64, batch_size=32, shuffle=False,
                                   drop_last=False)))
    assert len(batch["caption"]) == 32
    image_tokens = model.encode_image(batch["image"])
    exact = 0
    for i, caption in enumerate(batch["caption"]):
        n = len(tok.encode_text(caption))
        with torch.no_grad():
            out = sample(model, image_tokens[i:i + 1], dataclasses.replace(cfg.sampler, length=n))
        exact += tok.decode(out.tokens[0]) == tok.decode(tok(caption)[0])
    assert exact >= 30, f"only {exact}/32 captions reproduced"
