"""Exercises with checks for the notebooks: a student writes an attempt, runs the check cell and reads whether it
is right; a hidden solution cell follows.

In a notebook every exercise is four cells: the question (markdown), the attempt (code the student edits: a
value or a function, ``None`` / a body of ``...`` until answered), the check (``ex.check("01.schedule_variance",
answer, **context)``, whose result shows as one line: right, not yet and why, or not answered yet) and the
solution (source hidden in JupyterLab, tagged ``solution``), which calls :func:`check` with ``solution=True``:
that raises when the solution does not pass, so executing the notebooks (the test suite does) runs every solution
through its check.

Each check is a function of the answer and the notebook's objects (model, batch, ...) registered under its id
``<notebook>.<name>`` in the one registry :data:`CHECKS` (:mod:`.registry`; the checks of 00, 01 and 06 in
:mod:`.lesson`, of 02-05 in :mod:`.tables`); it recomputes the right answer with ``mdc_core`` and compares.
"""

from . import lesson, tables  # noqa: F401  (importing them registers their checks)
from .lesson import FIRST_KINDS, PassCounter, first_revealed_kinds, masked_accuracy, word_kind  # noqa: F401
from .registry import (  # noqa: F401
    CHECKS,
    MESSAGE_LIMIT,
    NotAnswered,
    Result,
    Verdict,
    call_answer,
    caption_text,
    check,
    choice,
    exercise,
    fit,
    is_close,
)
