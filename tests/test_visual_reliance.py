"""Visual reliance along the caption: hand-computed values, models built to fade (or not), the two-clause caption
split of the embedded generator, the reliance_slope table and the CLI."""

import json
import math
from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from mdc_core.checkpoint import save_checkpoint
from mdc_core.cli import main
from mdc_core.config import DataConfig, ObjectiveConfig, RunConfig
from mdc_core.data import iter_captions, write_synthetic_dataset
from mdc_core.data.captions import CLAUSE_FACTS, clause_caption, parse_clause_caption
from mdc_core.data.scene import example_rng, sample_scene, vocabularies
from mdc_core.data.synth import make_example
from mdc_core.eval.reliance import (
    binned,
    caption_slope,
    clause_text_check,
    mean_reliance,
    relative_positions,
    slope_table,
    summarise_runs,
)
from mdc_core.eval.visual_reliance import reliance_table, token_reliance, training_ratios
from mdc_core.factory import create_model
from mdc_core.tokenizer import EMBED_SIZE, EOT_ID, MASK_ID, PAD_ID, SOT_ID, CaptionTokenizer, build_output_vocab

from .conftest import micro_config
from .test_position_signal import ImageScoresTokenOne

# ----------------------------------------------------------------------------------------------------------
# the statistics, by hand


def test_positions_slopes_bins_and_the_normaliser_by_hand():
    assert relative_positions(5).tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert relative_positions(1).tolist() == [0.0]
    assert caption_slope([3.0, 2.0, 1.0]) == pytest.approx(-2.0)  # x = 0, 0.5, 1
    assert caption_slope([1.0, None, 1.0, 5.0]) == pytest.approx(  # x = 0, 2/3, 1 scored: OLS by hand
        ((0 - 5 / 9) * (1 - 7 / 3) + (2 / 3 - 5 / 9) * (1 - 7 / 3) + (1 - 5 / 9) * (5 - 7 / 3))
        / ((5 / 9) ** 2 + (1 / 9) ** 2 + (4 / 9) ** 2))
    assert caption_slope([4.0]) is None and caption_slope([None, 2.0]) is None
    assert binned([1.0, 2.0, 3.0, 4.0, 5.0], 2) == [1.5, 4.0]  # x = 0, .25 | .5, .75, 1 (1 goes to the last bin)
    assert binned([1.0, None, 3.0], 4) == [1.0, None, None, 3.0]
    assert mean_reliance([[1.0, 2.0], [None, 6.0]]) == pytest.approx(3.0)
    assert math.isnan(mean_reliance([[None]]))


def test_summary_normalises_by_the_model_mean_and_pairs_the_difference():
    # run A: reliance 3 -> 1 along every caption (mean 2: normalised 1.5 -> 0.5, slope -1); run B: flat 4 (slope 0)
    captions_a = [[3.0, 2.0, 1.0]] * 12
    captions_b = [[4.0, 4.0, 4.0]] * 12
    groups = ["p"] * 6 + ["u"] * 6
    s = summarise_runs([captions_a, captions_b], groups, bins=3, n_boot=200)
    a, b = s["runs"]
    assert a["mean_reliance"] == pytest.approx(2.0) and b["mean_reliance"] == pytest.approx(4.0)
    assert a["slopes"] == [pytest.approx(-1.0)] * 12 and b["slopes"] == [pytest.approx(0.0)] * 12
    assert a["slope"]["p"]["mean"] == pytest.approx(-1.0) and a["slope"]["p"]["n"] == 6
    assert a["slope"]["p"]["low"] == pytest.approx(-1.0) and a["slope"]["p"]["high"] == pytest.approx(-1.0)
    assert a["profile"]["u"]["mean"] == [pytest.approx(1.5), pytest.approx(1.0), pytest.approx(0.5)]
    (diff,) = s["differences"]["p"]
    assert diff["run"] == 1 and diff["minus"] == 0 and diff["mean"] == pytest.approx(1.0)
    assert s["groups"] == ["p", "u"] and s["bin_centres"] == [pytest.approx(1 / 6), 0.5, pytest.approx(5 / 6)]


