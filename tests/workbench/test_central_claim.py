"""The central claim's one measure (mdc_workbench.eval.central_claim): the image-gradient norm by hand, the
in-distribution PMI on a hand computation and on a constructed case whose true PMI is known, the statistics per
caption, and the declared tests on models built to show them or not: the mechanism check (the interaction on
captions whose second clause copies the first) and the paper's sentence on content words (ARC's fall, MDC's
flatness inside / outside its margin; tests/test_sentence_claim.py has the sentence's conjunction by hand)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mdc_core.config import ObjectiveConfig
from mdc_core.tokenizer import EMBED_SIZE, EOT_ID, MASK_ID, PAD_ID, SOT_ID
from mdc_workbench.eval.central_claim import (
    ClaimScores,
    bin_deviations,
    caption_items,
    claim_markdown,
    claim_table,
    connector_ids,
    feature_order_table,
    in_distribution_pmi,
    score_captions,
    slope,
    token_gradient_norms,
    token_pmi,
)
from mdc_workbench.eval.claims import evaluate_claims, gather_tables
from mdc_workbench.eval.paper import CENTRAL_TABLE, FLAT_MARGIN
from mdc_workbench.eval.stats import EQUIVALENT, HOLDS, NOT_EQUIVALENT, REVERSED, UNMEASURED
from tests.train_helpers import one_thread  # noqa: F401 - a fixture

V = 8  # logits per position (token ids 1..7 are their own output rows)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: one thread


def caption(words, length=6):
    row = [SOT_ID, *words, EOT_ID]
    return row + [PAD_ID] * (length - len(row))


class Linear(nn.Module):
    """logits[b, j, v] = c_j * sum_m image_tokens[b, m, v] with c_j = j + 1 (output column j)."""

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


def test_gradient_norm_of_a_linear_captioner_by_hand():
    """Zero image tokens: softmax uniform, ||p - e_y||^2 = 7/8; the gradient with respect to each of the M = 2 image
    tokens is c * (p - e_y), so the norm is c * sqrt(7) / 2 (times the caption's weight)."""
    tokens = torch.tensor([caption([1, 2, 3]), caption([4, 5])])
    image_tokens = torch.zeros(2, 2, V)
    unit = math.sqrt(7) / 2
    tf = token_gradient_norms(Linear(True), image_tokens, tokens, None, torch.ones(2))
    assert tf.tolist() == pytest.approx([1 * unit, 2 * unit, 3 * unit, 1 * unit, 2 * unit])
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[0, 2], mask[1, 1], mask[1, 2] = True, True, True
    masked = token_gradient_norms(Linear(False), image_tokens, tokens, mask, torch.tensor([2.0, 1.0]))
    assert masked.tolist() == pytest.approx([2 * 3 * unit, 2 * unit, 3 * unit])
    assert MASK_ID not in tokens  # the caller's tokens are not masked in place


def test_in_distribution_pmi_by_hand():
    """Pool of two: p(token | ctx, I) = 0.5 (true), 0.1; p(ctx | I) = 0.2, 0.6. Weights 0.25, 0.75; the marginal
    0.25 * 0.5 + 0.75 * 0.1 = 0.2; PMI = log(0.5 / 0.2). Equal weights would give log(0.5 / 0.3)."""
    log_p = torch.log(torch.tensor([[0.5], [0.1]], dtype=torch.float64))
    log_ctx = torch.log(torch.tensor([[0.2], [0.6]], dtype=torch.float64))
    assert in_distribution_pmi(log_p, log_ctx).item() == pytest.approx(math.log(2.5))
    assert in_distribution_pmi(log_p, torch.zeros_like(log_p)).item() == pytest.approx(math.log(0.5 / 0.3))
    with pytest.raises(ValueError, match="same shape"):
        in_distribution_pmi(log_p, log_ctx[:, :0])
    with pytest.raises(ValueError, match="P >= 2"):
        in_distribution_pmi(log_p[:1], log_ctx[:1])


class Determined(nn.Module):
    """A constructed case with a known PMI. Images are ids 1-3; a caption is (a, b) with a = the image's id and
    b = a + 3: b is fully determined by the previous word, so its PMI given a is 0, whatever the image. The model
    is exact in distribution, and off distribution (a caption read under an image it contradicts) it follows the
    image, as the trained captioners did: p(b | a, I) puts its mass on I + 3. `sharp` is the logit margin."""

    def __init__(self, causal: bool, sharp: float = 40.0):
        super().__init__()
        self.causal, self.sharp = causal, sharp
        self.dummy = nn.Parameter(torch.zeros(()))
        self.register_buffer("output_index", torch.arange(EMBED_SIZE))

    def encode_image(self, images):
        return images[:, :1, 0, :1]  # (B, 1, 1): the image id

    def decode(self, tokens, image_tokens, select=None, causal=None):
        causal = self.causal if causal is None else causal
        image = image_tokens[:, 0, 0].long()  # (B,)
        columns = []
        for j in range(tokens.shape[1]):
            target = j + 1 if causal else j  # the caption column this output predicts
            word = image if target == 1 else image + 3  # a = I; b follows the image
            columns.append(self.sharp * F.one_hot(word.clamp(0, V - 1), V).float())
        logits = torch.stack(columns, dim=1)  # (B, L, V)
        return logits if select is None else logits[select]


def determined_batch():
    ids = torch.tensor([1, 2, 3])
    images = ids.float()[:, None, None, None].expand(3, 3, 1, 1).clone()
    tokens = torch.tensor([caption([int(a), int(a) + 3], 4) for a in ids])
    return images, tokens


@pytest.mark.parametrize("causal", [True, False])
def test_a_word_determined_by_the_previous_one_has_pmi_zero_whatever_the_image(causal):
    """Pool of the 3 distinct images: the first word's PMI is log 3 (the image picks it out of three equally likely
    ones), the second's 0. The retired equal-weight marginal asks how b reads under images that contradict a and
    gives log 3 there too (cue conflict, not information)."""
    model = Determined(causal)
    images, tokens = determined_batch()
    v = model.encode_image(images)
    mask = None
    if not causal:  # the second word masked, the first visible: its context is the first word
        mask = torch.zeros_like(tokens, dtype=torch.bool)
        mask[:, 2] = True
    pmi = token_pmi(model, v, tokens, mask, pool=2)
    if causal:
        assert pmi.view(3, 2)[:, 0].tolist() == pytest.approx([math.log(3)] * 3, abs=1e-9)
        assert pmi.view(3, 2)[:, 1].tolist() == pytest.approx([0.0] * 3, abs=1e-9)
    else:
        assert pmi.tolist() == pytest.approx([0.0] * 3, abs=1e-9)
    # the old estimator (equal weights over the other images) on the same model: far from the true 0
    from mdc_workbench.eval.central_claim import token_log_probs
    log_p = torch.stack([token_log_probs(model, v.roll(s, 0), tokens, mask).double() for s in range(3)])
    equal = in_distribution_pmi(log_p, torch.zeros_like(log_p))
    second = equal.view(3, -1)[:, -1]
    assert second.tolist() == pytest.approx([math.log(3)] * 3, abs=1e-6)
    with pytest.raises(ValueError, match="at least one other image"):
        token_pmi(model, v[:1], tokens[:1], mask if mask is None else mask[:1], pool=2)


def test_masked_context_likelihood_uses_only_the_visible_words():
    """Both words masked: the context is empty, every pool image weighs the same, and each word's PMI is log 3."""
    model = Determined(False)
    images, tokens = determined_batch()
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, 1:3] = True
    pmi = token_pmi(model, model.encode_image(images), tokens, mask, pool=2)
    assert pmi.tolist() == pytest.approx([math.log(3)] * 6, abs=1e-9)


