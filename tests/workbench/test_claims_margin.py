"""A summary prints a claim's margin with the digits it has: 1.08 is not "margin 1" (issue 61, item 5)."""

from __future__ import annotations

import pytest

from mdc_workbench.eval.cells import Cell
from mdc_workbench.eval.claims import claims_markdown, evaluate_claim
from mdc_workbench.eval.paper import PAPER_CLAIMS, TABLE1_MARGIN


def _table1(arc_gain: float) -> dict:
    seeds = range(3)
    return {"ARC": {"top-1": Cell({s: 70.0 + s for s in seeds}), "gain": Cell({s: arc_gain for s in seeds})},
            "MDC": {"top-1": Cell({s: 69.0 + 1.5 * s for s in seeds})}}


@pytest.mark.parametrize("arc_gain, shown", [(21.678, "1.08"), (16.0, "0.8"), (40.0, "2")])
def test_the_margin_is_printed_with_its_digits(arc_gain: float, shown: str) -> None:
    claim = next(c for c in PAPER_CLAIMS if c.key == "table1")
    result = evaluate_claim(claim, _table1(arc_gain))
    assert result["parts"][0]["margin"] == pytest.approx(TABLE1_MARGIN * arc_gain)
    text = "\n".join(claims_markdown([result]))
    assert f"(paper's effect or margin {shown})" in text
    assert f">= ARC - {shown} (= 0.05 x ARC gain)" in text
    if shown == "1.08":
        assert "margin 1)" not in text  # the old `.{n}g` with n = 1 printed this
