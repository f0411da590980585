"""Which caption positions are content words, and the content slope: the statistic the paper's central sentence is
judged on (declared 2026-12-02, before any run of it; docs/evidence.md, "The paper's sentence, judged as written").

**Content words** are the words that name a fact of the scene (:data:`CONTENT_WORDS`): shapes, object colours,
background names, sizes, rows and columns (and the position words made of them), the relation words ``above`` /
``below`` and count words. Everything else is a function word: articles, prepositions (``on``, ``in``, ``of``),
the prefixes (``a photo of``), ``shapes including``, ``background``, the comma and the clause connectors
(``again`` / ``also``). On two-clause captions this leaves exactly the six fact words and drops ``on``, the comma
and the connector; on short captions it drops the articles and prefixes. A word split into several BPE tokens
(``cyan`` is ``cy`` + ``an``) is one word: every token of it takes the word's class (so the ``an`` of ``cyan`` is
content and the article ``an`` is not).

**The content slope** of one caption: its per-position values on content words only, divided by their mean (the
caption's own mean signal), regressed by least squares on relative position x = i / (K - 1) (i over all K caption
tokens, so x is where the word sits in the caption). A slope s says the fitted signal changes by s times the
caption's mean from its first position to its last, whatever the caption's length or the model's overall scale,
so a margin in these units means the same on short captions as on two-clause ones.

Numpy only here (the vocabularies come from the data generator, whose package imports torch). Classification
reads the tokens' display strings (``CaptionTokenizer.token_strings(ids, keep_space=True)``, where a word-final
token carries its trailing space); :func:`content_mask_of_ids` wraps the tokenizer for callers that hold ids.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from mdc_workbench.data.captions import RELATIONS
from mdc_workbench.data.scene import BACKGROUNDS, COLOURS, COLS, POSITIONS, ROWS, SHAPES, SIZES

COUNT_WORDS: tuple[str, ...] = ("one", "two", "three", "four", "five")  # "three shapes including ..." (counts 1-4)
CONTENT_WORDS: frozenset[str] = frozenset(
    [*SHAPES, *COLOURS, *(w for b in BACKGROUNDS for w in b.split()), *SIZES, *ROWS, *COLS,
     *(w for p in POSITIONS for w in p.split()), *(w for r in RELATIONS for w in r.split() if w != "of"),
     *COUNT_WORDS])
CONTENT_SLOPE = "content slope"  # the claim_table statistic (columns "<kind> gradient: content slope")


def word_spans(token_strings: Sequence[str]) -> list[tuple[int, int]]:
    """(start, stop) token index ranges of the words of one caption: a word ends at a token whose string ends with
    a space (``token_strings(..., keep_space=True)``) and at the caption's end."""
    spans, start = [], 0
    for i, piece in enumerate(token_strings):
        if piece.endswith(" ") or i == len(token_strings) - 1:
            spans.append((start, i + 1))
            start = i + 1
    return spans


def content_mask(token_strings: Sequence[str]) -> list[bool]:
    """Per caption token: whether it belongs to a content word (module docstring). `token_strings`: one display
    string per caption token, word-final ones with a trailing space (``<sot>``/``<eot>`` already dropped)."""
    mask = [False] * len(token_strings)
    for start, stop in word_spans(token_strings):
        if "".join(token_strings[start:stop]).strip().lower() in CONTENT_WORDS:
            mask[start:stop] = [True] * (stop - start)
    return mask


@lru_cache(maxsize=4)
def _tokenizer(context_length: int):  # noqa: ANN202  (a CaptionTokenizer; imported lazily: it pulls torch)
    from mdc_core.tokenizer import CaptionTokenizer

    return CaptionTokenizer(context_length)


def content_mask_of_ids(ids: Sequence[int], context_length: int = 77) -> list[bool]:
    """:func:`content_mask` of one caption's token ids (the caption positions only: no ``<sot>``/``<eot>``)."""
    tok = _tokenizer(context_length)
    strings = [tok.token_string(int(i), keep_space=True) for i in ids]
    return content_mask(strings)


def content_slope(values: Sequence[float | None], content: Sequence[bool]) -> float | None:
    """The content slope of one caption (module docstring): least-squares slope against x = i / (K - 1) of the
    values at content positions divided by their mean. None with fewer than two scored content positions, a mean
    that is not above 0, or a single-token caption.

    Example: values 1, 9, 2, 3 with content F, F, T, T (K = 4): x = 2/3, 1, mean 2.5, ratios 0.8, 1.2, slope
    (1.2 - 0.8) / (1 - 2/3) = 1.2.
    """
    if len(values) != len(content):
        raise ValueError(f"a caption needs one content flag per value, got {len(values)} values and {len(content)} "
                         "flags")
    if len(values) < 2:
        return None
    keep = [i for i, (v, c) in enumerate(zip(values, content, strict=True))
            if c and v is not None and math.isfinite(v)]
    if len(keep) < 2:
        return None
    y = np.array([values[i] for i in keep], dtype=float)
    mean = float(y.mean())
    if not mean > 0:
        return None
    x = np.array(keep, dtype=float) / (len(values) - 1)
    dx = x - x.mean()
    return float((dx * (y / mean - 1.0)).sum() / (dx * dx).sum())


def content_slopes(captions: Sequence[Sequence[float | None]], masks: Sequence[Sequence[bool]]) -> list[float | None]:
    """:func:`content_slope` of every caption (data order)."""
    if len(captions) != len(masks):
        raise ValueError(f"need one content mask per caption, got {len(captions)} captions and {len(masks)} masks")
    return [content_slope(v, m) for v, m in zip(captions, masks, strict=True)]
