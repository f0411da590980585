"""Repetition rate (in `mdc eval captioning`) and the greedy-vs-remasking comparison."""

import math

import pytest

from mdc_workbench.eval.remasking import remasking_table, wilson
from mdc_workbench.eval.repetition import repeated_words, repetition_rate


@pytest.mark.parametrize("caption,words", [
    ("a red circle and a blue square", []),  # function words may recur
    ("a red red square", ["red"]),
    ("a red circle and a red square", ["red"]),
    ("the the cat", ["the"]),  # any word twice in a row
    ("A Square, a SQUARE.", ["square"]),
    ("", []),
])
def test_repeated_words_by_hand(caption, words):
    assert repeated_words(caption) == words


def test_repetition_rate():
    assert repetition_rate(["a red red square", "a blue circle", "a cross and a cross", "a dot"]) == 0.5
    assert repetition_rate([]) is None


def test_wilson_interval_by_hand():
    lo, hi = wilson(5, 10)  # p = 0.5, n = 10: 0.5 -+ 1.96 * sqrt(0.025 + 0.0096) / 1.384
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 20)[0] == 0.0 and wilson(20, 20)[1] == pytest.approx(1.0)
    assert all(math.isnan(v) for v in wilson(0, 0))


def test_table_shows_intervals_and_paired_differences():
    result = {"rows": {
        "greedy": {"repetition_rate": 0.1, "repetition_ci": (0.05, 0.2), "single_object_accuracy": 0.5,
                   "accuracy_ci": (0.4, 0.6), "cider": 1.2, "cider_ci": (1.0, 1.4), "diff": {}},
        "remask": {"repetition_rate": 0.05, "repetition_ci": (0.02, 0.1), "single_object_accuracy": None,
                   "accuracy_ci": (math.nan, math.nan), "cider": 1.3, "cider_ci": (1.1, 1.5),
                   "diff": {"repetition_rate": [-0.05, -0.08, -0.02], "cider": [0.1, -0.05, 0.2]}}}}
    lines = remasking_table(result).splitlines()
    assert lines[2] == "| greedy | 10.0 [5.0, 20.0] | 50.0 [40.0, 60.0] | 120.0 [100.0, 140.0] |"
    assert lines[3] == ("| remask | 5.0 [2.0, 10.0] (-5.0 [-8.0, -2.0]) | n/a | 130.0 [110.0, 150.0] "
                        "(+10.0 [-5.0, +20.0]) |")


def test_captioning_table_gets_a_repetition_column():
    from mdc_workbench.eval.captioning import captioning_table
    rows = [{"label": "MDC", "run": "r", "length": "10", "metrics": {"BLEU@4": 0.2, "METEOR": None, "CIDEr": 0.5,
                                                                     "SPICE": None, "ROUGE-L": 0.4,
                                                                     "repetition_rate": 0.125}}]
    lines = captioning_table(rows).splitlines()
    assert lines[0].endswith("| RL | Rep |") and lines[2].endswith("| 40.0 | 12.5 |")
