"""The central claim's per-caption statistics and its table (torch-free): what :mod:`mdc_workbench.eval.central_claim`
measures, summarised per caption against relative position.

Values divided by the model's mean over every scored token; relative position x = i / (K - 1); per caption the
least-squares **slope** against x; the **binned profile** (5 equal bins of x), each caption's bin mean minus its own
mean (a **bin deviation**; 0 everywhere = flat); ARC's **fall** (first bin minus last bin); the robustness rows.
:func:`claim_table` writes them as the ``central_claim`` table of metrics.json with per-caption items.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from mdc_core.tokenizer import CaptionTokenizer
from mdc_workbench.data.captions import CLAUSE_CONNECTORS, CLAUSE_GROUPS
from mdc_workbench.eval.content_words import CONTENT_SLOPE, content_mask_of_ids, content_slopes

MEASURES = ("gradient", "pmi")
MEASURE_LABELS = {"gradient": "gradient", "pmi": "PMI"}
CAPTION_KINDS = ("short", "clauses")  # measured together, reported side by side
BINS = 5
CONTRAST = f"{CLAUSE_GROUPS[0]} - {CLAUSE_GROUPS[1]}"
# The table's name and MDC's flatness margin (FLAT_SHARE) live in mdc_workbench.eval.paper, fixed before any run.
Row = list[float | None]  # one caption: a value per caption position (None: not scored)




def positions(length: int) -> np.ndarray:
    """Relative positions x = i / (K - 1) of a caption's K tokens ([0.0] for one token)."""
    return np.zeros(1) if length == 1 else np.arange(length) / (length - 1)


