"""Infilling prompts and conditional scores of the masked slots only."""

import pytest
import torch

from mdc_core.scoring import score_tokens
from mdc_core.tokenizer import EOT_ID, MASK_ID, SOT_ID, CaptionTokenizer, parse_prompt
from mdc_workbench.cli.scores import fill_prompt, prompt_text, score_fills

TOK = CaptionTokenizer(24)


def test_prompt_is_tokenised_in_place():
    ids, fixed = parse_prompt("a [MASK] square on the _", TOK)
    full = TOK.encode_text("a red square on the left")
    assert len(ids) == len(full) == 6
    assert fixed.tolist() == [True, False, True, True, True, False]
    assert ids[fixed].tolist() == [full[i] for i in (0, 2, 3, 4)]
    assert (ids[~fixed] == MASK_ID).all()
    assert prompt_text(ids, TOK) == "a _ square on the _"
    assert fill_prompt(ids, "red left", TOK).tolist() == full
    assert parse_prompt("A [mask] CIRCLE", TOK)[0].tolist() == parse_prompt("a _ circle", TOK)[0].tolist()
    assert parse_prompt("an_underscore _", TOK)[1].tolist().count(False) == 1  # "_" only as a word of its own


@pytest.mark.parametrize("text,message", [("", "empty"), ("a red square", "no slot"),
                                          ("_ " * 30, "context holds")])
def test_bad_prompts(text, message):
    with pytest.raises(ValueError, match=message):
        parse_prompt(text, TOK)


def test_fill_needs_one_token_per_slot():
    ids, _ = parse_prompt("a _ square", TOK)
    with pytest.raises(ValueError, match="1 slot"):
        fill_prompt(ids, "dark red", TOK)




def test_one_slot_conditional_score_is_the_exact_log_prob(tiny_model):
    model = tiny_model()
    image = model.encode_image(torch.randn(1, 3, 32, 32))
    recs = score_fills(model, image, "a _ square on the left", ["red", "blue", "green"], "heuristic")
    assert [r["score"] for r in recs] == sorted((r["score"] for r in recs), reverse=True)
    for rec in recs:
        tokens = TOK(rec["caption"])[:, :8]
        x = tokens.clone()
        x[0, 2] = MASK_ID
        with torch.no_grad():
            logp = model.decode(x, image).log_softmax(-1)[0, 2]  # (V,)
        exact = float(logp[model.output_index[tokens[0, 2]]])
        assert rec["score"] == pytest.approx(exact, abs=1e-4)
        assert rec["slot_logprobs"] == pytest.approx([exact], abs=1e-4)
        for method in ("mc", "ar"):  # with one slot every estimator is that same number
            other = next(r for r in score_fills(model, image, "a _ square on the left", [rec["fill"]], method,
                                                samples=8))
            assert other["score"] == pytest.approx(exact, abs=1e-4)
            if method == "mc":
                assert other["stderr"] == pytest.approx(0.0, abs=1e-5)


def test_two_slot_mc_matches_the_exact_conditional_elbo(tiny_model):
    model = tiny_model(seed=1)
    image = model.encode_image(torch.randn(1, 3, 32, 32))
    tokens = TOK(["a red square on the left"])[:, :8]  # <sot> a red square on the left <eot>
    fixed = torch.zeros_like(tokens, dtype=torch.bool)
    fixed[0, [1, 3, 4, 5]] = True  # free: 2 (red) and 6 (left)
    a, b = 2, 6

    def logp(masked: list[int], pos: int) -> float:
        x = tokens.clone()
        x[0, masked] = MASK_ID
        with torch.no_grad():
            lp = model.decode(x, image).log_softmax(-1)[0, pos]
        return float(lp[model.output_index[tokens[0, pos]]])

    # Eq. 8 over the two slots: l = 1: (2/1) * mean of the two single masks; l = 2: (2/2) * both masked
    exact = 0.5 * (2 * 0.5 * (logp([a], a) + logp([b], b))) + 0.5 * (logp([a, b], a) + logp([a, b], b))
    out = score_tokens(model, image, tokens, "mc", samples=2000, fixed=fixed)
    assert abs(float(out.score[0]) - exact) < 4 * float(out.stderr[0]) + 1e-6
    heur = score_tokens(model, image, tokens, "heuristic", fixed=fixed)
    assert (heur.order[0, [1, 3, 4, 5]] == -1).all() and sorted(heur.order[0, [a, b]].tolist()) == [0, 1]
    assert (heur.token_logprobs[0, [1, 3, 4, 5]] == 0).all()
    ar = score_tokens(model, image, tokens, "ar", fixed=fixed)
    assert float(ar.score[0]) == pytest.approx(logp([a, b], a) + logp([b], b), abs=1e-4)


def test_no_fixed_positions_gives_the_unconditional_scores(tiny_model):
    model = tiny_model()
    image = model.encode_image(torch.randn(1, 3, 32, 32))
    tokens = TOK(["a red square", "two blue circles and a cross"])
    none = torch.zeros_like(tokens, dtype=torch.bool)
    for method in ("mc", "heuristic", "ar"):
        a = score_tokens(model, image, tokens, method, samples=16)
        b = score_tokens(model, image, tokens, method, samples=16, fixed=none)
        assert torch.equal(a.score, b.score)


def test_conditional_scores_need_an_mdc_model_and_a_free_slot(tiny_model):
    arc = tiny_model(causal=True)
    image = arc.encode_image(torch.randn(1, 3, 32, 32))
    tokens = TOK(["a red square"])
    fixed = torch.zeros_like(tokens, dtype=torch.bool)
    fixed[0, 1] = True
    with pytest.raises(ValueError, match="ARC model"):
        score_tokens(arc, image, tokens, "ar", fixed=fixed)
    mdc = tiny_model()
    fixed[0, 1:4] = True
    with pytest.raises(ValueError, match="no free position"):
        score_tokens(mdc, image, tokens, "heuristic", fixed=fixed)
    assert tokens[0, 0] == SOT_ID and tokens[0, 4] == EOT_ID