def test_caption_statistics_by_hand():
    assert slope([1.0, 2.0, 3.0]) == pytest.approx(2.0)  # x = 0, 0.5, 1
    assert slope([1.0, None, 3.0, 0.0], drop=[3]) == pytest.approx(3.0)  # x = 0, 2/3 kept
    assert slope([1.0]) is None
    assert bin_deviations([2.0, 2.0, 2.0, 2.0, 2.0]) == [0.0] * 5
    assert bin_deviations([4.0, 0.0], bins=2) == [2.0, -2.0]
    stats = caption_items([[2.0, 2.0, 2.0, 2.0, 2.0, 2.0], [4.0, 0.0, 0.0, 0.0, 0.0, 0.0]],
                          [[1, 2, 3, 4, 5, 6]] * 2, "gradient", connectors={4})
    # normaliser: mean over 12 tokens = 16 / 12; caption 2 normalised: 3, 0, ... -> first fifth 3 - 0.5, last -0.5
    assert stats["fall"] == pytest.approx([0.0, 3.0])
    assert stats["bin 1"][1] == pytest.approx(2.5) and stats["log slope"][1] is None  # log 0 is not scored
    assert stats["slope w/o first and connector"][1] == pytest.approx(0.0)  # left: 0s only


V2 = 8


class Copier(nn.Module):
    """The paper's mechanism built in (as in the retired visual_signal tests). Image token i (i < 8) codes caption
    position i; image token 8 flags a predictable caption, whose words 5-8 restate words 1-4. The logits for
    caption position i are image token i, plus +8 on the word at the aligned place of the other clause when the
    decoder sees it there (`copy`) on a flagged image; causal: only the prefix; masked: both sides unless
    `prefix_only`."""

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
            t = j + 1 if causal else j
            logit = image_tokens[:, t - 1] if 1 <= t <= 8 else torch.zeros(B, V)
            sources = (t - 4,) if causal or self.prefix_only else (t - 4, t + 4)
            for src in sources:
                if not (self.copy and 1 <= t <= 8 and 1 <= src <= 8 and src < L):
                    continue
                word = tokens[:, src]
                seen = flagged & (word >= 1) & (word < V)
                logit = logit + 8.0 * F.one_hot(word.clamp(0, V - 1), V) * seen[:, None]
            columns.append(logit)
        logits = torch.stack(columns, dim=1)
        return logits if select is None else logits[select]


