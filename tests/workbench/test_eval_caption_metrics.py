"""Tests for mdc_workbench.eval.caption_metrics (pycocoevalcap scorers, Java fallback, SPICE guard)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from mdc_workbench.eval import caption_metrics as cm
from mdc_workbench.eval.caption_metrics import score_captions

has_java = cm._java_missing_reason() is None

# distinct captions per image: CIDEr's idf weights vanish for n-grams that every image shares
CAPTIONS = {
    "img0": "a red circle above a small blue square",
    "img1": "two green triangles on a gray background",
    "img2": "a large yellow star to the left of a purple circle",
    "img3": "three orange squares in a row near the bottom",
}
IDENTICAL_REFS = {k: [v, v.capitalize() + "."] for k, v in CAPTIONS.items()}


@pytest.fixture(scope="module")
def identical() -> dict[str, Any]:
    """All metrics with Java, predictions equal to the references (METEOR start-up ~10 s, paid once)."""
    if not has_java:
        pytest.skip("needs java")
    return score_captions(CAPTIONS, IDENTICAL_REFS, per_image_cider=True)


def test_identical_captions_score_near_perfect(identical: dict[str, Any]) -> None:
    assert identical["tokenizer"] == "ptb" and identical["n_images"] == 4
    for n in (1, 2, 3, 4):
        assert identical[f"BLEU@{n}"] == pytest.approx(1.0, abs=1e-6)
    assert identical["ROUGE-L"] == pytest.approx(1.0)
    assert identical["CIDEr"] > 5.0
    assert set(identical["per_image"]["CIDEr"]) == set(CAPTIONS)


def test_meteor_in_unit_interval(identical: dict[str, Any]) -> None:
    assert 0.0 <= identical["METEOR"] <= 1.0
    assert identical["METEOR"] > 0.9
    assert "METEOR" not in identical["unavailable"]


def test_spice_marked_unavailable_without_raising(identical: dict[str, Any]) -> None:
    if cm._spice_missing_reason() is None:
        pytest.skip("SPICE's CoreNLP jars are installed here, so SPICE may run")
    assert identical["SPICE"] is None
    assert "CoreNLP" in identical["unavailable"]["SPICE"] or "stanford" in identical["unavailable"]["SPICE"]


def test_bleu1_by_hand() -> None:
    # 5 of 6 unigrams clip-match ("the" x2, cat, on, mat); equal lengths -> no brevity penalty
    r = score_captions({1: "the cat sat on the mat"}, {1: ["the cat is on the mat"]}, metrics=["BLEU"])
    assert r["BLEU@1"] == pytest.approx(5 / 6, abs=1e-6)
    # all 2 unigrams match, but the closest reference has 6 tokens: brevity penalty exp(1 - 6/2)
    r = score_captions({1: "The cat."}, {1: ["the cat sat on the mat"]}, metrics=["BLEU"])
    assert r["BLEU@1"] == pytest.approx(math.exp(-2), abs=1e-6)
    assert set(r) == {"BLEU@1", "BLEU@2", "BLEU@3", "BLEU@4", "unavailable", "tokenizer", "n_images"}


def test_without_java_falls_back_to_simple_tokenizer(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_run(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Java tool used although Java is missing")

    monkeypatch.setattr(cm, "_java_missing_reason", lambda: "no `java` executable on PATH (test)")
    monkeypatch.setattr(cm.PTBTokenizer, "tokenize", must_not_run)
    monkeypatch.setattr(cm, "MeteorProcess", must_not_run)
    r = score_captions(CAPTIONS, IDENTICAL_REFS)
    assert r["tokenizer"] == "simple" and "java" in r["unavailable"]["PTBTokenizer"]
    assert r["BLEU@4"] == pytest.approx(1.0, abs=1e-6) and r["CIDEr"] > 5.0
    assert r["METEOR"] is None and "Java" in r["unavailable"]["METEOR"]
    assert r["SPICE"] is None and "SPICE" in r["unavailable"]


def test_ptb_failure_falls_back_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise OSError("read-only file system")

    monkeypatch.setattr(cm, "_java_missing_reason", lambda: None)
    monkeypatch.setattr(cm.PTBTokenizer, "tokenize", broken)
    r = score_captions(CAPTIONS, IDENTICAL_REFS, metrics=["BLEU"])
    assert r["tokenizer"] == "simple" and "read-only" in r["unavailable"]["PTBTokenizer"]
    assert r["BLEU@1"] == pytest.approx(1.0, abs=1e-6)


def test_spice_failure_does_not_sink_other_metrics(monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(gts: Any, res: Any) -> None:
        raise RuntimeError("java.lang.OutOfMemoryError")

    monkeypatch.setattr(cm, "_java_missing_reason", lambda: None)
    monkeypatch.setattr(cm, "_spice_missing_reason", lambda: None)
    monkeypatch.setattr(cm.PTBTokenizer, "tokenize", lambda self, caps: {
        k: [" ".join(cm.simple_tokenize(c["caption"])) for c in v] for k, v in caps.items()})
    monkeypatch.setitem(cm._SCORERS, "SPICE", crash)
    r = score_captions(CAPTIONS, IDENTICAL_REFS, metrics=["CIDEr", "SPICE"])
    assert r["SPICE"] is None and "OutOfMemoryError" in r["unavailable"]["SPICE"]
    assert r["CIDEr"] > 5.0


def test_simple_tokenize() -> None:
    assert cm.simple_tokenize("A dog's red ball.") == ["a", "dog", "'s", "red", "ball"]


@pytest.mark.parametrize("preds, refs, message", [
    ({}, {1: ["a"]}, "predictions is empty"),
    ({1: "a", 2: "b"}, {1: ["a"]}, r"1 predicted key\(s\) have no references, e.g. \[2\]"),
    ({1: "a"}, {1: []}, "empty list"),
    ({1: "a"}, {1: "a"}, "list of strings"),
    ({1: None}, {1: ["a"]}, "must be a str"),
])
def test_input_errors(preds: dict, refs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        score_captions(preds, refs, metrics=["BLEU"])


def test_unknown_metric() -> None:
    with pytest.raises(ValueError, match="unknown metric"):
        score_captions({1: "a"}, {1: ["a"]}, metrics=["BLEU", "BERTScore"])


@pytest.mark.skipif(not has_java, reason="needs java")
def test_the_ptb_tokenizer_writes_nothing_to_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    """Its Java program prints a progress line per call, which a notebook shows as a red error box."""
    r = cm.score_captions({1: "a red circle"}, {1: ["a red circle on a gray background"]}, metrics=["BLEU"])
    assert r["tokenizer"] == "ptb"
    assert "PTBTokenizer" not in capfd.readouterr().err


@pytest.mark.skipif(not has_java, reason="needs java")
def test_meteor_process_matches_pycocoevalcap_and_names_a_dead_process() -> None:
    """The process wrapper gives pycocoevalcap's own numbers; a Java process that ended is a one-line
    RuntimeError (pycocoevalcap's Meteor would raise with its lock held and hang in __del__ later)."""
    from pycocoevalcap.meteor.meteor import Meteor

    gts = {k: [r.lower() for r in refs] for k, refs in IDENTICAL_REFS.items()}
    res = {"img0": ["a red circle above a blue square"], "img1": ["green triangles on gray"],
           "img2": ["a star and a circle"], "img3": ["three squares"]}
    reference = Meteor()
    try:
        want = reference.compute_score(gts, res)
    finally:
        del reference
    ours = cm.MeteorProcess(timeout=120)
    try:
        assert ours.compute_score(gts, res) == want
        ours.proc.kill()
        ours.proc.wait()
        with pytest.raises(RuntimeError, match="METEOR's Java process ended"):
            ours.compute_score(gts, res)
    finally:
        ours.close()
