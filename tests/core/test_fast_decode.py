"""Exact caches: image cross-attention keys/values (MDC and ARC) and the ARC self-attention KV cache."""

import pytest
import torch

from mdc_core.ar_decode import ar_decode, beam_search, greedy
from mdc_core.model import ImageCache
from mdc_core.scoring import score_tokens
from mdc_core.tokenizer import EOT_ID, MASK_ID, PAD_ID, SOT_ID

WORDS = torch.tensor([*range(100, 111), EOT_ID])  # an 11-word corpus vocabulary plus <eot>


def rows(*seqs):
    return torch.tensor([list(s) for s in seqs])


@pytest.mark.parametrize("causal", [False, True])
@torch.no_grad()
def test_image_cache_equals_uncached_logits(tiny_model, causal):
    model = tiny_model(causal=causal)
    images = model.encode_image(torch.randn(3, 3, 32, 32))
    tokens = rows([SOT_ID, 10, MASK_ID, 12, EOT_ID, PAD_ID], [SOT_ID, MASK_ID, MASK_ID, EOT_ID, 5, 6],
                  [SOT_ID, 7, 8, 9, 10, EOT_ID])
    cache = model.image_cache(images)
    assert isinstance(cache, ImageCache) and cache.batch == 3 and len(cache.kv) == model.cfg.text_layers
    ref = model.decode(tokens, images)
    assert torch.allclose(model.decode(tokens, None, cache=cache), ref, atol=1e-5)
    select = tokens == MASK_ID
    assert torch.allclose(model.decode(tokens, None, cache=cache, select=select), ref[select], atol=1e-5)
    # one image for many captions: a batch-1 cache (or its expansion, which copies nothing) serves every row
    one = model.image_cache(images[:1])
    ref1 = model.decode(tokens, images[:1].expand(3, -1, -1))
    expanded = one.expand(3)
    assert expanded.kv[0][0].data_ptr() == one.kv[0][0].data_ptr() and expanded.kv[0][0].stride(0) == 0
    for c in (one, expanded, one.index(torch.tensor([0, 0, 0]))):
        assert torch.allclose(model.decode(tokens, None, cache=c), ref1, atol=1e-5)
    picked = cache.index(torch.tensor([2, 0]))
    assert torch.allclose(model.decode(tokens[:2], None, cache=picked),
                          model.decode(tokens[:2], images[[2, 0]]), atol=1e-5)


def test_image_cache_errors(tiny_model):
    model = tiny_model()
    images = model.encode_image(torch.randn(2, 3, 32, 32))
    tokens = rows([SOT_ID, MASK_ID, EOT_ID], [SOT_ID, MASK_ID, EOT_ID], [SOT_ID, MASK_ID, EOT_ID])
    with pytest.raises(ValueError, match="holds 2 images but 3 token rows"):
        model.decode(tokens, None, cache=model.image_cache(images))
    with pytest.raises(ValueError, match="needs image_tokens or an image cache"):
        model.decode(tokens, None)
    with pytest.raises(ValueError, match="only a cache of one image"):
        model.image_cache(images).expand(4)


def arc_model(tiny_model, eot_bias=0.2):
    """An ARC micro model over a small vocabulary that stops after a few tokens (or runs to the context)."""
    model = tiny_model(causal=True, output_ids=WORDS)
    with torch.no_grad():
        model.decoder.head.bias[-1] = eot_bias
    return model


@torch.no_grad()
def naive_greedy(model, image_tokens, max_tokens):
    """Greedy decoding that recomputes the whole prefix every step (no caches at all)."""
    B = image_tokens.shape[0]
    seq = torch.full((B, 1), SOT_ID)
    done = torch.zeros(B, dtype=torch.bool)
    for _ in range(max_tokens):
        logits = model.decode(seq, image_tokens, causal=True)[:, -1].float()
        logits[:, model.output_ids == SOT_ID] = float("-inf")
        tok = torch.where(done, PAD_ID, model.output_ids[logits.argmax(-1)])
        seq = torch.cat([seq, tok[:, None]], dim=1)
        done |= tok == EOT_ID
        if done.all():
            break
    return seq[:, 1:]


@pytest.mark.parametrize("eot_bias", [0.2, -0.3])  # captions that end early / that run to the context
@torch.no_grad()
def test_kv_cached_greedy_equals_full_recompute(tiny_model, eot_bias):
    model = arc_model(tiny_model, eot_bias)
    images = model.encode_image(torch.randn(4, 3, 32, 32))
    out = greedy(model, images)
    ref = naive_greedy(model, images, model.cfg.context_length - 1)
    assert torch.equal(out.tokens, ref)
    ended = (out.tokens == EOT_ID).any(1)
    assert out.lengths.tolist() == [int((r == EOT_ID).nonzero()[0, 0]) if e else out.tokens.shape[1]
                                    for r, e in zip(out.tokens, ended, strict=True)]
    if eot_bias > 0:
        assert ended.all() and len(set(out.lengths.tolist())) > 1  # rows stop at different steps
    else:
        assert out.tokens.shape[1] == model.cfg.context_length - 1 and not ended.any()
    # the reported log-probs are the teacher-forced ones: the ar score of the decoded caption
    tokens = torch.cat([torch.full((4, 1), SOT_ID), out.tokens], dim=1)
    if ended.all():
        assert torch.allclose(score_tokens(model, images, tokens, "ar").score, out.score, atol=1e-4)


@torch.no_grad()
def test_beam_one_is_greedy_and_wider_beams_score_higher(tiny_model):
    for bias in (0.2, -0.3):
        model = arc_model(tiny_model, bias)
        images = model.encode_image(torch.randn(3, 3, 32, 32))
        g, b1 = greedy(model, images, max_tokens=12), beam_search(model, images, beam_size=1, max_tokens=12)
        assert torch.equal(g.tokens, b1.tokens)
        assert torch.allclose(g.token_logprobs, b1.token_logprobs, atol=1e-5)
        b6 = ar_decode(model, images, "beam", beam_size=6, max_tokens=12)
        assert (b6.score >= g.score - 1e-4).all()  # raw-sum beam search never does worse than greedy here
        norm = beam_search(model, images, beam_size=6, length_penalty=1.0, max_tokens=12)
        per_token = lambda o: o.score / (o.lengths + (o.tokens == EOT_ID).any(1).long())  # noqa: E731
        assert (per_token(norm) >= per_token(g) - 1e-4).all()


def test_ar_decode_errors(tiny_model):
    mdc = tiny_model()
    feats = mdc.encode_image(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="needs a causal"):
        greedy(mdc, feats)
    arc = arc_model(tiny_model)
    with pytest.raises(ValueError, match="max_tokens must be in"):
        greedy(arc, feats, max_tokens=99)
    with pytest.raises(ValueError, match="unknown decoding method"):
        ar_decode(arc, feats, "nucleus")
