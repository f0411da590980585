"""Repetition rate: how often a caption repeats a word, the failure of confidence-ordered decoding that remasking
targets (masked positions decided in the same context pick the same likely word, e.g. "a red red square").

A caption counts as repetitive when a content word occurs twice or more, or any word occurs twice in a row.
Function words (articles, prepositions, conjunctions, pronouns, forms of "be") may recur: "a red circle and a blue
square" is not a repetition, "a red circle and a red square" is (and may be right: compare with the rate of the
reference captions). Words are :func:`mdc_workbench.eval.caption_metrics.simple_tokenize` tokens (lower case).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from mdc_workbench.eval.caption_metrics import simple_tokenize

FUNCTION_WORDS = frozenset(
    "a an the of and or but on in at to with by for from into onto over under near next above below "
    "is are was were be been it its this that these those there here which who as".split()
)


def repeated_words(caption: str) -> list[str]:
    """The words that make `caption` repetitive (sorted): content words occurring twice or more, and any word
    occurring twice in a row."""
    words = simple_tokenize(caption)
    counts = Counter(w for w in words if w not in FUNCTION_WORDS)
    found = {w for w, n in counts.items() if n > 1}
    found |= {a for a, b in zip(words, words[1:], strict=False) if a == b}
    return sorted(found)


def repetition_rate(captions: Iterable[str]) -> float | None:
    """Fraction of `captions` with a repeated word (see the module docstring); None for no captions."""
    flags = [bool(repeated_words(c)) for c in captions]
    return sum(flags) / len(flags) if flags else None
