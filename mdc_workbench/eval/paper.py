"""The paper (MDC, Feng et al. 2025) in one place: its numbers (:data:`PAPER`) and its claims (:data:`PAPER_CLAIMS`),
on the workbench's table names and row labels (torch-free data).

**Its numbers.** :data:`PAPER` is the one table notebooks and plan summaries compare with. Keys are the workbench's
table names (``table1`` ... ``table5``, ``table1_long``, ``fig4``, ...); a notebook reports its embedded-data
version of a table under the same key in ``metrics.json`` (:mod:`mdc_workbench.runs.summary`). Each number is
quoted from the column that matches the workbench's metric: a probe table's mean over tasks is the paper's Table 1
"Average" column (Tables 4 and 5 report ImageNet-1k only).

**Its claims.** Every entry names where the paper makes it (section, table or figure) and what the workbench measures
instead (``tested_as``). Four kinds: ``claim`` (the paper's text states it; a verdict), ``check`` (a workbench check,
not the paper's: a verdict), ``observation`` (a row order the paper's tables show but its text does not claim: the
difference with its interval, no verdict) and ``exploratory`` (an earlier measurement kept for reference: no verdict).
docs/evidence.md gives the reasons, the margins' derivations and the quotes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PaperTable:
    title: str  # what the paper's table measures
    metric: str  # the paper's metric and setting
    values: dict[str, Any]  # row -> number, or row -> {column -> number}


_AVERAGE = "Average top-1 % over ImageNet-1k, Food101, CIFAR-10, CIFAR-100 and Pets (Table 1's Average column)"

PAPER: dict[str, PaperTable] = {
    "table1": PaperTable(
        "Table 1: linear probing on alt-text captions (CLIP vs ARC vs MDC)", f"{_AVERAGE}, pretrained on CC12M",
        {"CLIP": {"ViT-B/32": 71.7, "ViT-B/16": 78.5, "ViT-L/14": 81.0},
         "ARC": {"ViT-B/32": 69.5, "ViT-B/16": 77.4, "ViT-L/14": 80.2},
         "MDC": {"ViT-B/32": 68.7, "ViT-B/16": 77.2, "ViT-L/14": 80.6}}),
    "table1_long": PaperTable(
        "Table 1: linear probing on long descriptive captions", f"{_AVERAGE}, pretrained on Recap-DataComp-10M "
        "(CLIP-LB: twice the batch size)",
        {"CLIP-LB": {"ViT-B/32": 70.9, "ViT-B/16": 76.2, "ViT-L/14": 77.7},
         "CLIP": {"ViT-B/32": 69.7, "ViT-B/16": 74.8, "ViT-L/14": 76.3},
         "ARC": {"ViT-B/32": 76.3, "ViT-B/16": 80.6, "ViT-L/14": 83.3},
         "MDC": {"ViT-B/32": 74.6, "ViT-B/16": 80.2, "ViT-L/14": 83.1}}),
    "table2": PaperTable(
        "Table 2: compositionality (pick the true caption)", "accuracy %, ARO and SugarCrepe",
        {"CLIP": {"relation": 53.6, "attribute": 59.7, "coco order": 27.2, "flickr30k order": 29.5, "add": 66.5,
                  "replace": 72.8, "swap": 61.3},
         "ARC": {"relation": 82.7, "attribute": 76.0, "coco order": 97.7, "flickr30k order": 98.4, "add": 97.6,
                 "replace": 77.4, "swap": 76.9},
         "MDC (Monte Carlo)": {"relation": 85.1, "attribute": 84.3, "coco order": 89.0, "flickr30k order": 89.0,
                               "add": 85.6, "replace": 75.8, "swap": 75.2},
         "MDC (Heuristic)": {"relation": 84.6, "attribute": 81.2, "coco order": 98.4, "flickr30k order": 98.8,
                             "add": 97.8, "replace": 77.9, "swap": 78.5}}),
    "table3": PaperTable(
        "Table 3: captioning (MSCOCO, after fine-tuning)",
        "scores x 100 on MSCOCO; LLM: Qwen2.5-VL's selection rate %; ARC: beam search, beam 6; MDC-N: N tokens",
        {"ARC": {"BLEU@4": 16.0, "METEOR": 23.9, "CIDEr": 48.8, "SPICE": 17.4, "ROUGE-L": 38.6, "LLM": 33.9},
         "MDC-10": {"BLEU@4": 20.7, "METEOR": 14.3, "CIDEr": 64.7, "SPICE": 16.0, "ROUGE-L": 42.2, "LLM": 19.2},
         "MDC-15": {"BLEU@4": 17.6, "METEOR": 23.1, "CIDEr": 51.1, "SPICE": 18.3, "ROUGE-L": 40.7, "LLM": 23.6},
         "MDC-20": {"BLEU@4": 13.6, "METEOR": 31.9, "CIDEr": 24.1, "SPICE": 18.6, "ROUGE-L": 37.0, "LLM": 23.3}}),
    "table4": PaperTable("Table 4: the 1/t weight", "ImageNet-1k top-1 % (the only column), ViT-B/32",
                         {"CMLM (w/o 1/t, per masked token)": {"CC12M": 54.0, "Recap-DataComp-10M": 59.5},
                          "MDC": {"CC12M": 54.8, "Recap-DataComp-10M": 60.7}}),
    "table5": PaperTable("Table 5: noise schedule [w_l, w_u]",
                         "ImageNet-1k top-1 % (the only column), pretrained on CC3M, ViT-B/32",
                         {"[0.0, 1.0]": {"ImageNet-1k": 29.3}, "[0.3, 0.8]": {"ImageNet-1k": 36.1},
                          "[0.4, 0.9]": {"ImageNet-1k": 38.6}, "[0.5, 1.0]": {"ImageNet-1k": 39.2}}),
    "fig4": PaperTable("Fig. 4: BERT masking ratio vs MDC", "ImageNet-1k top-1 % (read off a plot; not tabulated)",
                       {}),
    "central_claim": PaperTable("Sec. 1: the visual learning signal along the caption (central claim)",
                                "argued, not measured: ARC's visual learning signal weakens at later positions, "
                                "MDC's does not depend on position", {}),
    "feature_order": PaperTable("Sec. 1: the consequence for features (ours)",
                                "argued, not measured: a signal that does not depend on position gives better "
                                "features", {}),
}

CLAIM, CHECK, OBSERVATION, EXPLORATORY = "claim", "check", "observation", "exploratory"
KINDS = (CLAIM, CHECK, OBSERVATION, EXPLORATORY)
VERDICT_KINDS = (CLAIM, CHECK)

# Margins, fixed before any run (docs/evidence.md derives them).
# Table 1, CC12M rows, Average column: ARC - MDC = 0.8 (ViT-B/32: 69.5 vs 68.7), 0.2 (B/16), -0.4 (L/14); the text
# calls these "comparable". 0.8 points is the paper's scale (ImageNet-1k and four other sets); here the margin is
# a share of this run's own scale, ARC's probe gain over its untrained encoder: 0.8 is 1.2% of ARC's 69.5 Average
# and a larger share of its (unreported) gain over an untrained encoder, so 5% of ARC's gain is at least as lenient.
TABLE1_MARGIN = 0.05  # share of ARC's gain (TABLE1_SCALE)
TABLE1_SCALE = ("ARC", "gain")
# Central claim, retired 2026-12-02 (issue 61): MDC's flatness as every fifth of its model-normalised gradient
# profile inside +- this share of ARC's fall. It has no scale where ARC does not fall (short captions) and its middle
# fifth of two-clause captions is the comma and the connector. Kept only because docs/central_claim.json records the
# run judged under it (mdc_workbench.runs.central_story); no claim uses it.
FLAT_SHARE = 0.5
# The paper's sentence (declared 2026-12-02, before any run of it; docs/evidence.md, "The paper's sentence, judged as
# written"): per caption kind, on content words only (mdc_workbench.eval.content_words), the caption's signal
# divided by its own mean. MDC "does not depend on position": |content slope| < FLAT_MARGIN, i.e. from the caption's
# first position to its last the fitted signal changes by less than 20% of the caption's own mean (the narrower side
# of the 80-125% band of average bioequivalence). ARC "weakens at later positions": content slope < 0, and a fall
# smaller than MDC's flatness band could not tell the two apart, so that band is also the effect ARC's part must be
# able to resolve (else "underpowered").
FLAT_MARGIN = 0.2
ARC_FALL_EFFECT = FLAT_MARGIN
# The consequence for features (feature_order, ours): the smallest interaction worth resolving, in points of probe
# top-1 (ARC's late-position penalty minus MDC's); an interval that cannot resolve it is "underpowered".
FEATURE_EFFECT = 2.0
# Its primary attribute (re-declared 2026-12-02, issue 61, before any rerun; it was the mean of shape and colour):
# shape, the attribute the linked data make predictable from the other; colour is reported as secondary.
FEATURE_PRIMARY = "shape: late penalty"
# The paper's effects in points of probe top-1 (power: a part that cannot resolve them is "underpowered").
TABLE4_EFFECT = 0.8  # Table 4: MDC - MDC (w/o 1/t) = 0.8 (CC12M) and 1.2 (Recap-DataComp-10M): the smaller
TABLE5_EFFECT = 0.6  # Table 5: [0.5, 1] 39.2 vs [0.4, 0.9] 38.6, the smallest gap to the best schedule


@dataclass(frozen=True)
class Part:
    """One comparison ``better <relation> worse`` in each of `columns` ("" for a 1-D table).

    Row patterns: a row name, ``*`` (every model row other than the other side's; baselines excluded, see
    :data:`BASELINE_ROWS`) or a shell pattern (``BERT*``). `worse` may be a number: the row is compared with
    that constant (``ARC < 0``). `relation`: ``>``, ``<``, ``noninferior`` (``better >= worse - margin``) or
    ``equivalent`` (``|better - worse| < margin``). `margin_of` (row, column): the margin is that share of the
    cell's mean (a margin on the run's own scale, e.g. 5% of ARC's probe gain)."""

    better: str
    relation: str
    worse: str | float
    columns: tuple[str, ...] = ("",)
    margin: float = 0.0
    margin_of: tuple[str, str] | None = None