def clause_batches(n=96, batch=16, seed=0, groups=True):
    """Every other caption predictable (words 5-8 restate words 1-4, image flagged), the others 8 free words.
    `groups` False: the same captions labelled as short ones (group ``all``)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for start in range(0, n, batch):
        tokens = torch.full((batch, 11), PAD_ID)
        images = torch.zeros(batch, 3, 9, V)
        names = []
        for b in range(batch):
            predictable = (start + b) % 2 == 0
            words = torch.randint(1, 8, (8,), generator=gen)
            if predictable:
                words[4:] = words[:4]
            tokens[b, 0], tokens[b, 1:9], tokens[b, 9] = SOT_ID, words, EOT_ID
            images[b, 0, :8] = torch.randn(8, V, generator=gen) + 3 * F.one_hot(words, V)
            images[b, 0, 8, 0] = float(predictable)
            names.append(("predictable" if predictable else "unpredictable") if groups else "all")
        out.append((images, tokens, names))
    return out


def _claims(arc: nn.Module, mdc: nn.Module, n: int = 96, t_low: float = 0.5):
    cfg = ObjectiveConfig(name="mdc", t_low=t_low, t_high=1.0)
    scores = {kind: {"ARC": score_captions(arc, clause_batches(n, groups=kind == "clauses"), pool=3),
                     "MDC": score_captions(mdc, clause_batches(n, groups=kind == "clauses"), objective=cfg, pool=3)}
              for kind in ("short", "clauses")}
    table = claim_table(scores, connectors=set())
    gathered = gather_tables([("run", 0, {"tables": {CENTRAL_TABLE: table}})])
    return table, {r["key"]: r for r in evaluate_claims(gathered, measured_only=True)}


def test_the_mechanism_check_tells_a_copying_arc_from_one_that_does_not_copy():
    table, claims = _claims(Copier(True), Copier(False))
    arc = table["values"]["ARC"]
    assert arc["clauses gradient: slope, predictable - unpredictable"] < -0.3
    assert arc["clauses gradient: fall"] > 0 and arc["short gradient: fall"] > 0
    check = claims["central_claim_mechanism"]
    assert check["kind"] == "check" and check["verdict"] == HOLDS
    assert [p["column"] for p in check["parts"]] == ["clauses gradient: slope, predictable - unpredictable"]
    assert "copies the first word for word" in check["tested_as"]  # the construction named beside the number
    assert {"central_claim_pmi", "central_claim_robustness", "central_claim_slopes"} <= set(claims)
    # the pool's limit, declared with the measure: once ARC's prefix singles out its image among the pool, the PMI
    # falls on unpredictable captions too (-log w_true bounds it), so the PMI is descriptive, not the test
    assert arc["clauses PMI: slope, unpredictable"] < -1 and arc["clauses gradient: slope, unpredictable"] > -0.5
    # the Copier's captions are punctuation ids, no content word: the sentence's statistic is not measured on them
    assert claims["central_claim"]["verdict"] == UNMEASURED and "content slope" not in " ".join(arc)
    assert "short" in claim_markdown(table) and "clauses" in claim_markdown(table)


CONTENT_CAPTION = "top white red large circle left small blue star right"  # 10 content words, one BPE token each


def linear_profile(fall: float, n: int = 200, length: int = 10, noise: float = 0.05, seed: int = 0,
                   tokens: list[int] | None = None) -> ClaimScores:
    """Captions whose gradient is 1 + fall * (0.5 - x) plus noise (x: relative position); PMI the same."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.arange(length) / (length - 1)
    rows = [(1 + fall * (0.5 - x) + noise * torch.randn(length, generator=gen)).tolist() for _ in range(n)]
    ids = list(range(1, length + 1)) if tokens is None else tokens
    return ClaimScores("masked", ["all"] * n, [ids] * n, rows, rows)


