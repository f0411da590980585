"""The two-clause captions of the embedded generator (caption style ``clauses``), on which the central claim's
interaction is measured: a predictable second clause restates the first word for word, an unpredictable one names
the object's other facts, every fact as likely at every place in both groups, the other styles unchanged."""

import json
from collections import Counter

import pytest

from mdc_workbench.data.captions import CLAUSE_FACTS, clause_caption, parse_clause_caption
from mdc_workbench.data.scene import example_rng, sample_scene, vocabularies
from mdc_workbench.data.synth import make_example


def clause_examples(n=96, seed=0):
    out = []
    for i in range(n):
        rng = example_rng(seed, "test", i)
        scene = sample_scene(rng, set(), difficulty="easy")
        out.append(clause_caption(scene, rng))
    return out


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


def test_parse_clause_caption_refuses_other_captions():
    with pytest.raises(ValueError, match="two-clause"):
        parse_clause_caption("a red circle", vocabularies("easy"))
