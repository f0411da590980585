"""One story of the central claim (mdc_workbench.notebooks.central_story): every text that states it quotes only numbers
its cited results file holds (a deliberately wrong number fails), the declared constants agree with the code, and
before the run the story says the measure is declared and not yet run."""

import json
from pathlib import Path

import pytest

from mdc_core.data.captions import LINK_SHARE
from mdc_workbench.eval.paper import FEATURE_EFFECT, FLAT_SHARE
from mdc_workbench.notebooks.central_story import (
    DECLARED,
    RESULTS,
    check_quotes,
    citing_texts,
    load_results,
    sources,
    story,
    write_results,
)

ROOT = Path(__file__).resolve().parents[1]


TEXTS = list(citing_texts(ROOT))


@pytest.mark.parametrize("name, text", TEXTS, ids=[name for name, _ in TEXTS])
def test_every_text_quotes_only_what_its_results_file_holds(name, text):
    assert check_quotes(text, sources(ROOT)) == [], name


def test_a_deliberately_wrong_number_fails():
    results = load_results(RESULTS)
    cited = {"central_claim.json": {0.5, 2.0, 1600.0, -0.61, -1.22, 0.03}, "results.md": {400.0, -4.3, -6.0, -2.6}}
    right = ("The interaction is -0.61 [-1.22, +0.03] (docs/central_claim.json).\n\n"
             "At 400 steps Table 1 read reversed, -4.3 [-6.0, -2.6] (docs/results.md).")
    assert check_quotes(right, cited) == []
    wrong = right.replace("-0.61", "-0.71")
    assert [w.split(" ")[0] for w in check_quotes(wrong, cited)] == ["-0.71"]
    assert [w.split(" ")[0] for w in check_quotes(right.replace("-6.0", "-6.5"), cited)] == ["-6.5"]
    assert check_quotes("A number in a paragraph that cites nothing: 12.3.", cited) == []
    # the shipped texts against the shipped files: a wrong number planted in section 9's place would fail
    planted = "MDC's fall is 0.37 of ARC's (docs/central_claim.json)."
    assert check_quotes(planted, sources(ROOT, results)) != []


def test_the_declared_constants_are_the_codes():
    assert DECLARED["flat_share"] == FLAT_SHARE and DECLARED["feature_effect"] == FEATURE_EFFECT
    assert DECLARED["link_share"] == LINK_SHARE and DECLARED["link_percent"] == 100 * LINK_SHARE
    assert load_results(RESULTS)["declared"] == DECLARED


def test_before_the_run_the_story_says_declared_and_no_verdict():
    results = load_results(RESULTS)
    if results["status"] != "declared":
        pytest.skip("the plan has run: the story quotes its verdicts")
    text = story(results)
    assert "declared in docs/evidence.md and not yet run" in text and "holds" not in text


def test_the_results_file_is_written_from_a_plan_summary(tmp_path):
    part = {"column": "clauses gradient: slope, predictable - unpredictable", "better": "ARC", "worse": "MDC",
            "difference": {"mean": -0.61, "low": -1.22, "high": 0.03}}
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"claims": [
        {"key": "central_claim", "table": "central_claim", "kind": "claim", "verdict_text": "not resolved over 3 seeds",
         "parts": [part]},
        {"key": "table1", "table": "table1", "parts": []}]}))
    out = write_results(summary, tmp_path / "central_claim.json")
    results = load_results(out)
    assert results["status"] == "measured" and list(results["claims"]) == ["central_claim"]
    text = story(results)
    assert "**not resolved over 3 seeds**" in text and "-0.61 [-1.22, +0.03]" in text
    assert "that disagreement is the finding" in text
    assert check_quotes(f"{text}\n\nIt reads -0.61 (central_claim.json).", sources(ROOT, results)) == []
    (tmp_path / "none.json").write_text(json.dumps({"claims": [{"key": "table1", "table": "table1"}]}))
    with pytest.raises(ValueError, match="no verdict of the central claim"):
        write_results(tmp_path / "none.json", tmp_path / "x.json")
    (tmp_path / "bad.json").write_text(json.dumps({"status": "guessed"}))
    with pytest.raises(ValueError, match="status must be"):
        load_results(tmp_path / "bad.json")


def test_the_exercise_message_states_the_results_files_verdicts(tmp_path, monkeypatch):
    from mdc_workbench.notebooks import central_story
    from mdc_workbench.notebooks import exercises as ex

    assert "declared in docs/evidence.md and not yet run" in ex.check("00.arc_signal", "b").message
    measured = {"status": "measured", "declared": DECLARED, "claims": {"central_claim": {
        "verdict_text": "holds over 3 seeds", "parts": [{"column": "c", "better": "ARC", "worse": "MDC",
                                                         "mean": -0.6, "low": -1.2, "high": -0.1}]}}}
    (tmp_path / "r.json").write_text(json.dumps(measured))
    monkeypatch.setattr(central_story, "RESULTS", tmp_path / "r.json")
    message = ex.check("00.arc_signal", "b").message
    assert "central_claim: holds over 3 seeds (c (ARC vs MDC): -0.60 [-1.20, -0.10])" in message
    assert "not yet run" not in message