def test_group_contrast_and_interaction_by_hand():
    # run A falls on group p only (3 -> 1; flat 2 on u: mean 2, normalised slopes -1 and 0); run B is flat on both
    a = [[3.0, 2.0, 1.0]] * 10 + [[2.0, 2.0, 2.0]] * 10
    b = [[1.0, 1.0, 1.0]] * 20
    s = summarise_runs([a, b], ["p"] * 10 + ["u"] * 10, n_boot=200, contrast=("p", "u"))
    own_a, own_b, inter = s["contrasts"]
    assert (own_a["run"], own_a["minus"], own_a["mean"]) == (0, None, pytest.approx(-1.0))
    assert own_a["low"] == pytest.approx(-1.0) and own_a["high"] == pytest.approx(-1.0)
    assert (own_b["run"], own_b["mean"]) == (1, pytest.approx(0.0))
    assert (inter["run"], inter["minus"], inter["mean"]) == (1, 0, pytest.approx(1.0))
    assert "contrasts" not in summarise_runs([a], ["p"] * 20, n_boot=100, contrast=("p", "u"))


def test_a_model_without_a_resolved_positive_mean_reliance_is_not_normalised():
    s = summarise_runs([[[-1.0, 0.5]] * 3], ["all"] * 3, n_boot=100)
    (run,) = s["runs"]
    assert not run["normalised"] and run["slopes"] == [None] * 3 and run["slope"]["all"]["mean"] is None
    # a positive mean that noise could have made (interval reaching below 0): dividing by it would blow up
    noisy = [[1.0, 1.0]] * 20 + [[-0.95, -0.95]] * 20
    s = summarise_runs([noisy], ["all"] * 40, n_boot=500)
    (run,) = s["runs"]
    assert run["mean_reliance"] == pytest.approx(0.025) and run["mean_reliance_interval"][0] < 0
    assert not run["normalised"] and run["slope"]["all"]["mean"] is None


def test_the_bootstrap_recomputes_the_normaliser():
    # every caption falls by 1 nat from first to last token, at levels that differ: the per-caption slopes over a
    # fixed normaliser are all equal (a zero-width interval), but the normaliser itself is estimated from the
    # same captions, and recomputing it in each resample gives the interval its width
    levels = np.random.default_rng(0).uniform(1.0, 3.0, size=40)
    s = summarise_runs([[[a + 0.5, a, a - 0.5] for a in levels]], ["all"] * 40, n_boot=1000)
    run = s["runs"][0]
    assert run["slopes"] == [pytest.approx(-1.0 / levels.mean())] * 40
    slope = run["slope"]["all"]
    assert slope["mean"] == pytest.approx(-1.0 / levels.mean())
    assert slope["low"] < slope["mean"] < slope["high"]
    assert slope["high"] - slope["low"] > 0.02


def test_slope_table_format_pairs_captions_across_rows():
    slopes = [[-1.0, None, -0.5, 0.2, 0.0], [0.1, 0.3, None, -0.1, 0.2]]
    groups = ["predictable", "predictable", "predictable", "unpredictable", "unpredictable"]
    table = slope_table(slopes, groups, ["ARC", "MDC"])
    assert set(table) == {"metric", "values", "items"} and "mean reliance" in table["metric"]
    assert table["items"] == {"ARC": {"predictable": [-1.0], "unpredictable": [0.2, 0.0]},
                              "MDC": {"predictable": [0.1], "unpredictable": [-0.1, 0.2]}}
    assert table["values"]["ARC"] == {"predictable": -1.0, "unpredictable": pytest.approx(0.1)}
    assert table["values"]["MDC"]["unpredictable"] == pytest.approx(0.05)
    assert slope_table([[None, None]], ["all", "all"], ["MDC"]) == {"metric": table["metric"], "values": {},
                                                                   "items": {}}
    with pytest.raises(ValueError, match="row names"):
        slope_table(slopes, groups, ["ARC"])


# ----------------------------------------------------------------------------------------------------------
# the measure on constructed models




