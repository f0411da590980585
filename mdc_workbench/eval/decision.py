"""The one decision table: a claim's verdict from its parts' intervals (torch-free).

A claim of several parts combines them as :data:`~mdc_workbench.eval.stats.EVERY` (an intersection-union test:
every part holds at level alpha, no correction; reversed when Holm's step-down finds a part reversed),
:data:`~mdc_workbench.eval.stats.SOME` (the mirror image) or :data:`~mdc_workbench.eval.stats.SINGLE`;
:func:`decide` reads them, :func:`holm_step_down` is the step-down it uses. The intervals, spreads, power and
single-part verdicts it builds on are :mod:`mdc_workbench.eval.stats`'s; docs/evidence.md explains both for
readers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from mdc_workbench.eval.stats import (
    ALPHA,
    COMBINATIONS,
    EQUIVALENT,
    EVERY,
    HOLDS,
    NOT_EQUIVALENT,
    REVERSED,
    SINGLE,
    SOME,
    UNDERPOWERED,
    UNMEASURED,
    UNRESOLVED,
    Estimate,
    Spread,
    detectable_difference,
    equivalence_verdict,
    null_value,
    power_verdict,
)


def holm_step_down(spreads: Sequence[Spread | None], nulls: Sequence[float], alpha: float = ALPHA
                   ) -> list[tuple[str, float]]:
    """Holm's step-down over the measured parts of one claim, each a two-sided test of ``a - b == null``.

    Parts are taken in order of their p-values; the k-th (0-based) of m is tested with its interval at level
    ``1 - alpha / (m - k)``; the first whose interval contains its null and every part after it are not
    rejected. Returns per part ``(side, level)``: side ``"above"`` / ``"below"`` (the interval at that level
    lies above / below the null), ``""`` (not rejected) or ``"unmeasured"`` (no interval); level 0.0 when none.
    With one part this is the plain 95% interval."""
    measured = [i for i, s in enumerate(spreads) if s is not None and s.has_interval]
    out: list[tuple[str, float]] = [("unmeasured", 0.0)] * len(spreads)
    order = sorted(measured, key=lambda i: spreads[i].p_value(nulls[i]))  # type: ignore[union-attr]
    stopped = False
    for k, i in enumerate(order):
        level = 1 - alpha / (len(order) - k)
        est = spreads[i].interval(level)  # type: ignore[union-attr]
        side = "above" if est.low > nulls[i] else "below" if est.high < nulls[i] else ""
        if stopped or not side:
            stopped = True
            side = ""
        out[i] = (side, level)
    return out


@dataclass(frozen=True)
class PartTest:
    """One part of a claim as :func:`decide` takes it: the distribution of ``a - b``, the relation it is tested
    for, its margin and the effect below which it is underpowered (the paper's effect, or the margin)."""

    spread: Spread | None
    relation: str = ">"
    margin: float = 0.0
    effect: float | None = None


@dataclass(frozen=True)
class PartOutcome:
    """What :func:`decide` found for one part: its verdict, the level of the interval that verdict read (0.0 when
    unmeasured), that interval, the difference detectable at that level with 80% power, and whether its estimate
    points the paper's way (True), against it (False) or neither (None: unmeasured, or exactly at the null)."""

    verdict: str
    level: float
    interval: Estimate | None
    detectable: float | None
    toward: bool | None


@dataclass(frozen=True)
class Decision:
    """A claim's verdict from :func:`decide`, with each part's outcome."""

    verdict: str
    combination: str
    parts: tuple[PartOutcome, ...]

    @property
    def measured(self) -> int:
        return sum(p.verdict != UNMEASURED for p in self.parts)

    def counts(self) -> str:
        """``"1 of 6 parts points the paper's way, 5 against"``: where the estimates point, verdicts aside."""
        toward = sum(p.toward is True for p in self.parts)
        against = sum(p.toward is False for p in self.parts)
        verb = "point" if toward != 1 else "points"
        return f"{toward} of {self.measured} part{'s' if self.measured != 1 else ''} {verb} the paper's way, " \
               f"{against} against"


def _side(est: Estimate, null: float) -> str:
    return "above" if est.low > null else "below" if est.high < null else ""


def _part_at(test: PartTest, level: float) -> PartOutcome:
    """One part read off its interval at `level` (no multiplicity): holds, reversed, not resolved or underpowered;
    equivalence parts by :func:`equivalence_verdict`."""
    if test.spread is None or not test.spread.has_interval:
        return PartOutcome(UNMEASURED, 0.0, None, None, None)
    est = test.spread.interval(level)
    null = null_value(test.relation, test.margin)
    detectable = detectable_difference(test.spread, 1 - level)
    if test.relation == "equivalent":
        toward = abs(est.mean) < test.margin
        return PartOutcome(equivalence_verdict(est, test.margin), level, est, detectable, toward)
    paper_side = "below" if test.relation == "<" else "above"
    toward = None if est.mean == null else (est.mean < null) == (paper_side == "below")
    side = _side(est, null)
    result = UNRESOLVED if not side else HOLDS if side == paper_side else REVERSED
    return PartOutcome(power_verdict(result, detectable, test.effect), level, est, detectable, toward)


def _holds(outcome: PartOutcome) -> bool:
    return outcome.verdict in (HOLDS, EQUIVALENT)


def _against(outcome: PartOutcome) -> bool:
    return outcome.verdict in (REVERSED, NOT_EQUIVALENT)


def decide(parts: Sequence[PartTest], combination: str = EVERY, alpha: float = ALPHA) -> Decision:
    """The decision table: one verdict for a claim of `parts`, combined as `combination`.

    ========== ======================================== ============================================
    claim      holds when                               reversed when
    ========== ======================================== ============================================
    single     its one part holds at 1 - alpha          its one part is reversed at 1 - alpha
    every      every measured part holds at 1 - alpha   Holm's step-down finds a part reversed
               (intersection-union: no correction)      (a statement about *some* part)
    some       Holm's step-down finds a part that holds every measured part is reversed at 1 - alpha
    ========== ======================================== ============================================

    Otherwise the claim is **underpowered** when the design could not have shown it (every: some part that does
    not hold is underpowered; some: every part is) and **not resolved** otherwise; **not measured** when no part
    has an interval (unmeasured parts are left out, as the summary lists them as missing). A claim of only
    equivalence parts says equivalent / not equivalent instead of holds / reversed. Each part's outcome is read at
    the level its role needs: ``every`` and ``single`` at 1 - alpha, ``some`` at its Holm level.
    """
    if combination not in COMBINATIONS:
        raise ValueError(f"combination must be one of {COMBINATIONS}, got {combination!r}")
    if combination == SINGLE and len(parts) != 1:
        raise ValueError(f"a single claim has one part, got {len(parts)}")
    plain = [_part_at(p, 1 - alpha) for p in parts]
    measured = [i for i, o in enumerate(plain) if o.verdict != UNMEASURED]
    if not measured:
        return Decision(UNMEASURED, combination, tuple(plain))
    words = (EQUIVALENT, NOT_EQUIVALENT) if all(parts[i].relation == "equivalent" for i in measured) \
        else (HOLDS, REVERSED)
    stepped = [i for i in measured if parts[i].relation != "equivalent"]
    holm = dict(zip(stepped, holm_step_down([parts[i].spread for i in stepped],
                                            [null_value(parts[i].relation, parts[i].margin) for i in stepped],
                                            alpha), strict=True))
    outcomes = list(plain)
    if combination == SOME:  # "holds" is about some part, so read at its Holm level; "reversed" at 1 - alpha each
        for i in stepped:
            paper_side = "below" if parts[i].relation == "<" else "above"
            at_level = _part_at(parts[i], holm[i][1])
            if holm[i][0] == paper_side:
                outcomes[i] = replace(at_level, verdict=HOLDS)
            elif plain[i].verdict != REVERSED:  # holding alone is not enough once the parts are counted
                outcomes[i] = at_level if at_level.verdict != HOLDS else replace(
                    at_level, verdict=power_verdict(UNRESOLVED, at_level.detectable, parts[i].effect))
        if any(_holds(outcomes[i]) for i in measured):
            return Decision(words[0], combination, tuple(outcomes))
        if all(_against(plain[i]) for i in measured):
            return Decision(words[1], combination, tuple(outcomes))
        weak = all(outcomes[i].verdict == UNDERPOWERED for i in measured)
    else:  # every part: "holds" at 1 - alpha each; "reversed" is about some part, so read at its Holm level
        for i in stepped:
            paper_side = "below" if parts[i].relation == "<" else "above"
            if holm[i][0] and holm[i][0] != paper_side:
                outcomes[i] = replace(_part_at(parts[i], holm[i][1]), verdict=REVERSED)
            elif plain[i].verdict == REVERSED:  # reversed alone, not once the parts are counted
                outcomes[i] = replace(plain[i], verdict=UNRESOLVED)
        if all(_holds(outcomes[i]) for i in measured):
            return Decision(words[0], combination, tuple(outcomes))
        if any(_against(outcomes[i]) for i in measured):
            return Decision(words[1], combination, tuple(outcomes))
        weak = any(outcomes[i].verdict == UNDERPOWERED for i in measured)
    return Decision(UNDERPOWERED if weak else UNRESOLVED, combination, tuple(outcomes))
