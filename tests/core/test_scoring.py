"""Likelihood scorers (paper Sec. 4.2): the Monte Carlo ELBO against exact enumeration of Eq. 8, the heuristic
and chain-rule scores against hand-written loops, the image cache against the uncached path, bad input."""

import itertools

import pytest
import torch

from mdc_core.config import SCORE_METHODS, SamplerConfig
from mdc_core.sampler import allowed_rows, sample
from mdc_core.scoring import METHODS, methods_for, score_tokens
from mdc_core.tokenizer import EOT_ID, MASK_ID, CaptionTokenizer, build_output_vocab
from mdc_workbench.cli.scores import score_captions

CAPTIONS = ["a red circle", "two blue squares", "a small green star left of a circle", "star"]


def sharp_model(tiny_model, causal=False):
    """A micro captioner over the corpus vocabulary whose predictions depend strongly on the context (a scaled
    output head), so that the scores differ between masks, orders and images."""
    ids = build_output_vocab(CAPTIONS)
    model = tiny_model(causal=causal, output_ids=ids)
    with torch.no_grad():
        model.decoder.head.weight.mul_(25.0)
    return model


def tokens_of(model, captions):
    return CaptionTokenizer(model.cfg.context_length)(captions)


def logprobs(model, x, image):
    return model.decode(x, image).float().log_softmax(-1)[0]  # (L, V)


def exact_elbo(model, tokens, image):
    """Eq. 8 by enumeration: sum_l (1/l) * mean over all l-subsets M of sum_{i in M} log p(c_i | C with M masked)."""
    n = int((tokens == EOT_ID).nonzero()[0, 1]) - 1
    rows = model.output_index[tokens[0]]
    total = 0.0
    for k in range(1, n + 1):
        terms = []
        for subset in itertools.combinations(range(1, n + 1), k):
            x = tokens.clone()
            x[0, list(subset)] = MASK_ID
            lp = logprobs(model, x, image)
            terms.append(sum(float(lp[p, rows[p]]) for p in subset))
        total += sum(terms) / len(terms) / k
    return total


@torch.no_grad()
def test_mc_agrees_with_exact_enumeration_of_eq8(tiny_model):
    model = sharp_model(tiny_model)
    image = model.encode_image(torch.randn(1, 3, 32, 32))
    tokens = tokens_of(model, CAPTIONS[:2] + CAPTIONS[3:])  # 3, 3 and 1 caption tokens
    out = score_tokens(model, image, tokens, "mc", samples=1024, seed=0)
    for i in range(len(tokens)):
        exact = exact_elbo(model, tokens[i: i + 1, :8], image)
        assert abs(float(out.score[i]) - exact) <= 3 * float(out.stderr[i]) + 1e-4, (i, exact, out.score[i])
    assert out.stderr[0] > 0 and out.stderr[2] == 0  # a one-token caption has a single possible mask
    long = tokens_of(model, ["a small green star left"])  # 5 tokens: 31 masks, strata of different sizes
    est = score_tokens(model, image, long, "mc", samples=1024, seed=1)
    exact = exact_elbo(model, long[:, :8], image)
    assert abs(float(est.score[0]) - exact) <= 3 * float(est.stderr[0])
    assert est.stderr[0] < 0.05 * abs(exact)


@torch.no_grad()
def test_mc_is_seeded_and_independent_of_batch_size(tiny_model):
    model = sharp_model(tiny_model)
    image = model.encode_image(torch.randn(1, 3, 32, 32))
    tokens = tokens_of(model, CAPTIONS)
    a = score_tokens(model, image, tokens, "mc", samples=64, seed=3)
    b = score_tokens(model, image, tokens, "mc", samples=64, seed=3, batch_size=5)
    c = score_tokens(model, image, tokens, "mc", samples=64, seed=4)
    assert torch.allclose(a.score, b.score, atol=1e-4) and torch.allclose(a.stderr, b.stderr, atol=1e-5)
    assert not torch.allclose(a.score[:3], c.score[:3])
    assert a.token_logprobs is None and a.order is None