def ce(a: float, target: int) -> float:
    """CE of `target` under logits (0, a, 0, 0)."""
    return -math.log((math.exp(a) if target == 1 else 1.0) / (math.exp(a) + 3))


@pytest.mark.parametrize("causal", [True, False])
def test_hand_computed_reliance(causal):
    images = torch.stack([torch.full((3, 4, 4), 2.0), torch.full((3, 4, 4), 1.0)])  # mean pixels 2 and 1
    tokens = torch.tensor([[SOT_ID, 1, 2, 1, EOT_ID], [SOT_ID, 2, 1, EOT_ID, PAD_ID]])
    scores = token_reliance(ImageScoresTokenOne(causal), [(images, tokens, ["g", "h"])], ratios=[1.0], blind=True)
    assert scores.mode == ("teacher_forcing" if causal else "masked") and scores.groups == ["g", "h"]
    rel = scores.reliance()
    # caption 0 meets image 1 (a=1) as its mismatched image, caption 1 meets image 0 (a=2)
    assert rel[0] == [pytest.approx(ce(1, 1) - ce(2, 1)), pytest.approx(ce(1, 2) - ce(2, 2)),
                      pytest.approx(ce(1, 1) - ce(2, 1))]
    assert rel[1] == [pytest.approx(ce(2, 2) - ce(1, 2)), pytest.approx(ce(2, 1) - ce(1, 1))]
    blind = scores.reliance("blind")  # the blank image: a = 0
    assert blind[1] == [pytest.approx(ce(0, 2) - ce(1, 2)), pytest.approx(ce(0, 1) - ce(1, 1))]
    assert scores.loss_true[1][1] == pytest.approx(ce(1, 1))
    s = summarise_runs([rel], scores.groups, n_boot=100)
    m = (sum(rel[0]) + sum(rel[1])) / 5
    assert s["runs"][0]["mean_reliance"] == pytest.approx(m)
    assert s["runs"][0]["slopes"][1] == pytest.approx((rel[1][1] - rel[1][0]) / m)


class Fading(nn.Module):
    """A captioner built so that the image's say over the token at caption position p is w(p) = 1 - decay * p / 12:
    logits = w(p) * the image's code (one number per token), text ignored. decay 0: no fall with position."""

    def __init__(self, causal: bool, decay: float):
        super().__init__()
        self.causal, self.decay = causal, decay
        self.dummy = nn.Parameter(torch.zeros(()))
        self.register_buffer("output_index", torch.arange(EMBED_SIZE))

    def encode_image(self, images):
        return images[:, 0, 0, :8][:, None, :]  # (B, 1, 8): the code

    def decode(self, tokens, image_tokens, select=None, causal=None):
        causal = self.causal if causal is None else causal
        pos = (torch.arange(tokens.shape[1]) - (0 if causal else 1)).clamp(min=0)  # caption position per column
        w = (1 - self.decay * pos / 12).clamp(min=0)
        logits = w[None, :, None] * image_tokens  # (B, L, 8)
        return logits if select is None else logits[select]