def _xy(values: Row, drop: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    x = positions(len(values)) if values else np.zeros(0)
    keep = [i for i, v in enumerate(values) if v is not None and math.isfinite(v) and i not in drop]
    return x[keep], np.array([values[i] for i in keep], dtype=float)


def slope(values: Row, drop: Sequence[int] = ()) -> float | None:
    """Least-squares slope of a caption's values against relative position (positions in `drop` left out);
    None with fewer than two scored positions."""
    x, y = _xy(values, drop)
    if len(x) < 2:
        return None
    dx = x - x.mean()
    return float((dx * (y - y.mean())).sum() / (dx * dx).sum())


def bin_deviations(values: Row, bins: int = BINS) -> list[float | None]:
    """Per bin of relative position the caption's mean there minus its mean over all scored positions (None:
    empty bin); all 0 for a flat caption."""
    x, y = _xy(values)
    if not len(x):
        return [None] * bins
    which = np.minimum((x * bins).astype(int), bins - 1)
    return [float(y[which == k].mean() - y.mean()) if (which == k).any() else None for k in range(bins)]


def model_mean(captions: Sequence[Row]) -> float:
    """The normaliser: the mean over every scored token of every caption (NaN when none is)."""
    ys = [_xy(c)[1] for c in captions]
    n = sum(len(y) for y in ys)
    return float(sum(y.sum() for y in ys) / n) if n else math.nan


def caption_items(captions: Sequence[Row], tokens: Sequence[Sequence[int]], measure: str, connectors: set[int],
                  bins: int = BINS) -> dict[str, list[float | None]]:
    """Per caption (data order) each statistic of one model and measure, normalised by the model's mean: ``slope``,
    ``bin 1`` .. ``bin <bins>`` (deviations), ``fall`` (first bin minus last), ``slope w/o first and connector``;
    the gradient also ``log slope`` (slope of log(gradient), unnormalised) and ``content slope`` (on content words,
    normalised by the caption's own mean: :mod:`mdc_workbench.eval.content_words`, the statistic the paper's
    sentence is judged on). None where a caption lacks it. A model whose mean is not above 0 has no normalised
    statistics (all None; the content slope needs only the caption's own mean)."""
    m = model_mean(captions)
    ok = math.isfinite(m) and m > 0
    out: dict[str, list[float | None]] = {k: [] for k in ("slope", *(f"bin {k + 1}" for k in range(bins)), "fall",
                                                           "slope w/o first and connector")}
    if measure == "gradient":
        out["log slope"] = []
        out[CONTENT_SLOPE] = content_slopes(captions, [content_mask_of_ids(ids) for ids in tokens])
    for values, ids in zip(captions, tokens, strict=True):
        scaled = [None if v is None or not ok else v / m for v in values]
        devs = bin_deviations(scaled, bins)
        out["slope"].append(slope(scaled))
        for k, d in enumerate(devs):
            out[f"bin {k + 1}"].append(d)
        out["fall"].append(None if devs[0] is None or devs[-1] is None else devs[0] - devs[-1])
        drop = [0, *(i for i, t in enumerate(ids) if t in connectors)]
        out["slope w/o first and connector"].append(slope(scaled, drop))
        if measure == "gradient":
            logs = [math.log(v) if v is not None and v > 0 else None for v in values]
            out["log slope"].append(slope(logs))
    return out


def connector_ids(context_length: int = 77) -> set[int]:
    """Token ids of the clause connectors (``again``, ``also``), each a single BPE token."""
    tok = CaptionTokenizer(context_length)
    return {i for word in CLAUSE_CONNECTORS.values() for i in tok.encode_text(word)}


def claim_table(scores: dict[str, dict[str, Any]], connectors: set[int], bins: int = BINS
                ) -> dict[str, Any]:
    """The ``central_claim`` table (metrics.json layout) from ``{kind: {row name: scores}}`` (scores: a
    :class:`~mdc_workbench.eval.central_claim.ClaimScores` or what has its fields; rows e.g. ARC, MDC
    scored on the same captions of each kind): columns ``"<kind> <measure>: <statistic>"`` (and per caption group
    on two-clause captions, ``"... slope, predictable"`` etc. and the paired contrast ``"... slope, predictable -
    unpredictable"``); values the means over the column's items, items the per-caption values of the captions
    every row has one for (the same captions in every row: paired)."""
    values: dict[str, dict[str, float]] = {}
    items: dict[str, dict[str, list[float]]] = {}
    for kind, by_row in scores.items():
        if kind not in CAPTION_KINDS:
            raise ValueError(f"caption kind must be one of {', '.join(CAPTION_KINDS)}, got {kind!r}")
        rows = list(by_row)
        groups = by_row[rows[0]].groups
        if any(s.groups != groups or len(s.tokens) != len(groups) for s in by_row.values()):
            raise ValueError(f"the {kind} rows scored different captions: compare runs with the same image size, "
                             "context length and data")
        for measure in MEASURES:
            stats = {r: caption_items(getattr(s, measure), s.tokens, measure, connectors, bins)
                     for r, s in by_row.items()}
            columns: dict[str, list[int] | None] = {name: None for name in stats[rows[0]]}
            slopes = [k for k in stats[rows[0]] if "slope" in k]
            if kind == "clauses":
                columns.update({f"{k}, {g}": [i for i, x in enumerate(groups) if x == g]
                                for k in slopes for g in CLAUSE_GROUPS})
            for name, members in columns.items():
                key = name.split(",")[0]
                idx = range(len(groups)) if members is None else members
                common = [i for i in idx if all(stats[r][key][i] is not None for r in rows)]
                for r in rows:
                    col = [float(stats[r][key][i]) for i in common]  # type: ignore[arg-type]
                    if col:
                        items.setdefault(r, {})[f"{kind} {MEASURE_LABELS[measure]}: {name}"] = col
                        values.setdefault(r, {})[f"{kind} {MEASURE_LABELS[measure]}: {name}"] = sum(col) / len(col)
            for r in rows if kind == "clauses" else ():
                for k in slopes:
                    a, b = (items.get(r, {}).get(f"clauses {MEASURE_LABELS[measure]}: {k}, {g}", [])
                            for g in CLAUSE_GROUPS)
                    pairs = [x - y for x, y in zip(a, b, strict=False)]  # k-th predictable with k-th unpredictable
                    if pairs:
                        col = f"clauses {MEASURE_LABELS[measure]}: {k}, {CONTRAST}"
                        items[r][col], values[r][col] = pairs, sum(pairs) / len(pairs)
    return {"metric": "the central claim: per caption, statistics of each model's per-token visual learning signal "
                      "(gradient: image-gradient norm of the token's training loss term; PMI: in-distribution "
                      "pointwise mutual information), normalised by the model's mean, against relative position "
                      "(slope < 0: falls along the caption; bin k: the caption's k-th fifth minus its mean; fall: "
                      "first fifth minus last)", "values": values, "items": items}


def claim_markdown(table: dict[str, Any]) -> str:
    """Markdown of :func:`claim_table`: per caption kind and measure, each row's mean slope, fall and largest bin
    deviation (one seed's means; the verdicts and their intervals come from :mod:`mdc_workbench.eval.claims`)."""
    rows = list(table["values"])
    lines = ["| caption kind | measure | " + " | ".join(f"{r}: slope | {r}: fall | {r}: max abs bin" for r in rows)
             + " |", "|---|---|" + "---|" * (3 * len(rows))]
    for kind in CAPTION_KINDS:
        for measure in MEASURES:
            prefix = f"{kind} {MEASURE_LABELS[measure]}: "
            cells = []
            for r in rows:
                v = table["values"][r]
                bins = [abs(x) for k, x in v.items() if k.startswith(prefix + "bin ")]
                cells += [_num(v.get(prefix + "slope")), _num(v.get(prefix + "fall")),
                          _num(max(bins) if bins else None)]
            if any(c != "-" for c in cells):
                lines.append(f"| {kind} | {MEASURE_LABELS[measure]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:+.3f}"