@dataclass(frozen=True)
class Claim:
    """One statement of the paper (or a workbench check) as comparisons on one measured table."""

    key: str  # short id, e.g. "table5"
    kind: str  # claim | check | observation | exploratory
    source: str  # where the paper says it
    text: str  # what the paper says, as a reader would put it (quotes where the wording matters)
    table: str  # the metrics.json table it is checked on
    parts: tuple[Part, ...]
    tested_as: str = ""  # what the workbench measures, where that differs from the text
    paper_rows: tuple[str, ...] = ()  # rows of the paper's version of the comparison: any missing here is flagged
    effect: float | None = None  # the paper's effect in the table's units: an unresolved part that cannot resolve
    # it is "underpowered" (non-inferiority and equivalence parts use their margin)
    blind_ceiling: float | None = None  # a column where either compared row's image-free twin ("<row>, blind")
    # scores at least this is uninformative for that comparison: listed, not tested
    combine: str = "every"  # how its parts combine (mdc_workbench.eval.decision.decide): "every" part holds (an
    # intersection-union test, no multiplicity correction), or "some" part holds (Holm); one part: either reads alike


# Table 4's rows without 1/t (mdc_core.registry labels): the paper's (cmlm, per masked token), and Eq. 5 without its
# weight (mdc_no_t, per caption token; runs before cmlm existed named it "MDC (w/o 1/t)", which the pattern matches)
TABLE4_ROW = "CMLM (w/o 1/t, per masked token)"
TABLE4_CAPTION_TOKEN_ROWS = "MDC (w/o 1/t)*"
CENTRAL_TABLE = "central_claim"  # mdc_workbench.eval.central_claim.claim_table's columns below
CENTRAL_INTERACTION = ("clauses gradient: slope, predictable - unpredictable",
                       "clauses PMI: slope, predictable - unpredictable")