def fading_batches(n=80, batch=16, seed=0):
    """Captions of 4-11 tokens (ids 1-7); each image's code favours its caption's words (+3 per mention) plus noise."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(0, n, batch):
        tokens = torch.full((batch, 13), PAD_ID)
        images = torch.zeros(batch, 3, 1, 8)
        for b in range(batch):
            k = int(torch.randint(4, 12, (1,), generator=gen))
            words = torch.randint(1, 8, (k,), generator=gen)
            tokens[b, 0], tokens[b, 1:k + 1], tokens[b, k + 1] = SOT_ID, words, EOT_ID
            images[b, 0, 0] = torch.randn(8, generator=gen) + 3 * torch.bincount(words, minlength=8)[:8]
        out.append((images, tokens, ["all"] * batch))
    return out


@pytest.mark.parametrize("causal", [True, False])
def test_a_model_built_to_fade_has_a_resolved_negative_slope_and_a_flat_one_none(causal):
    fall = token_reliance(Fading(causal, decay=1.0), fading_batches(), ratios=[0.5, 1.0], draws=2)
    flat = token_reliance(Fading(causal, decay=0.0), fading_batches(), ratios=[0.5, 1.0], draws=2)
    s = summarise_runs([fall.reliance(), flat.reliance()], fall.groups, n_boot=1000)
    falling, level = s["runs"][0]["slope"]["all"], s["runs"][1]["slope"]["all"]
    assert falling["high"] < 0 and falling["mean"] < -0.5  # resolved: the interval excludes 0
    assert level["low"] < 0 < level["high"] and abs(level["mean"]) < 0.2
    assert s["differences"]["all"][0]["low"] > 0  # flat minus falling: resolved
    profile = s["runs"][0]["profile"]["all"]["mean"]
    assert profile[0] > 1 > profile[-1]  # normalised: starts above the model's mean, ends below


class Copier(nn.Module):
    """The paper's mechanism, built in, on the embedded two-clause captions. The image code (one logit per output
    row) is +4 on the scene words of its own caption; when the caption's connector "again" is visible (a
    restating caption) and so is the word at the aligned place of the other clause, that word gets +20: the text
    determines it. A causal decoder sees only the prefix, so only the second clause is copied; a masked one sees
    the unmasked tokens on both sides."""

    def __init__(self, causal: bool, rows: torch.Tensor, again: int):
        super().__init__()
        self.causal, self.again = causal, again
        self.dummy = nn.Parameter(torch.zeros(()))
        self.register_buffer("output_index", rows)
        self.v = int(rows.max()) + 1

    def encode_image(self, images):
        return images[:, 0, 0, : self.v][:, None, :]

    def decode(self, tokens, image_tokens, select=None, causal=None):
        causal = self.causal if causal is None else causal
        B, L = tokens.shape
        logits = image_tokens.expand(B, L, self.v).clone()
        for b in range(B):
            found = (tokens[b] == self.again).nonzero().flatten()
            if not len(found):
                continue  # no visible "again": nothing to copy
            c = int(found[0])  # columns: <sot> 1..k clause, "," at k + 1, "again" at c = k + 2, then the restatement
            for j in range(L):
                target = j + 1 if causal else j  # causal: output column j predicts column j + 1
                if target == c:
                    continue
                src = target - c if target > c else target + c
                if not 1 <= src < L or (causal and src > j) or tokens[b, src] == MASK_ID:
                    continue
                row = int(self.output_index[tokens[b, src]])
                if row >= 0:
                    logits[b, j, row] += 20.0
        return logits if select is None else logits[select]


def clause_examples(n=96, seed=0):
    out = []
    for i in range(n):
        rng = example_rng(seed, "test", i)
        scene = sample_scene(rng, set(), difficulty="easy")
        out.append(clause_caption(scene, rng))
    return out


def test_a_copying_causal_decoder_falls_on_predictable_captions_only_and_a_masked_one_nowhere():
    examples = clause_examples()
    tok = CaptionTokenizer(32)
    tokens = tok([e[0] for e in examples])
    ids = torch.unique(tokens[(tokens != PAD_ID) & (tokens != SOT_ID) & (tokens != EOT_ID)])
    rows = torch.full((EMBED_SIZE,), -1, dtype=torch.long)
    rows[ids] = torch.arange(len(ids))
    vocab = vocabularies("easy")
    scene_words = {w for k in ("size", "colour", "shape", "background") for w in vocab[k]} | {
        "top", "middle", "bottom", "left", "center", "right"}
    scene_ids = torch.tensor(sorted({i for w in scene_words for i in tok.encode_text(w)}))
    images = torch.zeros(len(examples), 3, 1, len(ids))
    for b in range(len(examples)):
        words = tokens[b][torch.isin(tokens[b], scene_ids)]
        images[b, 0, 0, rows[words]] = 4.0
    batches = [(images[i:i + 16], tokens[i:i + 16], [e[1] for e in examples[i:i + 16]])
               for i in range(0, len(examples), 16)]
    groups = [e[1] for e in examples]
    (again,) = tok.encode_text("again")
    arc = token_reliance(Copier(True, rows, again), batches)
    mdc = token_reliance(Copier(False, rows, again), batches, ratios=[0.5, 0.75, 1.0], draws=8)
    s = summarise_runs([arc.reliance(), mdc.reliance()], groups, n_boot=1000)
    a, m = s["runs"][0]["slope"], s["runs"][1]["slope"]
    assert a["predictable"]["high"] < -2.0  # restated words are copied from the prefix (a step 2 -> 0: -3)
    assert a["unpredictable"]["low"] < 0 < a["unpredictable"]["high"]  # new words keep needing the image
    for group in ("predictable", "unpredictable"):  # either mention is as often copied from the other side
        assert m[group]["low"] < 0 < m[group]["high"] and abs(m[group]["mean"]) < 0.3, (group, m[group])
    assert s["differences"]["predictable"][0]["low"] > 2.0  # MDC - ARC
    assert abs(s["differences"]["unpredictable"][0]["mean"]) < 0.3


def test_bad_input():
    model = ImageScoresTokenOne(True)
    images = torch.zeros(2, 3, 4, 4)
    tokens = torch.tensor([[SOT_ID, 1, EOT_ID], [SOT_ID, 2, EOT_ID]])
    with pytest.raises(ValueError, match=">= 2 images"):
        token_reliance(model, [(images[:1], tokens[:1], ["a"])])
    with pytest.raises(ValueError, match="groups"):
        token_reliance(model, [(images, tokens, ["a"])])
    with pytest.raises(ValueError, match="ratios"):
        token_reliance(ImageScoresTokenOne(False), [(images, tokens, ["a", "b"])], ratios=[0.0])
    with pytest.raises(ValueError, match="no caption"):
        token_reliance(model, [])


def test_training_ratios():
    def cfg(**kw):
        return RunConfig(objective=ObjectiveConfig(**kw))
    assert training_ratios(cfg(name="mdc")) == (0.5, 0.75, 1.0)
    assert training_ratios(cfg(name="mdc", t_low=0.0, t_high=1.0)) == (0.5, 1.0)
    assert training_ratios(cfg(name="bert", mask_ratio=0.4)) == (0.4,)
    assert training_ratios(cfg(name="parallel")) == (1.0,)


# ----------------------------------------------------------------------------------------------------------
# the caption split of the embedded generator


def test_clause_captions_restate_or_add_and_leave_the_other_styles_alone():
    groups = []
    for i in range(40):
        ex = make_example(1, "train", i, image_size=32, captions="clauses", difficulty="easy")
        meta = json.loads(ex["json"])
        first, second = meta["clause_facts"]
        assert len(first) == 3 and len(set(first)) == 3 and set(first) <= set(CLAUSE_FACTS)
        if meta["clause_group"] == "predictable":
            assert second == first and ", again " in ex["txt"]
            head, tail = ex["txt"].split(", again ")
            assert head == tail  # the second clause restates the first word for word
        else:
            assert set(first) | set(second) == set(CLAUSE_FACTS) and not set(first) & set(second)
            assert ", also " in ex["txt"]
        assert meta["caption"] == ex["txt"] and meta["caption_style"] == "clauses"
        groups.append(meta["clause_group"])
        other = make_example(1, "train", i, image_size=32, captions="short", difficulty="easy")
        other_meta = json.loads(other["json"])
        assert other["jpg"] == ex["jpg"] and "clause_group" not in other_meta  # same image; default style unchanged
        for key in ("short_caption", "long_caption", "labels", "objects", "negatives"):
            assert other_meta[key] == meta[key]
        o = meta["objects"][0]  # the caption's words are the primary object's
        vocab = vocabularies("easy")
        _, facts = parse_clause_caption(ex["txt"], vocab)
        truth = {"size": o["size"], "colour": o["colour"], "shape": o["shape"], "row": o["position"],
                 "background": meta["labels"]["background"]}
        for clause in facts:
            for fact, word in clause.items():
                if fact in ("size", "colour", "shape", "background"):
                    assert word == truth[fact]
    assert 10 < groups.count("predictable") < 30  # a fair coin


def test_every_fact_is_as_likely_at_every_place_in_both_groups():
    places = {}  # (group, clause, slot) -> Counter of facts
    for _, group, first, second in clause_examples(n=1200, seed=5):
        for c, facts in enumerate((first, second)):
            for slot, fact in enumerate(facts):
                places.setdefault((group, c, slot), Counter())[fact] += 1
    for counter in places.values():  # about 100 each of 6 facts per place and group
        n = sum(counter.values())
        assert set(counter) == set(CLAUSE_FACTS)
        assert max(counter.values()) / n < 0.25 and min(counter.values()) / n > 0.09


def test_text_check_confirms_the_split():
    vocab = vocabularies("easy")
    examples = clause_examples(n=600, seed=3)
    check = clause_text_check([parse_clause_caption(text, vocab) for text, *_ in examples])
    pred, unpred = check["predictable"], check["unpredictable"]
    assert pred["second"]["restated"] == 1.0 and pred["second"]["entropy_bits"] == 0.0
    assert unpred["second"]["restated"] == 0.0 and unpred["second"]["entropy_bits"] > 1.0
    assert pred["first"]["entropy_bits"] > 1.0  # the first clause is new information in both groups
    assert abs(unpred["second"]["entropy_bits"] - unpred["first"]["entropy_bits"]) < 0.4
    assert pred["captions"] + unpred["captions"] == 600
    with pytest.raises(ValueError, match="two-clause"):
        parse_clause_caption("a red circle", vocab)


# ----------------------------------------------------------------------------------------------------------
# the CLI and the table of a real (untrained) pair


def test_cli_writes_json_table_and_plot(tmp_path, capsys):
    data = tmp_path / "data"
    write_synthetic_dataset(data, 8, image_size=32, n_val=2, n_test=12, n_compgen=2, progress=False, workers=1,
                            captions="clauses", difficulty="easy")
    ids = build_output_vocab(iter_captions(DataConfig(path=str(data)), split="test"))
    runs = []
    for objective in ("arc", "mdc", "clip"):
        torch.manual_seed(0)
        cfg = RunConfig(model=micro_config(context_length=32, output_vocab="corpus", output_vocab_size=len(ids)),
                        objective=ObjectiveConfig(name=objective))
        save_checkpoint(tmp_path / objective, 1, cfg, create_model(cfg, objective, ids))
        runs.append(str(tmp_path / objective))
    out = tmp_path / "eval"
    argv = ["eval", "visual-reliance", "--run", runs[0], "--run", runs[1], "--data", str(data), "--limit", "12",
            "--batch-size", "4", "--draws", "2", "--blind", "--out", str(out), "--n-boot", "200"]
    assert main(argv) == 0
    result = json.loads((out / "visual_reliance.json").read_text())
    assert [r["mode"] for r in result["runs"]] == ["teacher_forcing", "masked"]
    assert result["runs"][1]["ratios"] == [0.5, 0.75, 1.0]  # MDC's training range, not 0.25
    assert set(result["groups"]) <= {"predictable", "unpredictable"} and len(result["groups"]) == 12
    assert result["references"] == ["mismatched", "blind"] and "text_check" in result
    assert len(result["runs"][0]["loss_blind"]) == 12
    printed = capsys.readouterr().out
    for run in result["mismatched"]["runs"]:  # untrained models: the sign of their mean reliance is chance
        assert (f"mean reliance {run['mean_reliance']:+.3f} nats" + ("; slope" if run["normalised"] else
                                                                    " [")) in printed
        assert run["normalised"] or "no normalised shape" in printed
    assert (out / "visual_reliance.png").read_bytes()[:4] == b"\x89PNG"
    table = reliance_table(result, {"arc": "ARC", "mdc": "MDC"})
    assert set(table["values"]) <= {"ARC", "MDC"}
    for row, cols in table["items"].items():
        for group, items in cols.items():
            assert len(items) == len(table["items"][next(iter(table["items"]))][group])
            assert table["values"][row][group] == pytest.approx(sum(items) / len(items))
    assert main(["eval", "visual-reliance", "--run", runs[2], "--data", str(data), "--out", str(out)]) == 2
    assert "captioner" in capsys.readouterr().err
