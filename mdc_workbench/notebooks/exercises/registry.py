"""The exercise registry: every notebook's checks under their ids (``<notebook>.<name>``), the cell's
:func:`check` and :class:`Result`, and the small helpers the checks share.

:mod:`~mdc_workbench.notebooks.exercises.lesson` (notebooks 00, 01, 06) and
:mod:`~mdc_workbench.notebooks.exercises.tables` (02-05) register into :data:`CHECKS` here with :func:`exercise`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Verdict = tuple[bool, str]  # (right?, what to tell the student)
CHECKS: dict[str, Callable[..., Verdict]] = {}
# characters: what a check tells a student, right or not, fits in a few lines under the cell (every check's messages
# for its solution and its wrong answers are held to it: tests/workbench/test_exercise_answers.py); a part of
# variable length
# (captions, verdicts read from a results file) is cut to fit with :func:`fit`
MESSAGE_LIMIT = 400


def exercise(name: str) -> Callable[[Callable[..., Verdict]], Callable[..., Verdict]]:
    """Register a check under `name` (``<notebook>.<exercise>``)."""
    def register(fn: Callable[..., Verdict]) -> Callable[..., Verdict]:
        CHECKS[name] = fn
        return fn
    return register


@dataclass
class Result:
    """What a check cell shows: ``ok`` True (right), False (not yet) or None (not answered yet)."""

    exercise: str
    ok: bool | None
    message: str

    @property
    def verdict(self) -> str:
        return {True: "right", False: "not yet", None: "not answered yet"}[self.ok]

    def __str__(self) -> str:
        return f"{self.exercise}: {self.verdict}: {self.message}"

    __repr__ = __str__  # what a plain-text frontend shows

    def _repr_markdown_(self) -> str:
        icon = {True: "\u2714", False: "\u2718", None: "\u2610"}[self.ok]  # in common text fonts, unlike emoji
        return f"{icon} **{self.exercise}**, {self.verdict}: {self.message}"


def _unanswered(answer: Any) -> bool:
    return answer is None or answer is Ellipsis or (isinstance(answer, dict) and any(
        v is None or v is Ellipsis for v in answer.values()))


def check(name: str, answer: Any, *, solution: bool = False, **context: Any) -> Result:
    """Check `answer` to exercise `name` with the notebook's objects `context`. A function answer that returns
    None (an untouched ``...`` body) counts as not answered. With `solution`, a wrong answer raises AssertionError
    (the hidden solution cells: a solution that fails its own check must fail the notebook)."""
    if name not in CHECKS:
        raise KeyError(f"no exercise {name!r}; known: {', '.join(sorted(CHECKS))}")
    if _unanswered(answer):
        result = Result(name, None, "replace the `None` / `...` in the attempt cell above with your answer, then "
                                    "run this cell again")
    else:
        try:
            ok, message = CHECKS[name](answer, **context)
        except NotAnswered:
            ok, message = None, "your function returns None: write its body (the `...`), then run this cell again"
        except Exception as err:  # noqa: BLE001 - the student's code raised: say what, do not crash the notebook
            ok, message = False, fit(f"your answer raised {type(err).__name__}: {err}", MESSAGE_LIMIT)
        result = Result(name, ok, message)
    if solution:
        if result.ok is not True:
            raise AssertionError(f"the solution of {name} fails its own check: {result.message}")
        return Result(name, True, "the hidden solution passes this check")
    return result


# --------------------------------------------------------------------------------------------------------------
# 00: the lesson


class NotAnswered(Exception):
    """A function answer returned None (an untouched ``...`` body)."""


def call_answer(fn: Callable[..., Any], *args: Any) -> Any:
    """A function answer called on `args`; NotAnswered when it returns None (its body is still ``...``)."""
    out = fn(*args)
    if out is None:
        raise NotAnswered
    return out


def fit(text: str, room: int) -> str:
    """`text` cut to at most `room` characters, ending in "..." when cut."""
    return text if len(text) <= room else text[:max(0, room - 3)].rstrip() + "..."


def caption_text(model: Any, ids: Any) -> str:
    """Token ids (N',) as the words a student reads, quoted: ``"a red circle"``; ``[MASK]`` for a mask, ``<id N>``
    for an id outside the vocabulary (a check shows a student's wrong caption, ids and all)."""
    from mdc_core.tokenizer import CaptionTokenizer

    tokenizer = CaptionTokenizer(model.cfg.context_length)
    words = []
    for i in (int(v) for v in ids):
        try:
            words.append(tokenizer.token_string(i))
        except (ValueError, KeyError):
            words.append(f"<id {i}>")
    return '"' + " ".join(words) + '"'


def is_close(a: float, b: float, rel: float = 1e-4, abs_: float = 1e-4) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=abs_)


def choice(answer: Any, right: str, options: dict[str, str], why: str,
           hint: str = "read the question again") -> Verdict:
    """A multiple-choice answer ("a", "(b)", ...) against `right`: `why` when right, the chosen option's meaning and
    `hint` when not, how to answer when it is none of `options`."""
    given = str(answer).strip().lower().strip("()")
    if given not in options:
        return False, f"answer with one of {', '.join(options)} (got {answer!r})"
    if given == right:
        return True, why
    return False, f"({given}) says: {options[given]}. Not quite: {hint}."