def hand_heuristic(model, tokens, image):
    """Sec. 4.2 written out for one caption: reveal the most confident masked position, score the truth there."""
    n = int((tokens == EOT_ID).nonzero()[0, 1]) - 1
    x = tokens.clone()
    x[0, 1:n + 1] = MASK_ID
    total, order = 0.0, {}
    allowed = allowed_rows(model)
    for step in range(n):
        logits = model.decode(x, image)[0].float()
        conf = logits.masked_fill(~allowed, float("-inf")).softmax(-1).max(-1).values
        best = max((p for p in range(1, n + 1) if x[0, p] == MASK_ID), key=lambda p: float(conf[p]))
        total += float(logits.log_softmax(-1)[best, model.output_index[tokens[0, best]]])
        order[best] = step
        x[0, best] = tokens[0, best]
    return total, [order[p] for p in range(1, n + 1)]


@torch.no_grad()
def test_heuristic_equals_hand_rolled_loop(tiny_model):
    model = sharp_model(tiny_model)
    images = model.encode_image(torch.randn(len(CAPTIONS), 3, 32, 32))
    tokens = tokens_of(model, CAPTIONS)
    out = score_tokens(model, images, tokens, "heuristic", batch_size=3)  # paired row-wise, two chunks
    for i in range(len(CAPTIONS)):
        total, order = hand_heuristic(model, tokens[i: i + 1], images[i: i + 1])
        n = len(order)
        assert float(out.score[i]) == pytest.approx(total, abs=1e-3)
        assert out.order[i, 1:n + 1].tolist() == order
        assert (out.order[i, n + 1:] == -1).all() and out.order[i, 0] == -1
        assert float(out.token_logprobs[i].sum()) == pytest.approx(float(out.score[i]), abs=1e-4)


@torch.no_grad()
def test_heuristic_follows_the_samplers_order_on_its_own_caption(tiny_model):
    model = sharp_model(tiny_model)
    image = model.encode_image(torch.randn(1, 3, 32, 32))
    drawn = sample(model, image, SamplerConfig(length=5))
    tokens = torch.cat([tokens_of(model, ["a"])[:, :1], drawn.tokens, torch.tensor([[EOT_ID]])], dim=1)
    out = score_tokens(model, image, tokens, "heuristic")
    assert out.order[0, 1:6].tolist() == drawn.reveal_step[0].tolist()


@torch.no_grad()
def test_ar_equals_teacher_forced_sum_for_arc(tiny_model):
    model = sharp_model(tiny_model, causal=True)
    image = model.encode_image(torch.randn(1, 3, 32, 32))
    tokens = tokens_of(model, CAPTIONS)
    out = score_tokens(model, image, tokens, "ar")
    for i in range(len(CAPTIONS)):
        n = int((tokens[i] == EOT_ID).nonzero()[0, 0])  # <sot> + caption tokens
        seq = tokens[i: i + 1, : n + 1]
        lp = logprobs(model, seq[:, :-1], image)  # position j predicts token j + 1
        expected = sum(float(lp[j, model.output_index[seq[0, j + 1]]]) for j in range(n))  # <eot> included
        assert float(out.score[i]) == pytest.approx(expected, abs=1e-3)
    rec = score_captions(model, image, CAPTIONS[:1], "ar")[0]
    assert len(rec["token_logprobs"]) == 3
    assert sum(rec["token_logprobs"]) + rec["eot_logprob"] == pytest.approx(rec["score"], abs=1e-4)