CENTRAL_ROBUSTNESS = ("clauses gradient: log slope, predictable - unpredictable",
                      "clauses gradient: slope w/o first and connector, predictable - unpredictable")
CENTRAL_KINDS = ("short", "clauses")  # = mdc_workbench.eval.central_claim.CAPTION_KINDS
CENTRAL_CONTENT = tuple(f"{kind} gradient: content slope" for kind in CENTRAL_KINDS)
CENTRAL_SHORT_PROFILE = ("short gradient: content slope", "short gradient: slope",
                         *(f"short gradient: bin {k}" for k in range(1, 6)))
CENTRAL_SLOPES = (*(f"short {m}: slope" for m in ("gradient", "PMI")),
                  *(f"clauses {m}: slope, {g}" for m in ("gradient", "PMI") for g in ("predictable", "unpredictable")))
BASELINE_ROWS = ("random init*", "raw pixels*", "*, blind")  # baselines, not models (never matched by "*")
TABLE2_COLUMNS = ("relation", "attribute", "coco order", "flickr30k order", "order", "add", "replace", "swap")
TABLE3_COLUMNS = ("BLEU@4", "METEOR", "ROUGE-L", "CIDEr", "SPICE")
PROBE_GAIN = "gain"  # probe tables: mean over tasks of top-1 minus the same-kind random-init row's (GAP/GAP, CLS/CLS)
PROBE_TOP1 = "top-1"  # probe tables: mean top-1 over the tasks (the paper's "Average")


