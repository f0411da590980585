"""Content words and the content slope (mdc_workbench.eval.content_words), the statistic the paper's central sentence
is judged on: which positions of the generator's captions are content words, the slope by hand, inputs that fail."""

import pytest

from mdc_core.tokenizer import CaptionTokenizer
from mdc_workbench.data.captions import clause_caption, order_caption, parse_clause_caption, short_caption
from mdc_workbench.data.scene import example_rng, sample_scene, vocabularies
from mdc_workbench.eval.content_words import (
    CONTENT_WORDS,
    content_mask,
    content_mask_of_ids,
    content_slope,
    content_slopes,
    word_spans,
)

TOK = CaptionTokenizer(77)


def _words(text: str) -> tuple[list[str], list[bool]]:
    strings = TOK.token_strings(TOK.encode_text(text), keep_space=True)
    mask = content_mask(strings)
    return ["".join(strings[a:b]).strip() for a, b in word_spans(strings)], [mask[a] for a, _ in word_spans(strings)]


def test_two_clause_captions_keep_their_six_facts_and_drop_on_the_comma_and_the_connector():
    vocab = vocabularies("easy")
    for i in range(60):
        rng = example_rng(3, "test", i)
        text, group, _, _ = clause_caption(sample_scene(rng, set(), difficulty="easy"), rng)
        words, content = _words(text)
        _, clauses = parse_clause_caption(text, vocab)
        facts = [w for clause in clauses for v in clause.values() for w in v.split()]
        assert sorted(w for w, c in zip(words, content, strict=True) if c) == sorted(facts)
        dropped = {w for w, c in zip(words, content, strict=True) if not c}
        assert dropped == {"on", ",", "again" if group == "predictable" else "also"} or dropped == {
            ",", "again" if group == "predictable" else "also"}  # "on" only where a clause names the background


def test_short_captions_keep_the_scene_words_and_drop_articles_prefixes_and_count_filler():
    words, content = _words("a photo of a small cyan triangle in the top left on a light blue background")
    kept = [w for w, c in zip(words, content, strict=True) if c]
    assert kept == ["small", "cyan", "triangle", "top", "left", "light", "blue"]
    words, content = _words("three shapes including an orange square left of a red star")
    assert [w for w, c in zip(words, content, strict=True) if c] == ["three", "orange", "square", "left", "red", "star"]
    # every word the short generator writes is classified one way or the other, and each caption has a fact
    for i in range(80):
        rng = example_rng(5, "test", i)
        _, text = short_caption(sample_scene(rng, set(), difficulty="paper"), rng)
        words, content = _words(text)
        assert any(content), text
        assert all(c == (w in CONTENT_WORDS) for w, c in zip(words, content, strict=True))
    assert _words(order_caption(sample_scene(example_rng(0, "test", 0), set()), "colour_last"))[1] == [
        False, True, False, True]  # "a circle in red": shape and colour


def test_a_word_split_into_tokens_is_one_word_and_the_article_an_stays_a_function_word():
    ids = TOK.encode_text("an apple, a cyan star")
    strings = TOK.token_strings(ids, keep_space=True)
    assert [s.strip() for s in strings] == ["an", "apple", ",", "a", "cy", "an", "star"]  # "an" twice, same token
    assert ids[0] == ids[5]
    assert content_mask(strings) == [False, False, False, False, True, True, True]
    assert content_mask_of_ids(ids) == content_mask(strings)


def test_the_content_slope_by_hand():
    # values 1, 9, 2, 3 with content F, F, T, T (K = 4): x = 2/3 and 1, mean 2.5, ratios 0.8 and 1.2
    assert content_slope([1.0, 9.0, 2.0, 3.0], [False, False, True, True]) == pytest.approx(1.2)
    # content at x = 0, 0.5, 1 (K = 5) with values 2, 1, 0 (mean 1): slope -2; function words are ignored
    assert content_slope([2.0, 100.0, 1.0, -5.0, 0.0], [True, False, True, False, True]) == pytest.approx(-2.0)
    # x = 0, 0.5, 0.75 with ratios 2, 1, 0: sum dx dy = -0.75, sum dx^2 = 7/24, slope -18/7
    assert content_slope([2.0, 100.0, 1.0, 0.0, -5.0], [True, False, True, True, False]) == pytest.approx(-18 / 7)
    # the scale of the model does not matter: x 10 gives the same slope
    assert content_slope([10.0, 90.0, 20.0, 30.0], [False, False, True, True]) == pytest.approx(1.2)
    flat = content_slope([0.7, 0.7, 0.7], [True, True, True])
    assert flat == pytest.approx(0.0)
    # unscored positions (None) are left out; fewer than two scored content positions: None
    assert content_slope([1.0, None, 3.0], [True, True, True]) == pytest.approx(1.0)
    assert content_slope([1.0, None, 3.0], [True, True, False]) is None
    assert content_slope([5.0], [True]) is None
    assert content_slope([-1.0, 1.0], [True, True]) is None  # a mean at 0: no scale
    assert content_slopes([[1.0, 9.0, 2.0, 3.0], [5.0]], [[False, False, True, True], [True]]) == [
        pytest.approx(1.2), None]


def test_mismatched_inputs_fail_with_a_message():
    with pytest.raises(ValueError, match="one content flag per value"):
        content_slope([1.0, 2.0], [True])
    with pytest.raises(ValueError, match="one content mask per caption"):
        content_slopes([[1.0, 2.0]], [])