def _content_ids() -> list[int]:
    from mdc_core.tokenizer import CaptionTokenizer

    ids = CaptionTokenizer(77).encode_text(CONTENT_CAPTION)
    assert len(ids) == 10
    return ids


@pytest.mark.parametrize("mdc_fall, verdict", [(0.1, EQUIVALENT), (0.6, NOT_EQUIVALENT)])
def test_flatness_on_content_words_inside_and_outside_its_margin(mdc_fall, verdict):
    """The caption's signal 1 + f (0.5 - x) has mean 1 over the evenly spaced positions, so its content slope is
    -f: MDC's f = 0.1 is inside +-0.2, 0.6 outside. ARC falls by 1: its part holds, and the sentence holds only
    with MDC flat."""
    ids = _content_ids()
    scores = {"short": {"ARC": linear_profile(1.0, tokens=ids), "MDC": linear_profile(mdc_fall, seed=1, tokens=ids)}}
    table = claim_table(scores, connectors=set())
    assert table["values"]["ARC"]["short gradient: content slope"] == pytest.approx(-1.0, abs=0.01)
    assert table["values"]["MDC"]["short gradient: content slope"] == pytest.approx(-mdc_fall, abs=0.01)
    gathered = gather_tables([("run", 0, {"tables": {CENTRAL_TABLE: table}})])
    claims = {r["key"]: r for r in evaluate_claims(gathered, measured_only=True)}
    flat = claims["central_claim_flat"]
    assert flat["verdict"] == verdict and [p["margin"] for p in flat["parts"]] == [FLAT_MARGIN]
    assert claims["central_claim_arc"]["verdict"] == HOLDS
    assert claims["central_claim"]["verdict"] == (HOLDS if verdict == EQUIVALENT else REVERSED)
    assert claims["central_claim"]["missing"] == ["column clauses gradient: content slope"]  # one kind only here