def _training_check(table: str, what: str) -> Claim:
    return Claim(f"{table}_training", CHECK, what, "training adds to the features (not a claim of the paper)",
                 table, (Part("*", ">", 0.0, (PROBE_GAIN,)),),
                 tested_as="every model's probe gain over its untrained encoder > 0")


PAPER_CLAIMS: tuple[Claim, ...] = (
    Claim("table1", CLAIM, "Sec. 4.2 'Learning from image alt-text pairs'; Table 1, CC12M rows, Average column",
          "on alt-text captions MDC 'achieves performance comparable to autoregressive captioning in terms of "
          "average accuracy'", "table1",
          (Part("MDC", "noninferior", "ARC", (PROBE_TOP1,), TABLE1_MARGIN, TABLE1_SCALE),),
          tested_as=f"non-inferiority: MDC's mean probe top-1 >= ARC's - {TABLE1_MARGIN:g} x ARC's probe gain over "
                    "its untrained encoder (the paper's 0.8 points, on this run's scale)"),
    Claim("table1_clip", OBSERVATION, "Table 1, CC12M rows (a row order the text does not claim)",
          "on alt-text captions CLIP's probe is above ARC's and MDC's (ViT-B/32 Average: 71.7 vs 69.5 and 68.7)",
          "table1", (Part("CLIP", ">", "ARC", (PROBE_GAIN,)), Part("CLIP", ">", "MDC", (PROBE_GAIN,))),
          tested_as="probe gains over each model's own untrained encoder (CLS for CLIP, GAP for the captioners)"),
    Claim("table1_long", CLAIM, "Sec. 4.2 'Learning from rich textual descriptions'; Table 1, Recap-DataComp-10M "
          "rows", "on long descriptive captions the captioners learn better features than CLIP ('one potential "
          "advantage of captioning-based methods (autoregressive and masked diffusion): they can effectively learn "
          "visual representations from long contexts')", "table1_long",
          (Part("ARC", ">", "CLIP", (PROBE_GAIN,)), Part("MDC", ">", "CLIP", (PROBE_GAIN,))),
          tested_as="probe gains over each model's own untrained encoder, models trained on long captions"),
    Claim("table1_long_arc", OBSERVATION, "Table 1, Recap-DataComp-10M rows (a row order the text does not claim)",
          "on long captions ARC's Average is above MDC's on every backbone (76.3 vs 74.6, 80.6 vs 80.2, 83.3 vs "
          "83.1)", "table1_long", (Part("ARC", ">", "MDC", (PROBE_TOP1,)),)),
    Claim("table4", CLAIM, "Sec. 4.3 'Necessity of t'; Table 4",
          "removing the 1/t weight from the loss lowers probe accuracy ('linear probing performance drops'; the "
          "model 'then essentially becomes CMLM')", "table4",
          (Part("MDC", ">", TABLE4_ROW, (PROBE_TOP1,)),), effect=TABLE4_EFFECT,
          tested_as="against the paper's row: Alg. 1 without 1/t, whose cross_entropy averages over the masked "
                    "tokens (objective cmlm, the loss per masked token, as Eq. 1 and CMLM)"),
    Claim("table4_per_caption_token", OBSERVATION, "Table 4 (another reading of 'removing t': Eq. 5 without its "
          "weight)", "MDC against MDC without 1/t whose loss is divided by the caption tokens, as MDC's is",
          "table4", (Part("MDC", ">", TABLE4_CAPTION_TOKEN_ROWS, (PROBE_TOP1,)),),
          tested_as="objective mdc_no_t; its rows were named 'MDC (w/o 1/t)' before the paper's row (cmlm) was "
                    "trained, and still read here"),
    Claim("table5", CLAIM, "Sec. 4.3 'Noise schedule'; Table 5 (CC3M: short captions)",
          "on short captions t ~ U[0.5, 1] 'achieves the best performance' of the schedules", "table5",
          (Part("[0.5, 1.0]", ">", "*", (PROBE_TOP1,)),),
          paper_rows=("[0.0, 1.0]", "[0.3, 0.8]", "[0.4, 0.9]", "[0.5, 1.0]"), effect=TABLE5_EFFECT),
    Claim("table5_worst", OBSERVATION, "Table 5 (the text says only that the loss of [0, 1] 'is very unstable' on "
          "CC3M)", "[0, 1] has the lowest probe accuracy of the schedules", "table5",
          (Part("*", ">", "[0.0, 1.0]", (PROBE_TOP1,)),)),
    Claim("fig4", CLAIM, "Sec. 4.2 'Comparison with masked language model variants'; Fig. 4",
          "MDC's unified schedule 'consistently outperforms fixed-ratio BERT variants' (ratios up to 100%, "
          "parallel decoding; the caption concedes that 'certain masking ratios achieve performance close to ours')",
          "fig4", (Part("MDC", ">", "BERT*", (PROBE_TOP1,)), Part("MDC", ">", "Parallel*", (PROBE_TOP1,)))),
    Claim("table2", CLAIM, "Sec. 4.2 'Vision language compositionality'; Table 2",
          "'MDC outperforms CLIP and ARC' on ARO and SugarCrepe", "table2",
          (Part("MDC (Heuristic)", ">", "ARC", TABLE2_COLUMNS), Part("MDC (Heuristic)", ">", "CLIP", TABLE2_COLUMNS)),
          tested_as="MDC's heuristic score (the paper's better MDC row) in every column; 'order' is the embedded "
                    "data's version of the two order columns; a column an image-free model solves (>= 99%) is "
                    "uninformative there and not tested", blind_ceiling=99.0),
    Claim("table3_matched", OBSERVATION, "Table 3 at a matched length (Sec. 4.2 'Image captioning': MDC-N vs ARC is "
          "'not directly comparable' since MDC is told the length; the text claims no order)",
          "MDC and ARC (beam 6) compared per metric, each image captioned by MDC at the length of ARC's caption",
          "table3", (Part("MDC (ARC's length)", ">", "ARC", TABLE3_COLUMNS),),
          tested_as="descriptive: the differences with their intervals, no verdict (the lengths each row wrote are "
                    "shown and match by construction)"),
    Claim("table3_lengths", OBSERVATION, "Table 3 at lengths that are not matched",
          "MDC at each fixed N', at the test captions' median length, at each image's reference length (an oracle "
          "ARC does not get) and at its own adaptive length, against ARC (beam 6)", "table3",
          (Part("MDC-*", ">", "ARC", TABLE3_COLUMNS), Part("MDC (median length)", ">", "ARC", TABLE3_COLUMNS),
           Part("MDC (oracle length)", ">", "ARC", TABLE3_COLUMNS),
           Part("MDC (auto length)", ">", "ARC", TABLE3_COLUMNS))),
    Claim("central_claim", CLAIM, "Abstract; Sec. 1 (the central argument)",
          "an autoregressive captioner's visual learning signal weakens at later positions because 'later text "
          "tokens can be predicted so well from the earlier ones', while 'the strength of the visual learning signal "
          "in MDC does not depend on each token's position in the sequence'", CENTRAL_TABLE,
          (Part("ARC", "<", 0.0, CENTRAL_CONTENT), Part("MDC", "equivalent", 0.0, CENTRAL_CONTENT, FLAT_MARGIN)),
          effect=ARC_FALL_EFFECT,
          tested_as=f"the sentence as written, every part on both caption kinds (short and two-clause): on content "
                    f"words (comma, connector, articles and prepositions left out), each caption's image-gradient "
                    f"norm divided by its own mean, slope against relative position: ARC's < 0 and MDC's inside "
                    f"+-{FLAT_MARGIN:g} (the signal changes by less than {100 * FLAT_MARGIN:g}% of the caption's "
                    "mean from its start to its end)"),
    Claim("central_claim_arc", CLAIM, "Abstract; Sec. 1 (the first half of the sentence)",
          "ARC's visual learning signal weakens at later positions ('the image becomes decreasingly important')",
          CENTRAL_TABLE, (Part("ARC", "<", 0.0, CENTRAL_CONTENT),), effect=ARC_FALL_EFFECT,
          tested_as="ARC's content slope < 0 on short and on two-clause captions (every part; a disagreement "
                    "between the kinds is the finding)"),
    Claim("central_claim_flat", CLAIM, "Abstract; Sec. 1 (the second half of the sentence)",
          "'the strength of the visual learning signal in MDC does not depend on each token's position in the "
          "sequence'", CENTRAL_TABLE, (Part("MDC", "equivalent", 0.0, CENTRAL_CONTENT, FLAT_MARGIN),),
          tested_as=f"equivalence: MDC's content slope inside +-{FLAT_MARGIN:g} on short and on two-clause captions"),
    Claim("central_claim_short_profile", OBSERVATION, "Sec. 1 (MDC against ARC where nothing later is predictable)",
          "on short captions MDC's profile against ARC's, paired by seed and caption", CENTRAL_TABLE,
          (Part("MDC", ">", "ARC", CENTRAL_SHORT_PROFILE),),
          tested_as="descriptive: MDC - ARC on the content slope, the slope over every token and each fifth of the "
                    "model-normalised profile"),
    Claim("central_claim_mechanism", CHECK, "Sec. 1 (the mechanism the sentence gives; a check, not the sentence)",
          "where the later words copy the earlier ones, ARC's signal falls more than MDC's", CENTRAL_TABLE,
          (Part("ARC", "<", "MDC", CENTRAL_INTERACTION[:1]),),
          tested_as="mechanism check on two-clause captions whose second clause copies the first word for word "
                    "('predictable', connector 'again') against ones naming three other facts ('unpredictable', "
                    "'also'): the interaction (predictable - unpredictable) x (ARC - MDC) of the per-caption slope of "
                    "the normalised image-gradient norm < 0. Its sign is close to settled by construction: a causal "
                    "model reads the copy off its prefix, a bidirectional one sees it on both sides"),
    Claim("central_claim_pmi", OBSERVATION, "Sec. 1 (the information the image carries, beside the signal)",
          "the mechanism check's interaction on the in-distribution PMI", CENTRAL_TABLE,
          (Part("ARC", "<", "MDC", CENTRAL_INTERACTION[1:]),),
          tested_as="descriptive: a pool of the batch's images saturates once ARC's growing prefix singles out its "
                    "image, on either caption group (docs/evidence.md)"),
    Claim("central_claim_robustness", OBSERVATION, "Sec. 1 (pre-declared robustness rows of the mechanism check)",
          "the mechanism check's interaction on the slope of log(gradient) and on the slope without the first token "
          "and the clause connector", CENTRAL_TABLE, (Part("ARC", "<", "MDC", CENTRAL_ROBUSTNESS),)),
    Claim("central_claim_slopes", OBSERVATION, "Sec. 1 (the per-model slopes behind the claims)",
          "each model's slope of its normalised signal along the caption, per caption kind, measure and group",
          CENTRAL_TABLE, (Part("ARC", "<", 0.0, CENTRAL_SLOPES), Part("MDC", "<", 0.0, CENTRAL_SLOPES))),
    Claim("feature_order", CHECK, "(ours: the consequence the paper draws from its central argument, Sec. 1)",
          "a visual signal that does not depend on position gives better features: ARC's probe loses more than "
          "MDC's on whichever attribute its captions name last", "feature_order",
          (Part("ARC", ">", "MDC", (FEATURE_PRIMARY,)),), effect=FEATURE_EFFECT,
          tested_as="linked data (the shape follows the colour in 80% of the training images), ARC and MDC trained "
                    "on each caption order, probed on held-out images where the link is broken: per attribute its "
                    "top-1 when named first minus when named last; on shape (the primary attribute, the one the "
                    "data makes predictable from the other: 9 colours onto 5 shapes, so colour is barely "
                    "predictable from shape and its penalty near 0 by design), ARC's minus MDC's > 0"),
    Claim("feature_order_attributes", OBSERVATION, "(ours: the interaction on the secondary attribute and the mean)",
          "ARC's late-position penalty minus MDC's, for colour (secondary) and for the mean of shape and colour",
          "feature_order", (Part("ARC", ">", "MDC", ("colour: late penalty", "late penalty")),)),
    _training_check("table1", "Table 1's models"),
    _training_check("table1_long", "Table 1's long-caption models"),
    _training_check("table4", "Table 4's models"),
    _training_check("table5", "Table 5's models"),
    _training_check("fig4", "Fig. 4's models"),
)