@torch.no_grad()
def test_ar_for_mdc_is_the_left_to_right_order(tiny_model):
    model = sharp_model(tiny_model)
    image = model.encode_image(torch.randn(1, 3, 32, 32))
    tokens = tokens_of(model, CAPTIONS[2:3])
    n = int((tokens[0] == EOT_ID).nonzero()[0, 0]) - 1
    expected, x = 0.0, tokens.clone()
    x[0, 1:n + 1] = MASK_ID
    for p in range(1, n + 1):
        expected += float(logprobs(model, x, image)[p, model.output_index[tokens[0, p]]])
        x[0, p] = tokens[0, p]
    out = score_tokens(model, image, tokens, "ar", batch_size=4)
    assert float(out.score[0]) == pytest.approx(expected, abs=1e-3)
    assert out.order[0, 1:n + 1].tolist() == list(range(n))


@pytest.mark.parametrize("method", ["mc", "heuristic", "ar"])
@torch.no_grad()
def test_image_cache_and_broadcast_give_the_uncached_scores(tiny_model, method):
    model = sharp_model(tiny_model)
    image = model.encode_image(torch.randn(1, 3, 32, 32))
    tokens = tokens_of(model, CAPTIONS)
    kw = dict(samples=48, seed=2, batch_size=16)
    cached = score_tokens(model, image, tokens, method, **kw)
    plain = score_tokens(model, image, tokens, method, use_cache=False, **kw)
    paired = score_tokens(model, image.expand(len(CAPTIONS), -1, -1).contiguous(), tokens, method, **kw)
    for other in (plain, paired):
        assert torch.allclose(cached.score, other.score, atol=1e-4)
        if method == "heuristic":
            assert torch.equal(cached.order, other.order)


@torch.no_grad()
def test_scores_prefer_the_matching_image(tiny_model):
    model = sharp_model(tiny_model)
    images = model.encode_image(torch.randn(2, 3, 32, 32))
    tokens = tokens_of(model, CAPTIONS[:1])
    per_image = [score_tokens(model, images[i: i + 1], tokens, "heuristic").score for i in range(2)]
    assert not torch.allclose(per_image[0], per_image[1])  # the image matters to the score


@torch.no_grad()
def test_score_captions_records(tiny_model):
    model = sharp_model(tiny_model)
    image = model.encode_image(torch.randn(1, 3, 32, 32))
    rows = score_captions(model, image[0], CAPTIONS[:2], "mc", samples=32)
    assert [r["caption"] for r in rows] == CAPTIONS[:2]
    assert rows[0]["tokens"] == ["a", "red", "circle"] and rows[0]["stderr"] >= 0
    assert "token_logprobs" not in rows[0]
    heur = score_captions(model, image, CAPTIONS[:1], "heuristic")[0]
    assert sorted(heur["order"]) == [0, 1, 2] and len(heur["token_logprobs"]) == 3


def test_method_table_and_errors(tiny_model):
    mdc, arc = sharp_model(tiny_model), sharp_model(tiny_model, causal=True)
    assert set(METHODS) == {"mc", "heuristic", "ar"} == set(SCORE_METHODS)  # the CLI's torch-free name table
    assert methods_for(mdc) == ["mc", "heuristic", "ar"] and methods_for(arc) == ["ar"]
    image = mdc.encode_image(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="unknown scoring method 'elbo'"):
        score_captions(mdc, image, ["a red circle"], "elbo")
    for method in ("mc", "heuristic"):
        with pytest.raises(ValueError, match="needs a MDC model"):
            score_captions(arc, image, ["a red circle"], method)
    with pytest.raises(ValueError, match="no caption decoder"):
        score_captions(torch.nn.Linear(2, 2), image, ["a red circle"], "ar")
    with pytest.raises(ValueError, match="caption list is empty"):
        score_captions(mdc, image, [], "heuristic")
    with pytest.raises(ValueError, match="context holds 22"):
        score_captions(mdc, image, [" ".join(["circle"] * 30)], "heuristic")
    with pytest.raises(ValueError, match="output vocabulary"):
        score_captions(mdc, image, ["a purple circle"], "heuristic")
    with pytest.raises(ValueError, match="do not pair"):
        score_tokens(mdc, image.expand(3, -1, -1), tokens_of(mdc, CAPTIONS[:2]), "ar")
