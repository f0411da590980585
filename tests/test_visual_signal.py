"""The visual learning signal under training conditions (mdc_core.eval.visual_signal): the image-gradient norm and
the PMI against hand computations, models built so that the signal falls with position on predictable captions
(or does not), and the pre-declared interaction and equivalence tests on them."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mdc_core.config import ObjectiveConfig
from mdc_core.eval.claims import evaluate_claims, gather_tables
from mdc_core.eval.stats import HOLDS, NOT_EQUIVALENT
from mdc_core.eval.visual_signal import (
    paired_contrast,
    signal_markdown,
    signal_result,
    signal_table,
    token_gradient_norms,
    token_pmi,
    visual_signal,
)
from mdc_core.tokenizer import EMBED_SIZE, EOT_ID, MASK_ID, PAD_ID, SOT_ID

V = 8  # logits per position (token ids 1..7 are their own output rows)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one thread (a busy shared CPU makes the thread pool cost 1000x the arithmetic)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


class Linear(nn.Module):
    """logits[b, j, v] = c_j * sum_m image_tokens[b, m, v] with c_j = j + 1 (output column j): a tiny linear
    captioner whose gradients are computed by hand."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal
        self.dummy = nn.Parameter(torch.zeros(()))
        self.register_buffer("output_index", torch.arange(EMBED_SIZE))

    def encode_image(self, images):
        return images[:, 0, :, :V]  # (B, M, V)

    def decode(self, tokens, image_tokens, select=None, causal=None):
        c = torch.arange(tokens.shape[1], dtype=torch.float32) + 1  # (L,)
        logits = c[None, :, None] * image_tokens.sum(1)[:, None, :]  # (B, L, V)
        return logits if select is None else logits[select]


def caption(words, length=6):
    row = [SOT_ID, *words, EOT_ID]
    return row + [PAD_ID] * (length - len(row))


def test_gradient_norm_of_a_linear_captioner_by_hand():
    """Zero image tokens: softmax uniform, ||p - e_y||^2 = (7/8)^2 + 7/64 = 7/8; the gradient with respect to each
    of the M = 2 image tokens is c * (p - e_y), so the norm is c * sqrt(2 * 7/8) = c * sqrt(7) / 2 (times w)."""
    tokens = torch.tensor([caption([1, 2, 3]), caption([4, 5])])
    image_tokens = torch.zeros(2, 2, V)
    unit = math.sqrt(7) / 2
    # teacher forcing: caption position i (column i + 1) is predicted by output column i: c = i + 1
    tf = token_gradient_norms(Linear(True), image_tokens, tokens, None, torch.ones(2))
    assert tf.tolist() == pytest.approx([1 * unit, 2 * unit, 3 * unit, 1 * unit, 2 * unit])
    # masked: the token at column j is predicted at column j (c = j + 1), times the caption's weight 1/t
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[0, 2], mask[1, 1], mask[1, 2] = True, True, True
    masked = token_gradient_norms(Linear(False), image_tokens, tokens, mask, torch.tensor([2.0, 1.0]))
    assert masked.tolist() == pytest.approx([2 * 3 * unit, 2 * unit, 3 * unit])


def test_pmi_against_a_hand_computation():
    """Three one-word captions (word 1, 1, 2), teacher forcing (c = 1), K = 2 other images: caption 0 meets
    images 2 and 1 (the batch rolled by 1 and 2)."""
    codes = torch.zeros(3, 1, 1, V)
    codes[0, 0, 0, 1] = 2.0  # image 0 favours word 1
    codes[2, 0, 0, 2] = 1.0  # image 2 favours word 2; image 1 is blank
    tokens = torch.tensor([caption([1], 4), caption([1], 4), caption([2], 4)])
    model = Linear(True)
    pmi = token_pmi(model, model.encode_image(codes), tokens, None, others=2)
    e = math.e
    p0 = e ** 2 / (e ** 2 + 7)  # word 1 under image 0
    by_hand_0 = math.log(p0) - math.log((1 / (e + 7) + 1 / 8) / 2)  # images 2, 1
    by_hand_1 = math.log(1 / 8) - math.log((p0 + 1 / (e + 7)) / 2)  # caption 1: images 0, 2
    by_hand_2 = math.log(e / (e + 7)) - math.log((1 / 8 + 1 / (e ** 2 + 7)) / 2)  # caption 2: images 1, 0
    assert pmi.tolist() == pytest.approx([by_hand_0, by_hand_1, by_hand_2], abs=1e-6)
    with pytest.raises(ValueError, match="at least one other image"):
        token_pmi(model, model.encode_image(codes[:1]), tokens[:1], None, others=2)