def test_the_sentence_is_reversed_where_arc_rises_even_with_mdc_flat():
    """ARC's signal rises along the caption (as it did on short captions, 2026-11-28) and MDC's is flat: the flat
    half is equivalent, ARC's half reversed, so the sentence, which needs both, is reversed (before, a margin
    relative to ARC's fall had no scale there and MDC's flatness went unmeasured). Nothing copied: no mechanism."""
    ids = _content_ids()
    table = claim_table({"short": {"ARC": linear_profile(-1.0, tokens=ids),
                                   "MDC": linear_profile(0.0, seed=1, tokens=ids)}}, set())
    gathered = gather_tables([("run", 0, {"tables": {CENTRAL_TABLE: table}})])
    claims = {r["key"]: r for r in evaluate_claims(gathered)}
    assert claims["central_claim_flat"]["verdict"] == EQUIVALENT and claims["central_claim_arc"]["verdict"] == REVERSED
    assert claims["central_claim"]["verdict"] == REVERSED
    _, claims = _claims(Copier(True, copy=False), Copier(False, copy=False))
    assert claims["central_claim_mechanism"]["verdict"] != HOLDS


def test_both_caption_kinds_score_the_same_captions_in_every_row():
    a = ClaimScores("masked", ["all"], [[1, 2]], [[1.0, 2.0]], [[0.1, 0.2]])
    b = ClaimScores("masked", ["all", "all"], [[1, 2], [3, 4]], [[1.0, 2.0]] * 2, [[0.1, 0.2]] * 2)
    with pytest.raises(ValueError, match="scored different captions"):
        claim_table({"short": {"ARC": a, "MDC": b}}, set())
    with pytest.raises(ValueError, match="caption kind must be one of"):
        claim_table({"long": {"ARC": a}}, set())


def test_training_conditions_and_bad_input():
    cfg = ObjectiveConfig(name="mdc", t_low=0.5, t_high=1.0)
    scores = score_captions(Linear(False), clause_batches(n=32), objective=cfg, draws=2, pool=2)
    scored = sum(v is not None for row in scores.pmi for v in row)
    assert len(scores.gradient) == 32 and 0.5 * 32 * 8 < scored < 32 * 8  # ratios in [0.5, 1): most tokens
    with pytest.raises(ValueError, match="needs its objective config"):
        score_captions(Linear(False), clause_batches(n=16))
    with pytest.raises(ValueError, match="draws >= 1"):
        score_captions(Linear(True), clause_batches(n=16), draws=0)


def test_the_connectors_are_single_tokens():
    assert len(connector_ids()) == 2


def test_linked_data_put_either_attribute_last_and_link_shape_to_colour():
    import json

    from mdc_workbench.data.captions import LINK_SHARE, linked_shape, order_caption
    from mdc_workbench.data.scene import get_difficulty
    from mdc_workbench.data.synth import make_example

    shapes = get_difficulty("easy").shapes
    for order, words in (("shape_last", lambda m: f"a {m['colour']} {m['shape']}"),
                         ("colour_last", lambda m: f"a {m['shape']} in {m['colour']}")):
        metas = [json.loads(make_example(0, "train", i, captions=order, difficulty="easy")["json"]) for i in range(300)]
        assert all(m["caption"] == words(m["labels"]) for m in metas)
        linked = sum(m["labels"]["shape"] == linked_shape(m["labels"]["colour"], shapes) for m in metas) / len(metas)
        assert 0.65 < linked <= LINK_SHARE + 0.2 / len(shapes) + 0.05  # held-out pairs stay as drawn
    short = [json.loads(make_example(0, "train", i, captions="short", difficulty="easy")["json"])["labels"]
             for i in range(300)]
    unlinked = sum(m["shape"] == linked_shape(m["colour"], shapes) for m in short) / len(short)
    assert unlinked < 0.35  # the probe images (short captions): the link broken, chance is 1 / 5
    with pytest.raises(ValueError, match="caption order must be one of"):
        order_caption(None, "short")


def _probe(correct_shape, correct_colour):
    return {"tasks": {"shape": {"test_correct": correct_shape}, "colour": {"test_correct": correct_colour}}}


