"""Issue 59 items 5 and 6 (the app): `/replay` checks a trajectory's shape, types and size before any work and
escapes what it inserts into HTML; a string in a slider or a file dict is one line, never a traceback or
``{"error": null}``; `/score` refuses a 16k-letter word before BPE with a bounded echo."""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
import pytest
from mdc_app import callbacks as A
from mdc_app import explore

from mdc_workbench.viz import trajectory_view
from tests.app.test_app import app  # noqa: F401 - the module-scoped app fixture
from tests.app.test_app_explore import _caption

HOSTILE = '9" onmouseover="alert(document.domain)" x="'


def _saved(tmp_path: Path) -> tuple[dict, Path]:
    state = _caption("a _ _ square")[0]
    path = Path(explore.save_json(state))
    return json.loads(path.read_text()), tmp_path / "replay.json"


def _refused(call, *words: str) -> str:
    with pytest.raises(gr.Error) as err:
        call()
    message = str(err.value.message if hasattr(err.value, "message") else err.value)
    assert "\n" not in message and len(message) < 400 and all(w in message for w in words), message
    return message


def test_a_hostile_step_field_is_refused_and_the_chips_escape_it(app, tmp_path):  # noqa: F811
    """`step: '9" onmouseover=...'` in a replayed trajectory: refused in one line; and the chips, even of a record
    that bypassed the check, never carry the attribute unescaped."""
    record, path = _saved(tmp_path)
    record["steps"][0]["step"] = HOSTILE
    path.write_text(json.dumps(record))
    _refused(lambda: explore.load_replay(str(path), None), "integer step")
    html = trajectory_view.chips_html(record, len(record["steps"]))  # unchecked: what a view must survive
    assert 'onmouseover="' not in html and "&quot; onmouseover=&quot;" in html


@pytest.mark.parametrize("damage", ["mixed", "confidence", "token", "huge"])
def test_a_damaged_or_huge_trajectory_is_one_line_before_any_work(app, tmp_path, damage):  # noqa: F811
    """A mixed-type step (a string position), a confidence that is a string, a token that is a number, or 60,000
    steps (13 CPU minutes and 2.4 GB in a worker, before): one line each."""
    record, path = _saved(tmp_path)
    first = record["steps"][0]
    if damage == "mixed":
        first["revealed"][0]["position"] = "1"
    elif damage == "confidence":
        first["revealed"][0]["confidence"] = "high"
    elif damage == "token":
        first["revealed"][0]["token"] = 7
    else:
        record["steps"] = [{"step": i, "revealed": [], "masked": first["masked"][:1]} for i in range(60_000)]
    path.write_text(json.dumps(record))
    _refused(lambda: explore.load_replay(str(path), None), "damaged trajectory")


def test_wrong_types_from_an_api_caller_are_one_line(app, tmp_path):  # noqa: F811
    """A string in the step slider, a file dict naming a server path, a string as the scene number: gr.Error with
    one line, never a traceback (which gradio answers with `{"error": null}`)."""
    state = _caption("a _ _ square")[0]
    _refused(lambda: A.show_step("abc", state), "step must be a number")
    _refused(lambda: A.play_tick(["1"], state), "step must be a number")
    _refused(lambda: explore.attention_view("abc", "last", "mean", state), "step must be a number")
    _refused(lambda: A.load_upload({"path": "/etc/passwd"}, state), "expected an uploaded file")
    _refused(lambda: explore.load_replay({"path": "/etc/passwd"}, state), "expected an uploaded file")
    _refused(lambda: A.show_scene("abc", "micro", state), "scene number")


def test_score_refuses_a_huge_word_before_bpe_with_a_bounded_echo(app):  # noqa: F811
    state = _caption("")[0]
    message = _refused(lambda: A.score_own("micro", state, "a " + "x" * 16_000, ["heuristic"], 8), "16002 characters")
    assert "x" * 41 not in message