class Copier(nn.Module):
    """The paper's mechanism built in. Image token i (i < 8) codes caption position i (+3 on its word, plus
    noise); image token 8 flags a predictable caption, whose words 5-8 restate words 1-4. The logits for caption
    position i are image token i, plus +8 on the word at the aligned place of the other clause when the decoder
    sees it there (`copy`) on a flagged image. A causal decoder sees only the prefix (it copies the second clause
    from the first); a masked one sees the unmasked tokens on both sides (either clause from the other), unless
    `prefix_only` (a masked model that copies only from the left, as a causal one would)."""

    def __init__(self, causal: bool, copy: bool = True, prefix_only: bool = False):
        super().__init__()
        self.causal, self.copy, self.prefix_only = causal, copy, prefix_only
        self.dummy = nn.Parameter(torch.zeros(()))
        self.register_buffer("output_index", torch.arange(EMBED_SIZE))

    def encode_image(self, images):
        return images[:, 0, :, :V]  # (B, 9, V)

    def decode(self, tokens, image_tokens, select=None, causal=None):
        causal = self.causal if causal is None else causal
        B, L = tokens.shape
        flagged = image_tokens[:, 8, 0] > 0.5  # (B,)
        columns = []
        for j in range(L):
            t = j + 1 if causal else j  # the column this output predicts
            logit = image_tokens[:, t - 1] if 1 <= t <= 8 else torch.zeros(B, V)
            sources = (t - 4,) if causal or self.prefix_only else (t - 4, t + 4)
            for src in sources:
                if not (self.copy and 1 <= t <= 8 and 1 <= src <= 8 and src < L):
                    continue
                word = tokens[:, src]
                seen = flagged & (word >= 1) & (word < V)  # (B,) a visible caption word ([MASK] is not)
                logit = logit + 8.0 * F.one_hot(word.clamp(0, V - 1), V) * seen[:, None]
            columns.append(logit)
        logits = torch.stack(columns, dim=1)  # (B, L, V)
        return logits if select is None else logits[select]


