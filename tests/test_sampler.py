"""The unmasking sampler (paper Eq. 6): reveal order, k tokens per step, fixed reveals, trajectory."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mdc_core.config import ConfigError, SamplerConfig
from mdc_core.sampler import canvas, sample, trajectory
from mdc_core.tokenizer import EOT_ID, MASK_ID, SOT_ID, CaptionTokenizer


class TableModel(nn.Module):
    """A stand-in decoder whose logits come from a fixed (N, V) table, or a function of the canvas.

    It records every canvas it is shown, so tests can check what changed between steps.
    """

    def __init__(self, table: torch.Tensor, output_ids: torch.Tensor, fn=None):
        super().__init__()
        self.table, self.fn = table, fn
        self.causal = False
        self.cfg = SimpleNamespace(context_length=64)
        self.register_buffer("output_ids", output_ids)
        self.seen: list[torch.Tensor] = []

    def decode(self, x, image_tokens):
        self.seen.append(x.clone())
        B, L = x.shape
        body = self.fn(x) if self.fn is not None else self.table.expand(B, -1, -1)
        pad = torch.zeros(B, 1, body.shape[-1])
        return torch.cat([pad, body, pad], dim=1)  # (B, L, V): <sot>/<eot> rows are ignored


def test_eq6_reveal_order_hand_computed():
    # vocabulary rows -> token ids 10, 11, 12 and <eot>; 3 positions
    ids = torch.tensor([10, 11, 12, EOT_ID])
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.05, 0.05, 0.9]])
    logits = torch.cat([probs.log(), torch.full((3, 1), 50.0)], dim=1)[None]  # <eot> huge: must be excluded
    model = TableModel(logits, ids)
    out = sample(model, torch.zeros(1, 4, 8), SamplerConfig(length=3))
    # confidences 0.6, 0.7, 0.9 -> reveal position 2 (token 12), then 1 (11), then 0 (10)
    assert out.tokens.tolist() == [[10, 11, 12]]
    assert out.reveal_step.tolist() == [[2, 1, 0]]
    assert out.reveal_confidence[0].tolist() == pytest.approx([0.6, 0.7, 0.9], rel=1e-5)
    assert out.step_masked[:, 0].sum(1).tolist() == [3, 2, 1]


@pytest.mark.parametrize("length,k", [(10, 1), (10, 3), (7, 7), (5, 2)])
def test_reveals_exactly_k_per_step_and_never_changes_revealed(length, k):
    ids = torch.arange(20)
    g = torch.Generator().manual_seed(0)
    fn = lambda x: torch.randn(x.shape[0], x.shape[1] - 2, 20, generator=g) * 3  # new opinions every step
    model = TableModel(None, ids, fn=fn)
    out = sample(model, torch.zeros(2, 4, 8), SamplerConfig(length=length, tokens_per_step=k))
    steps = math.ceil(length / k)
    assert out.num_steps == steps == len(model.seen)
    frames = model.seen + [torch.cat([torch.full((2, 1), SOT_ID), out.tokens, torch.full((2, 1), EOT_ID)], 1)]
    assert torch.equal(frames[0], canvas(2, length))
    for s in range(steps):
        before, after = frames[s], frames[s + 1]
        changed = before != after
        expected = min(k, length - s * k)
        assert (changed.sum(1) == expected).all()
        assert (before[changed] == MASK_ID).all()  # only masks change; a revealed token never does
    assert (out.tokens != MASK_ID).all()
    assert ((out.reveal_step >= 0) & (out.reveal_step < steps)).all()


def test_special_tokens_never_emitted():
    ids = torch.tensor([5, SOT_ID, EOT_ID, 7])
    logits = torch.tensor([[0.0, 100.0, 100.0, 1.0]]).expand(4, -1)[None]
    out = sample(TableModel(logits, ids), torch.zeros(1, 2, 4), SamplerConfig(length=4))
    assert set(out.tokens.flatten().tolist()) <= {5, 7}
    assert out.reveal_confidence.max() < 1.0  # probabilities renormalised over allowed tokens only


def test_greedy_batch_equals_single(tiny_model):
    model = tiny_model()
    images = torch.randn(3, 3, 32, 32)
    feats = model.encode_image(images)
    cfg = SamplerConfig(length=6)
    together = sample(model, feats, cfg)
    for i in range(3):
        alone = sample(model, feats[i: i + 1], cfg)
        assert torch.equal(alone.tokens[0], together.tokens[i])
        assert torch.equal(alone.reveal_step[0], together.reveal_step[i])


def test_temperature_sampling_is_seeded(tiny_model):
    model = tiny_model()
    feats = model.encode_image(torch.randn(2, 3, 32, 32))
    a = sample(model, feats, SamplerConfig(length=6, temperature=1.0, seed=3))
    b = sample(model, feats, SamplerConfig(length=6, temperature=1.0, seed=3))
    c = sample(model, feats, SamplerConfig(length=6, temperature=1.0, top_k=1, seed=4))
    greedy = sample(model, feats, SamplerConfig(length=6))
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(c.tokens, greedy.tokens)  # top-1 sampling is greedy


def test_trajectory_json(tiny_model):
    model = tiny_model()
    out = sample(model, model.encode_image(torch.randn(1, 3, 32, 32)), SamplerConfig(length=5, tokens_per_step=2))
    rec = trajectory(out, CaptionTokenizer(24))
    assert len(rec["steps"]) == 3 and len(rec["tokens"]) == 5
    assert [len(s["revealed"]) for s in rec["steps"]] == [2, 2, 1]
    assert [len(s["masked"]) for s in rec["steps"]] == [5, 3, 1]
    assert sorted(r["position"] for s in rec["steps"] for r in s["revealed"]) == list(range(5))
    for s in rec["steps"]:
        assert {"position", "token", "confidence"} <= s.keys()
        assert s["revealed"][0]["confidence"] >= s["revealed"][-1]["confidence"]
    assert rec["settings"]["tokens_per_step"] == 2


def test_sampler_rejects_bad_settings(tiny_model):
    model = tiny_model()
    feats = model.encode_image(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="exceeds the model's context"):
        sample(model, feats, SamplerConfig(length=30))
    with pytest.raises(ConfigError, match="sampler.length"):
        sample(model, feats, SamplerConfig(length=0))
    with pytest.raises(ValueError, match="autoregressive"):
        sample(tiny_model(causal=True), feats, SamplerConfig(length=3))
