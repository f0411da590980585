"""The plan's progress bar in a log: its postfix changes every poll, but it is redrawn no more often than tqdm's
``mininterval`` (30 s when the command line writes into a log), so ``make demo > log`` holds no line per second."""

import io

from tqdm import tqdm

from mdc_workbench.runs.runner import show_postfix


def redraws(mininterval: float, polls: int) -> int:
    out = io.StringIO()  # no terminal
    bar = tqdm(total=5, desc="plan p", file=out, mininterval=mininterval)
    for i in range(polls):
        show_postfix(bar, f"01: step {i}")
    text = out.getvalue()
    bar.close()
    return text.count("\r") - 1  # the first draw when the bar opens


def test_a_logged_bar_is_redrawn_at_most_once_per_mininterval():
    assert redraws(mininterval=30.0, polls=50) == 0  # 50 polls inside one interval: no new line in the log


def test_a_terminal_bar_follows_every_poll():
    assert redraws(mininterval=0.0, polls=50) == 50  # the check fails when the throttle swallows every redraw


def test_the_postfix_shown_later_is_the_latest():
    out = io.StringIO()
    bar = tqdm(total=5, desc="plan p", file=out, mininterval=30.0)
    for i in range(5):
        show_postfix(bar, f"01: step {i}")
    bar.update(1)  # the next draw carries the newest text
    bar.close()
    assert "01: step 4" in out.getvalue() and "01: step 3" not in out.getvalue()