def clause_batches(n=128, batch=16, seed=0):
    """Every other caption predictable (words 5-8 restate words 1-4, image flagged), the others 8 free words;
    words 1-7."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for start in range(0, n, batch):
        tokens = torch.full((batch, 11), PAD_ID)
        images = torch.zeros(batch, 3, 9, V)
        groups = []
        for b in range(batch):
            predictable = (start + b) % 2 == 0
            words = torch.randint(1, 8, (8,), generator=gen)
            if predictable:
                words[4:] = words[:4]
            tokens[b, 0], tokens[b, 1:9], tokens[b, 9] = SOT_ID, words, EOT_ID
            images[b, 0, :8] = torch.randn(8, V, generator=gen) + 3 * F.one_hot(words, V)
            images[b, 0, 8, 0] = float(predictable)
            groups.append("predictable" if predictable else "unpredictable")
        out.append((images, tokens, groups))
    return out


def _claims(arc: nn.Module, mdc: nn.Module, n: int = 96, t_low: float = 0.5):
    mdc_cfg = ObjectiveConfig(name="mdc", t_low=t_low, t_high=1.0)
    arc_scores = visual_signal(arc, clause_batches(n), grad_limit=n, pmi_images=4)
    mdc_scores = visual_signal(mdc, clause_batches(n), objective=mdc_cfg, draws=4, grad_limit=n, pmi_images=4)
    result = signal_result([arc_scores, mdc_scores], [{"objective": "arc"}, {"objective": "mdc"}], n_boot=1000)
    table = signal_table(result)
    gathered = gather_tables([("run", 0, {"tables": {"visual_signal": table}})])
    return result, table, {r["key"]: r for r in evaluate_claims(gathered, measured_only=True)}


def test_the_interaction_test_tells_a_copying_model_from_one_that_does_not_copy():
    result, table, claims = _claims(Copier(True), Copier(False))
    assert [r["objective"] for r in result["runs"]] == ["arc", "mdc"] and set(result) >= {"gradient", "pmi"}
    arc_grad = result["gradient"]["runs"][0]["slope"]
    assert arc_grad["predictable"]["high"] < 0 < arc_grad["unpredictable"]["high"]  # falls only where predictable
    assert table["values"]["ARC"]["gradient: predictable - unpredictable"] < -0.3
    assert claims["visual_signal"]["verdict"] == HOLDS  # ARC's contrast below MDC's, gradient and PMI
    assert {p["column"] for p in claims["visual_signal"]["parts"]} == {"gradient: predictable - unpredictable",
                                                                       "PMI: predictable - unpredictable"}
    assert claims["visual_signal_mdc"]["verdict"] != NOT_EQUIVALENT  # copies from both sides: no position trend
    _, _, none = _claims(Copier(True, copy=False), Copier(False, copy=False))
    assert none["visual_signal"]["verdict"] != HOLDS  # nothing predictable is used: no interaction
    # a masked model that copies only leftwards (trained at t ~ U[0.2, 1], so the source is often visible)
    _, _, left = _claims(Copier(True), Copier(False, prefix_only=True), n=160, t_low=0.2)
    assert left["visual_signal_mdc"]["verdict"] == NOT_EQUIVALENT
    assert "gradient" in signal_markdown(result, {"arc": "ARC", "mdc": "MDC"})


def test_masked_draws_use_the_training_distribution_and_the_cost_bound():
    """MDC's masks come from t ~ U[0.5, 1] (never ratio 1 alone), and only the first grad_limit captions get a
    gradient; the PMI covers every caption."""
    mdc_cfg = ObjectiveConfig(name="mdc", t_low=0.5, t_high=1.0)
    scores = visual_signal(Linear(False), clause_batches(n=32), objective=mdc_cfg, draws=2, grad_limit=5)
    assert len(scores.gradient) == 5 and len(scores.pmi) == 32 and scores.mode == "masked"
    scored = sum(v is not None for row in scores.pmi for v in row)
    assert 0.5 * 32 * 8 < scored < 32 * 8  # two draws at ratios in [0.5, 1): most, not all, tokens scored
    with pytest.raises(ValueError, match="needs its objective config"):
        visual_signal(Linear(False), clause_batches(n=16))
    with pytest.raises(ValueError, match="draws >= 1"):
        visual_signal(Linear(True), clause_batches(n=16), draws=0)


def test_paired_contrast_pairs_the_kth_captions_of_the_two_groups():
    slopes = [1.0, 0.5, None, 0.25, 3.0, 0.0]
    groups = ["predictable", "unpredictable", "predictable", "unpredictable", "predictable", "unpredictable"]
    assert paired_contrast(slopes, groups) == [0.5, 2.75]  # (1.0 - 0.5), (3.0 - 0.25); the extra 0.0 left out


def test_masked_tokens_are_what_a_masked_model_is_scored_on():
    tokens = torch.tensor([caption([1, 2, 3])])
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[0, 1] = True
    norms = token_gradient_norms(Linear(False), torch.zeros(1, 2, V), tokens, mask, torch.ones(1))
    assert len(norms) == 1 and MASK_ID not in tokens  # the function masks a copy; the caller's tokens unchanged