# Statements of the paper no table of the workbench tests with a verdict: (source, text, why, descriptive table).
# Every summary lists them as not measured, except one whose descriptive table (the fourth field; None: there is none)
# is among its runs' tables: that one it lists as measured without a verdict.
NOT_ENCODED: tuple[tuple[str, str, str, str | None], ...] = (
    ("Sec. 4.2 'Dataset size scaling'; Fig. 5", "'the more image text pairs used for pretraining, the better "
     "performance on the downstream tasks'", "not testable in this design: plans/data_scaling.yaml trains every "
     "size for the same number of steps (2,500 images seen 10 times, 20,000 1.3 times at 400 steps) on a generator "
     "whose scenes 2,500 images already cover, so no size effect could show; mdc_workbench.eval.data_scaling gathers "
     "them by size (descriptive)",
     "data_scaling"),  # = mdc_workbench.runs.evidence.SCALING_TABLE
    ("Sec. 4.3 'Noise schedule'", "with t ~ U[0, 1] the 'loss is very unstable' on short captions",
     "notebook 02 plots each schedule's loss spread; a spread is not a mean over test items, so it gets no verdict",
     None),
    ("Sec. 4.2 'Image captioning'; Table 3", "MDC 'can sample reasonable captions'; SPICE and the LLM-judge column",
     "qualitative (notebook 05 shows the captions); SPICE needs the Stanford CoreNLP jars that pycocoevalcap "
     "downloads from the network, the LLM judge a 72B vision-language model: neither runs offline", None),
    ("Sec. 1", "image-conditioned BERT 'can achieve features competitive with those of other learning approaches "
     "when properly tuned'", "Fig. 4's table shows BERT beside MDC; 'competitive' names no comparison to test", None),
)