def test_feature_order_table_and_its_check_by_hand():
    """ARC reads shape on 3 of 4 images when shape comes first (colour_last) and 1 of 4 when it comes last: penalty
    50 points; colour 25. MDC: 0 and 0. The interaction, ARC's mean penalty minus MDC's, is 37.5."""
    results = {"colour_last": {"ARC": _probe([1, 1, 1, 0], [1, 0, 1, 1]), "MDC": _probe([1, 0, 1, 0], [1, 1, 0, 1])},
               "shape_last": {"ARC": _probe([1, 0, 0, 0], [1, 1, 1, 1]), "MDC": _probe([1, 0, 1, 0], [1, 1, 0, 1])}}
    table = feature_order_table(results)
    assert table["values"]["ARC"]["shape: late penalty"] == pytest.approx(50.0)
    assert table["values"]["ARC"]["colour: late penalty"] == pytest.approx(25.0)
    assert table["values"]["ARC"]["late penalty"] == pytest.approx(37.5)
    assert table["values"]["MDC"]["late penalty"] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="both caption orders"):
        feature_order_table({"shape_last": results["shape_last"]})
    big = {o: {r: _probe(p["tasks"]["shape"]["test_correct"] * 50, p["tasks"]["colour"]["test_correct"] * 50)
               for r, p in rows.items()} for o, rows in results.items()}
    gathered = gather_tables([("run", 0, {"tables": {"feature_order": feature_order_table(big)}})])
    check = next(r for r in evaluate_claims(gathered) if r["key"] == "feature_order")
    assert check["kind"] == "check" and check["verdict"] == HOLDS
    # shape is the primary attribute (issue 61): the check reads ARC's shape penalty minus MDC's, 50 - 0
    assert [p["column"] for p in check["parts"]] == ["shape: late penalty"]
    assert check["parts"][0]["difference"]["mean"] == pytest.approx(50.0)


def test_cli_measures_both_caption_kinds_and_writes_table_and_plot(tmp_path, capsys):
    from mdc_core.checkpoint import save_checkpoint
    from mdc_core.config import DataConfig, RunConfig
    from mdc_core.data import iter_captions
    from mdc_core.factory import create_model
    from mdc_core.tokenizer import build_output_vocab
    from mdc_workbench.cli import main
    from mdc_workbench.data import write_synthetic_dataset
    from tests.conftest import micro_config

    data = {}
    for kind in ("short", "clauses"):
        data[kind] = tmp_path / kind
        write_synthetic_dataset(data[kind], 8, image_size=32, n_val=2, n_test=8, n_compgen=2, progress=False,
                                workers=1, captions=kind, difficulty="easy")
    ids = build_output_vocab([*iter_captions(DataConfig(path=str(data["short"])), split="test"),
                              *iter_captions(DataConfig(path=str(data["clauses"])), split="test")])
    runs = {}
    for objective in ("arc", "mdc", "clip"):
        torch.manual_seed(0)
        cfg = RunConfig(model=micro_config(context_length=32, output_vocab="corpus", output_vocab_size=len(ids)),
                        objective=ObjectiveConfig(name=objective))
        save_checkpoint(tmp_path / objective, 1, cfg, create_model(cfg, objective, ids))
        runs[objective] = str(tmp_path / objective)
    out = tmp_path / "eval"
    argv = ["eval", "central-claim", "--short-runs", runs["arc"], runs["mdc"], "--short-data", str(data["short"]),
            "--clauses-runs", runs["arc"], runs["mdc"], "--clauses-data", str(data["clauses"]), "--limit", "8",
            "--batch-size", "4", "--draws", "2", "--pool", "3", "--out", str(out)]
    assert main(argv) == 0
    table = json.loads((out / "central_claim.json").read_text())["tables"][CENTRAL_TABLE]
    assert set(table["values"]) == {"ARC", "MDC"}
    assert {"short gradient: slope", "clauses gradient: slope, predictable - unpredictable"} <= set(
        table["values"]["ARC"])
    printed = capsys.readouterr().out
    assert "| short | gradient |" in printed and "| clauses | gradient |" in printed and "one training seed" in printed
    assert (out / "central_claim.png").read_bytes()[:4] == b"\x89PNG"
    bad = ["eval", "central-claim", "--short-runs", runs["clip"], "--short-data", str(data["short"]),
           "--clauses-runs", runs["arc"], "--clauses-data", str(data["clauses"]), "--out", str(out)]
    assert main(bad) == 2 and "needs a captioner" in capsys.readouterr().err
