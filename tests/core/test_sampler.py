"""The unmasking sampler (paper Eq. 6): reveal order, k tokens per step, fixed reveals, trajectory."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mdc_core.config import ConfigError, SamplerConfig
from mdc_core.sampler import canvas, sample
from mdc_core.tokenizer import EOT_ID, MASK_ID, SOT_ID, CaptionTokenizer
from mdc_workbench.viz.animation import trajectory


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

    def image_cache(self, image_tokens):
        return image_tokens

    def decode(self, x, image_tokens, cache=None, select=None):
        self.seen.append(x.clone())
        B, L = x.shape
        body = self.fn(x) if self.fn is not None else self.table.expand(B, -1, -1)
        pad = torch.zeros(B, 1, body.shape[-1])
        out = torch.cat([pad, body, pad], dim=1)  # (B, L, V): <sot>/<eot> rows are ignored
        return out if select is None else out[select]


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


class Uncached(nn.Module):
    """Wraps a captioner so that :func:`sample` runs the uncached decoder at every step."""

    def __init__(self, model):
        super().__init__()
        self.model, self.causal, self.cfg, self.output_ids = model, model.causal, model.cfg, model.output_ids

    def image_cache(self, image_tokens):
        return image_tokens

    def decode(self, x, image_tokens, cache=None, **kw):
        return self.model.decode(x, cache, **kw)  # `cache` is the image tokens here


@pytest.mark.parametrize("cfg", [SamplerConfig(length=7), SamplerConfig(length=7, tokens_per_step=3),
                                 SamplerConfig(length=7, threshold=0.1),
                                 SamplerConfig(length=7, temperature=1.0, top_k=5, seed=1)])
def test_image_cache_gives_identical_samples(tiny_model, cfg):
    model = tiny_model(output_ids=torch.tensor([*range(100, 111), EOT_ID]))  # 11 words: confidences near 0.1
    feats = model.encode_image(torch.randn(3, 3, 32, 32))
    cached, plain = sample(model, feats, cfg), sample(Uncached(model), feats, cfg)
    if cfg.threshold > 0:
        assert cached.num_steps < cfg.length  # the threshold did reveal several tokens in one step
    assert torch.equal(cached.tokens, plain.tokens)
    assert torch.equal(cached.reveal_step, plain.reveal_step)
    assert torch.allclose(cached.reveal_confidence, plain.reveal_confidence, atol=1e-6)


def test_threshold_reveals_top_plus_confident_hand_computed():
    ids = torch.tensor([10, 11, 12])
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.02, 0.95, 0.03], [0.04, 0.04, 0.92], [0.3, 0.4, 0.3]])
    model = TableModel(probs.log()[None], ids)
    out = sample(model, torch.zeros(1, 4, 8), SamplerConfig(length=4, threshold=0.9))
    # step 0: 0.95 (top) and 0.92 (>= 0.9); then 0.6; then 0.4
    assert out.tokens.tolist() == [[10, 11, 12, 11]]
    assert out.reveal_step.tolist() == [[1, 0, 0, 2]]
    assert out.num_steps == 3 == len(model.seen) and out.settings["steps"] == 3
    strict = sample(TableModel(probs.log()[None], ids), torch.zeros(1, 4, 8), SamplerConfig(length=4, threshold=0.99))
    assert strict.reveal_step.tolist() == [[2, 0, 1, 3]]  # nothing clears 0.99: one token per step, as Eq. 6


def test_threshold_rows_finish_at_their_own_step_and_trajectory_stays_valid():
    ids = torch.tensor([10, 11, 12])
    sure = torch.tensor([[0.01, 0.98, 0.01]]).expand(4, -1)  # row 0: every position confident -> 1 step
    unsure = torch.full((4, 3), 1 / 3)  # row 1: nothing clears the threshold -> 4 steps
    fn = lambda x: torch.stack([sure, unsure]).log()
    out = sample(TableModel(None, ids, fn=fn), torch.zeros(2, 4, 8), SamplerConfig(length=4, threshold=0.9))
    assert out.num_steps == 4 and out.row_steps.tolist() == [1, 4]
    assert out.step_masked.shape == (4, 2, 4) and not out.step_masked[1:, 0].any()
    assert (out.tokens != MASK_ID).all()
    tok = CaptionTokenizer(24)
    short, long = trajectory(out, tok, 0), trajectory(out, tok, 1)
    assert [len(s["revealed"]) for s in short["steps"]] == [4]
    assert [len(s["revealed"]) for s in long["steps"]] == [1, 1, 1, 1]
    json.dumps(short), json.dumps(long)


def test_threshold_setting_range():
    from mdc_core.config import sampler_options
    assert next(o for o in sampler_options() if o.name == "threshold").range == (0.0, 1.0)
    with pytest.raises(ConfigError, match="sampler.threshold"):
        SamplerConfig(threshold=1.5).validate()


def test_settings_record_every_option_of_the_config_and_the_length_sampled():
    """The record is built from the dataclass: an option added to SamplerConfig is recorded without listing it."""
    import dataclasses

    @dataclasses.dataclass
    class WithOption(SamplerConfig):
        new_option: float = 0.25

    ids = torch.tensor([10, 11, 12])
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.02, 0.95, 0.03], [0.04, 0.04, 0.92]])
    prompt = torch.tensor([MASK_ID, MASK_ID, MASK_ID])
    out = sample(TableModel(probs.log()[None], ids), torch.zeros(1, 4, 8), WithOption(length=9, seed=3),
                 prompt=prompt)
    assert out.settings == {"length": 3, "tokens_per_step": 1, "temperature": 0.0, "top_k": 0, "seed": 3,
                            "threshold": 0.0, "remask_threshold": 0.0, "remask_steps": 0, "new_option": 0.25,
                            "steps": 3}  # length: the prompt's N', not cfg.length
