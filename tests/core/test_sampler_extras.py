"""Sampler extras: infilling with fixed positions, cross-attention weights, revisable tokens, batch == one by one."""

import math

import pytest
import torch

from mdc_core.config import ConfigError, SamplerConfig
from mdc_core.sampler import sample
from mdc_core.tokenizer import EOT_ID, MASK_ID, SOT_ID, CaptionTokenizer
from mdc_workbench.viz.animation import trajectory
from tests.core.test_sampler import TableModel

TOK = CaptionTokenizer(24)


def _random_opinions(vocab: int = 20, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return lambda x: torch.randn(x.shape[0], x.shape[1] - 2, vocab, generator=g) * 3  # new opinions every step


# ------------------------------------------------------------------------------------------------------------
# infilling


def test_fixed_positions_never_change_and_are_not_in_the_trajectory():
    model = TableModel(None, torch.arange(20), fn=_random_opinions())
    prompt = torch.tensor([3, MASK_ID, MASK_ID, 7, MASK_ID, 9])
    out = sample(model, torch.zeros(2, 4, 8), SamplerConfig(length=15), prompt=prompt)
    fixed = prompt != MASK_ID
    assert out.tokens.shape == (2, 6)  # the length comes from the prompt
    assert out.num_steps == 3 == len(model.seen)  # one step per slot
    for seen in model.seen:  # every canvas the decoder saw holds the fixed tokens
        assert torch.equal(seen[:, 1:-1][:, fixed], prompt[fixed].expand(2, -1))
        assert seen[0, 0] == SOT_ID and seen[0, -1] == EOT_ID
    assert torch.equal(out.tokens[:, fixed], prompt[fixed].expand(2, -1))
    assert (out.tokens != MASK_ID).all()
    assert (out.reveal_step[:, fixed] == -1).all() and (out.reveal_step[:, ~fixed] >= 0).all()
    assert not out.step_masked[:, :, fixed].any() and not out.step_revealed[:, :, fixed].any()
    rec = trajectory(out, TOK, 1)
    assert rec["fixed"] == [0, 3, 5]
    touched = {r["position"] for s in rec["steps"] for r in s["revealed"]} | \
        {m["position"] for s in rec["steps"] for m in s["masked"]}
    assert touched == {1, 2, 4}
    assert rec["token_ids"][0] == 3 and rec["token_ids"][3] == 7


def test_fixed_mask_overrides_prompt_ids_and_rows_may_differ():
    model = TableModel(None, torch.arange(20), fn=_random_opinions())
    prompt = torch.tensor([[3, 4, 5, 6], [3, 4, 5, 6]])
    fixed = torch.tensor([[True, False, False, True], [True, True, True, False]])
    out = sample(model, torch.zeros(2, 4, 8), SamplerConfig(), prompt=prompt, fixed=fixed)
    assert out.row_steps.tolist() == [2, 1]  # row 1 has a single slot
    assert torch.equal(out.tokens[fixed], prompt[fixed])
    assert trajectory(out, TOK, 1)["fixed"] == [0, 1, 2] and len(trajectory(out, TOK, 1)["steps"]) == 1


def test_prompt_errors_are_readable():
    model = TableModel(None, torch.arange(20), fn=_random_opinions())
    with pytest.raises(ValueError, match="holds \\[MASK\\]"):
        sample(model, torch.zeros(1, 4, 8), SamplerConfig(), prompt=torch.tensor([MASK_ID, 3]),
               fixed=torch.tensor([True, True]))
    with pytest.raises(ValueError, match="does not fit 2 images"):
        sample(model, torch.zeros(2, 4, 8), SamplerConfig(), prompt=torch.tensor([[3, MASK_ID]] * 3))


# ------------------------------------------------------------------------------------------------------------
# cross-attention weights


def test_attention_sums_to_one_and_matches_a_manual_computation(tiny_model):
    model = tiny_model()
    images = torch.randn(2, 3, 32, 32)
    image_tokens = model.encode_image(images)  # (2, M, D)
    M = image_tokens.shape[1]
    cfg = SamplerConfig(length=5)
    out = sample(model, image_tokens, cfg, attention=True)
    plain = sample(model, image_tokens, cfg)
    assert torch.equal(out.tokens, plain.tokens)  # recording attention does not change the captions
    layers, heads = len(model.decoder.layers), model.cfg.text_heads
    assert out.step_attention.shape == (out.num_steps, 2, 5, layers, heads, M)
    att = out.step_attention[out.step_revealed]  # (reveals, Ly, h, M)
    assert att.shape[0] == 10 and (att >= 0).all()
    torch.testing.assert_close(att.sum(-1), torch.ones(att.shape[:-1]))
    assert (out.step_attention[~out.step_revealed] == 0).all()

    # manual: replay step s's canvas, hook each cross-attention's input, softmax(q k^T / sqrt(c)) over image tokens
    s, b = 2, 1
    x = torch.full((1, 7), MASK_ID)
    x[0, 0], x[0, -1] = SOT_ID, EOT_ID
    earlier = (out.reveal_step[b] < s) & (out.reveal_step[b] >= 0)
    x[0, 1:-1][earlier] = out.tokens[b][earlier]
    inputs = []
    hooks = [layer.cross_attn.register_forward_hook(lambda m, args, kw=None: inputs.append(args[0]))
             for layer in model.decoder.layers]
    with torch.no_grad():
        model.decode(x, image_tokens[b:b + 1])
    for h in hooks:
        h.remove()
    image = model.decoder.image_proj(image_tokens[b:b + 1])
    pos = int(out.step_revealed[s, b].nonzero()[0, 0])
    c = model.cfg.text_width // heads
    for i, layer in enumerate(model.decoder.layers):
        q = layer.cross_attn.q(inputs[i])[0, pos + 1].view(heads, c)  # (h, c) query of the revealed position
        kv = layer.cross_attn.kv(layer.ln_image(image))[0].view(M, 2, heads, c)
        k = kv[:, 0].transpose(0, 1)  # (h, M, c)
        manual = torch.einsum("hc,hmc->hm", q, k).div(math.sqrt(c)).softmax(-1)  # (h, M)
        torch.testing.assert_close(out.step_attention[s, b, pos, i], manual, rtol=1e-4, atol=1e-6)
    rec = trajectory(out, TOK, b)
    assert len(rec["steps"][s]["revealed"][0]["attention"]) == layers
    assert rec["settings"]["attention_prefix_tokens"] == model.encoder.num_prefix_tokens


def test_decode_with_attention_equals_the_fused_kernel(tiny_model):
    model = tiny_model()
    image_tokens = model.encode_image(torch.randn(3, 3, 32, 32))
    tokens = TOK(["a red circle", "two blue squares left of a cross", "a"])
    select = torch.zeros_like(tokens, dtype=torch.bool)
    select[:, 1:3] = True
    att: list = []
    with torch.no_grad():
        fused = model.decode(tokens, image_tokens, select=select)
        manual = model.decode(tokens, image_tokens, select=select, attention=att)
    torch.testing.assert_close(manual, fused, rtol=1e-4, atol=1e-5)
    assert len(att) == len(model.decoder.layers) and att[0].shape == (6, model.cfg.text_heads,
                                                                      image_tokens.shape[1])


# ------------------------------------------------------------------------------------------------------------
# revisable tokens


def test_remasking_by_hand():
    """3 positions. Token 11 at position 1 is revealed first with confidence 0.45 (< 0.5); once both neighbours
    are known the model prefers 12 there (0.7), so the extra step revises it, and then nothing is below 0.5."""
    ids = torch.tensor([10, 11, 12, 13])

    def fn(x):
        known = x[:, 1:-1] != MASK_ID  # (B, 3)
        p = torch.empty(x.shape[0], 3, 4)
        for b in range(x.shape[0]):
            p[b, 0] = torch.tensor([0.9, 0.03, 0.03, 0.04] if known[b, 1] else [0.4, 0.2, 0.2, 0.2])
            p[b, 2] = torch.tensor([0.05, 0.05, 0.1, 0.8] if known[b, 1] else [0.2, 0.2, 0.2, 0.4])
            both = known[b, 0] and known[b, 2]
            p[b, 1] = torch.tensor([0.1, 0.1, 0.7, 0.1] if both else [0.1, 0.45, 0.35, 0.1])
        return p.log()

    greedy = sample(TableModel(None, ids, fn=fn), torch.zeros(1, 2, 4), SamplerConfig(length=3))
    assert greedy.tokens.tolist() == [[10, 11, 13]]
    assert greedy.reveal_step.tolist() == [[1, 0, 2]] and greedy.num_steps == 3
    assert greedy.reveal_confidence[0].tolist() == pytest.approx([0.9, 0.45, 0.8], rel=1e-5)
    cfg = SamplerConfig(length=3, remask_threshold=0.5, remask_steps=4)
    out = sample(TableModel(None, ids, fn=fn), torch.zeros(1, 2, 4), cfg)
    assert out.tokens.tolist() == [[10, 12, 13]]
    assert out.num_steps == 4  # 3 greedy steps + 1 revision, well inside the budget of 4
    assert out.step_remasked[:, 0].nonzero().tolist() == [[3, 1]]
    assert out.reveal_confidence[0].tolist() == pytest.approx([0.9, 0.7, 0.8], rel=1e-5)
    rec = trajectory(out, TOK)
    assert rec["steps"][3]["remasked"] == [{"position": 1, "token": TOK.token_string(11), "token_id": 11}]
    assert rec["steps"][3]["revealed"][0]["token_id"] == 12
    assert rec["steps"][:3] == [{**s, "remasked": []} for s in trajectory(greedy, TOK)["steps"]]


def test_unchanged_revision_is_not_repeated():
    """A weak token that comes back unchanged is not picked again: the loop stops instead of spending its budget."""
    ids = torch.tensor([10, 11])
    fn = lambda x: torch.tensor([0.6, 0.4]).log().expand(x.shape[0], x.shape[1] - 2, 2)
    out = sample(TableModel(None, ids, fn=fn), torch.zeros(1, 2, 4),
                 SamplerConfig(length=2, remask_threshold=0.7, remask_steps=10))
    assert out.num_steps == 4  # 2 greedy steps, each of the two tokens revised once, unchanged
    assert out.step_remasked[2:, 0].sum().item() == 2


@pytest.mark.parametrize("k,budget", [(1, 3), (2, 5), (3, 1)])
def test_remasking_respects_its_step_bound_and_the_greedy_prefix(k, budget):
    ids = torch.arange(20)
    length = 7
    cfg = SamplerConfig(length=length, tokens_per_step=k, remask_threshold=1.0, remask_steps=budget)
    out = sample(TableModel(None, ids, fn=_random_opinions(seed=1)), torch.zeros(2, 4, 8), cfg)
    greedy = sample(TableModel(None, ids, fn=_random_opinions(seed=1)), torch.zeros(2, 4, 8),
                    SamplerConfig(length=length, tokens_per_step=k))
    g = greedy.num_steps
    assert g == math.ceil(length / k)
    assert out.num_steps <= g + budget  # the bound
    assert torch.equal(out.step_revealed[:g], greedy.step_revealed)  # the greedy phase is Eq. 6 untouched
    assert torch.equal(out.step_token[:g], greedy.step_token)
    assert not out.step_remasked[:g].any()
    per_step = out.step_remasked[g:].sum(dim=2)  # (extra, B)
    assert (per_step <= k).all() and (out.step_remasked[g:].any(dim=2).sum(0) <= budget).all()
    assert (out.tokens != MASK_ID).all()


def test_greedy_stays_the_default():
    cfg = SamplerConfig()
    assert not cfg.remasking and cfg.remask_steps == 0 and cfg.remask_threshold == 0.0
    with pytest.raises(ConfigError, match="remask_steps"):
        SamplerConfig(remask_threshold=0.5).validate()
    with pytest.raises(ConfigError, match="remask_threshold"):
        SamplerConfig(remask_steps=3).validate()


# ------------------------------------------------------------------------------------------------------------
# batch == one by one


@pytest.mark.parametrize("cfg,with_prompt", [
    (SamplerConfig(length=6), False),
    (SamplerConfig(length=6, tokens_per_step=2, threshold=0.05), False),
    (SamplerConfig(length=6, remask_threshold=0.9, remask_steps=4), False),
    (SamplerConfig(length=6), True),
])
def test_batch_equals_one_by_one(tiny_model, cfg, with_prompt):
    model = tiny_model(seed=3)
    image_tokens = model.encode_image(torch.randn(4, 3, 32, 32))
    prompt = None
    if with_prompt:
        prompt = torch.full((4, 6), MASK_ID)
        prompt[0, 1], prompt[1, 2:4], prompt[3, 0] = 320, torch.tensor([1746, 2108]), 320  # rows differ
    batch = sample(model, image_tokens, cfg, prompt=prompt, attention=True)
    for i in range(4):
        one = sample(model, image_tokens[i:i + 1], cfg, prompt=None if prompt is None else prompt[i:i + 1],
                     attention=True)
        assert torch.equal(batch.tokens[i:i + 1], one.tokens)
        a, b = trajectory(batch, TOK, i), trajectory(one, TOK, 0)
        assert a["token_ids"] == b["token_ids"] and a["fixed"] == b["fixed"] and len(a["steps"]) == len(b["steps"])
        for sa, sb in zip(a["steps"], b["steps"], strict=True):
            assert [r["position"] for r in sa["revealed"]] == [r["position"] for r in sb["revealed"]]
            assert [r["token_id"] for r in sa["revealed"]] == [r["token_id"] for r in sb["revealed"]]
            assert sa["remasked"] == sb["remasked"]
            assert [r["confidence"] for r in sa["revealed"]] == pytest.approx(
                [r["confidence"] for r in sb["revealed"]], abs=1e-5)
            for ra, rb in zip(sa["revealed"], sb["revealed"], strict=True):
                torch.testing.assert_close(torch.tensor(ra["attention"]), torch.tensor(rb["attention"]),
                                           atol=2e-4, rtol=0)


def test_attention_is_off_by_default(tiny_model):
    model = tiny_model()
    out = sample(model, model.encode_image(torch.randn(1, 3, 32, 32)), SamplerConfig(length=4))
    assert out.step_attention is None
    assert "attention" not in trajectory(out, TOK)["steps"][0]["revealed"][0]


def test_guided_sampling_reports_the_conditional_models_attention(tiny_model):
    from mdc_workbench.masked_conditional.guidance import GuidanceConfig, GuidedCaptioner
    model = tiny_model()
    image_tokens = model.encode_image(torch.randn(1, 3, 32, 32))
    out = sample(GuidedCaptioner(model, GuidanceConfig(mode="cfg", scale=2.0)), image_tokens,
                 SamplerConfig(length=4), attention=True)
    att = out.step_attention[out.step_revealed]  # (4, Ly, h, M): one map per layer, not one per guided call
    assert att.shape[1] == len(model.decoder.layers)
    torch.testing.assert_close(att.sum(-1), torch.ones(att.shape[:-1]))
