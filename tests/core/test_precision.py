"""Inference precision: bf16 autocast changes greedy captions and Monte Carlo scores by less than their noise.

The fixture is a micro MDC captioner trained for 120 steps to caption 32 random images with 32 templated captions;
it is evaluated on the images with noise added, so that its predictions are confident but not certain. In bf16 (on
the CPU here; the default on CUDA) the greedy captions must agree with fp32 at >= 99% of positions and the Monte
Carlo ELBO of every caption must stay within 2 standard errors of its fp32 value (the same masks, seed 0).
"""

from __future__ import annotations

import json

import pytest
import torch

from mdc_core.checkpoint import save_checkpoint
from mdc_core.config import ObjectiveConfig, RunConfig, SamplerConfig
from mdc_core.model import Captioner
from mdc_core.objectives import compute_loss
from mdc_core.sampler import bf16_enabled, default_inference_precision, inference_autocast, inference_precision, sample
from mdc_core.scoring import score_tokens
from mdc_core.tokenizer import CaptionTokenizer, build_output_vocab
from mdc_workbench.cli.main import main
from tests.conftest import micro_config

CAPTIONS = [f"a {c} {s} on the {p}" for c in ("red", "blue", "green", "yellow")
            for s in ("circle", "square", "triangle", "star") for p in ("left", "right")]


@pytest.fixture(scope="module")
def trained():
    tok = CaptionTokenizer(24)
    ids = build_output_vocab(CAPTIONS, tok)
    torch.manual_seed(0)
    model = Captioner(micro_config(output_vocab="corpus", output_vocab_size=len(ids)), output_ids=ids)
    images = torch.randn(len(CAPTIONS), 3, 32, 32, generator=torch.Generator().manual_seed(1))
    tokens = tok(CAPTIONS)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(2)
    for _ in range(120):
        loss = compute_loss(model, images, tokens, ObjectiveConfig(name="mdc"), gen).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    noisy = images + 0.5 * torch.randn(images.shape, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        image_tokens = model.eval().encode_image(noisy)
    return model, image_tokens, tokens, noisy


def test_bf16_greedy_captions_and_mc_scores_stay_within_their_noise(trained):
    model, image_tokens, tokens, _ = trained
    cfg = SamplerConfig(length=len(CaptionTokenizer(24).encode_text(CAPTIONS[0])))
    fp32, bf16 = (sample(model, image_tokens, cfg, precision=p) for p in ("fp32", "bf16"))
    assert (fp32.tokens == bf16.tokens).float().mean() >= 0.99
    assert bf16.reveal_confidence.dtype == torch.float32  # confidences are taken in fp32
    a, b = (score_tokens(model, image_tokens, tokens, "mc", samples=128, seed=0, precision=p) for p in ("fp32", "bf16"))
    assert ((b.score - a.score).abs() <= 2 * a.stderr).all(), ((b.score - a.score) / a.stderr)
    assert not torch.equal(a.score, b.score)  # bf16 did run: the scores differ, within their noise


def test_bf16_attention_capture_and_the_default_precision(trained):
    model, image_tokens, _, _ = trained
    cfg = SamplerConfig(length=4)
    with default_inference_precision("bf16"):
        assert inference_precision() == "bf16" and inference_precision("fp32") == "fp32"
        out = sample(model, image_tokens[:2], cfg, attention=True)  # precision=None: the default, bf16
    assert inference_precision() == "auto"
    assert out.step_attention.dtype == torch.float32
    weights = out.step_attention.sum(dim=-1)  # (S, B, N, Ly, h): 1 at the revealed positions, 0 elsewhere
    revealed = out.step_revealed[..., None, None].expand_as(weights)
    torch.testing.assert_close(weights[revealed], torch.ones_like(weights[revealed]), atol=1e-2, rtol=0)
    plain = sample(model, image_tokens[:2], cfg, precision="bf16")
    assert torch.equal(plain.tokens, out.tokens)


def test_auto_is_bf16_only_on_gpus_with_bf16_in_hardware(monkeypatch):
    """One rule for training (train.precision) and inference: a GPU that only emulates bf16 (before Ampere: T4,
    V100) gets fp32 under auto, as the CPU does; asking for bf16 still gets it."""
    import mdc_core.train as train_mod

    assert train_mod.bf16_enabled is bf16_enabled  # the trainer's decision is this function
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for hardware in (True, False):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                            lambda including_emulation=True, hardware=hardware: hardware or including_emulation)
        assert bf16_enabled("auto", "cuda:0") is hardware
        assert bf16_enabled("bf16", "cuda") and not bf16_enabled("fp32", "cuda")
    assert not bf16_enabled("auto", "cpu")


def test_precision_rules():
    assert not bf16_enabled("auto", "cpu") and not bf16_enabled("fp32", "cpu") and bf16_enabled("bf16", "cpu")
    assert bf16_enabled("auto", "cuda") == (torch.cuda.is_available() and
                                            torch.cuda.is_bf16_supported(including_emulation=False))
    with pytest.raises(ValueError, match="unknown precision 'fp16'; choose one of auto, fp32, bf16"):
        inference_autocast("fp16", "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):  # fp32 holds inside a caller's bf16 region
        with inference_autocast("fp32", "cpu"):
            assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32


def test_cli_precision_flag(trained, tmp_path, capsys):
    from PIL import Image

    model, _, _, noisy = trained
    ids = model.output_ids
    cfg = RunConfig(model=micro_config(output_vocab="corpus", output_vocab_size=len(ids)), sampler=SamplerConfig(6))
    save_checkpoint(tmp_path / "run", 1, cfg, model)
    Image.new("RGB", (32, 32), (200, 30, 30)).save(tmp_path / "img.png")
    scores = {}
    for p in ("fp32", "bf16"):
        assert main(["score", "--run", str(tmp_path / "run"), "--image", str(tmp_path / "img.png"), "--method", "mc",
                     "--samples", "64", "--caption", CAPTIONS[0], "--caption", CAPTIONS[1], "--precision", p,
                     "--json"]) == 0
        scores[p] = json.loads(capsys.readouterr().out)
    for a, b in zip(scores["fp32"], scores["bf16"], strict=True):
        assert abs(a["score"] - b["score"]) <= 2 * a["stderr"]
    assert main(["sample", "--run", str(tmp_path / "run"), "--image", str(tmp_path / "img.png"),
                 "--precision", "bf16"]) == 0
    assert "steps in" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["sample", "--run", str(tmp_path / "run"), "--image", str(tmp_path / "img.png"), "--precision", "fp16"])
