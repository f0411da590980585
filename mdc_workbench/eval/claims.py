"""Verdicts of the paper's claims (:data:`~mdc_workbench.eval.paper.PAPER_CLAIMS`) on measured tables, and their
markdown (torch-free).

Tables are gathered over runs and seeds by :func:`~mdc_workbench.eval.cells.gather_tables`. Each claim is a set of
parts, each part one comparison of two rows (or of a row with a constant) in one column; its distribution is
:func:`~mdc_workbench.eval.cells.difference_spread`. For claims and workbench checks the parts are decided together by
the one decision table, :func:`~mdc_workbench.eval.decision.decide` (holds, reversed, not resolved, underpowered, not
measured; "every" part by intersection-union, "some" part by Holm: :attr:`Claim.combine`); observations
and exploratory measurements show their differences without a verdict. A claim whose table, rows or columns
are missing says so ("not measured"), and one training seed makes every verdict a statement about *this run*.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from mdc_workbench.eval.cells import (  # noqa: F401  (re-exported: the notebooks and tests import them from here)
    Cell,
    Table,
    cell_difference,
    difference_spread,
    gather_tables,
    table_estimates,
)
from mdc_workbench.eval.decision import (
    Decision,
    PartTest,
    decide,
)
from mdc_workbench.eval.paper import (  # noqa: F401
    BASELINE_ROWS,
    CHECK,
    CLAIM,
    EXPLORATORY,
    NOT_ENCODED,
    OBSERVATION,
    PAPER_CLAIMS,
    VERDICT_KINDS,
    Claim,
    Part,
)
from mdc_workbench.eval.stats import (
    ALPHA,
    N_BOOT,
    N_BOOT_TESTS,
    UNDERPOWERED,
    UNMEASURED,
    UNRESOLVED,
    describe_verdict,
    detectable_difference,
)

KIND_LABELS = {CLAIM: "the paper's claim", CHECK: "workbench check", OBSERVATION: "observation, no verdict",
               EXPLORATORY: "exploratory, no verdict"}


def _match(pattern: str, rows: Sequence[str]) -> list[str]:
    """Rows named `pattern`, or matching it as a shell pattern (exact names first: "[0.5, 1.0]" is a name)."""
    if pattern in rows:
        return [pattern]
    return [r for r in rows if fnmatch.fnmatchcase(r, pattern)]


def _rows(pattern: str, rows: Sequence[str], other: str | float) -> list[str]:
    if pattern == "*":
        excluded = {r for b in BASELINE_ROWS for r in _match(b, rows)}
        if isinstance(other, str):
            excluded |= set(_match(other, rows))
        return [r for r in rows if r not in excluded]
    return _match(pattern, rows)


def part_text(better: str, relation: str, worse: str | float, margin: float = 0.0, rule: str = "") -> str:
    """``"MDC >= ARC - 0.8"``, ``"ARC < 0"``, ``"CLIP > MDC"``, ``"|MDC - 0| < 0.1"``; `rule` says where a margin
    on the run's own scale came from (``"0.05 x ARC gain"``)."""
    rhs = f"{worse:g}" if isinstance(worse, (int, float)) else worse
    shown = f"{margin:.3g}" + (f" (= {rule})" if rule else "")
    if relation == "noninferior":
        return f"{better} >= {rhs} - {shown}"
    if relation == "equivalent":
        return f"|{better} - {rhs}| < {shown}"
    return f"{better} {relation} {rhs}"


def _solved_blind(claim: Claim, cells: Table, rows: Sequence[str | float], col: str) -> bool:
    """Whether the image-free twin (``"<row>, blind"``) of one of `rows` reaches the claim's `blind_ceiling` in
    `col`: a column the text alone solves says nothing about the image."""
    if claim.blind_ceiling is None:
        return False
    twins = [cells.get(f"{r}, blind", {}).get(col) for r in rows if isinstance(r, str)]
    return any(t is not None and t.estimate().mean >= claim.blind_ceiling for t in twins)


def _comparisons(claim: Claim, cells: Table, missing: list[str], uninformative: list[str] | None = None
                 ) -> list[dict[str, Any]]:
    """Every (part, better row, worse row or constant, column) the table holds, with its spread; what the claim
    names but the table lacks goes into `missing`, comparisons in a column an image-free twin solves
    (:attr:`Claim.blind_ceiling`) into `uninformative`."""
    rows = list(cells)
    n_boot = N_BOOT_TESTS if claim.kind in VERDICT_KINDS else N_BOOT
    out: list[dict[str, Any]] = []

    def flag(what: str) -> None:
        if what not in missing:
            missing.append(what)

    for part in claim.parts:
        for pattern in (part.better, part.worse):
            if isinstance(pattern, str) and pattern != "*" and not _match(pattern, rows):
                flag(f"row {pattern}")
        margin, rule = part.margin, ""
        if part.margin_of is not None:  # a share of a cell of this table: the margin on the run's own scale
            row, col = part.margin_of
            scale = cells.get(row, {}).get(col)
            if scale is None:
                flag(f"row {row}, column {col} (the margin's scale)")
                continue
            size = scale.estimate().mean
            if not size > 0:  # a margin relative to an effect the runs do not show has no scale
                flag(f"row {row}, column {col} (the margin's scale, {size:+.3g}, is not above 0)")
                continue
            margin, rule = part.margin * size, f"{part.margin:g} x {row} {col}"
        worse_rows: list[str | float] = (list(_rows(part.worse, rows, part.better)) if isinstance(part.worse, str)
                                         else [float(part.worse)])
        for better in _rows(part.better, rows, part.worse):
            for worse in worse_rows:
                if better == worse:
                    continue
                for col in part.columns:
                    a = cells[better].get(col)
                    b = cells[worse].get(col) if isinstance(worse, str) else worse
                    if a is None or b is None:
                        flag(f"column {col}")
                        continue
                    if _solved_blind(claim, cells, (better, worse), col):
                        if uninformative is not None:
                            uninformative.append(f"{better} vs {worse} ({col})")
                        continue
                    out.append({"better": better, "relation": part.relation, "worse": worse, "column": col,
                                "margin": margin, "margin_rule": rule, "spread": difference_spread(a, b, n_boot),
                                "lengths": _lengths(cells, better, worse)})
    for row in claim.paper_rows:
        if row not in rows:
            flag(f"row {row} (in the paper's table)")
    return out


def _lengths(cells: Table, better: str, worse: str | float) -> list[float] | None:
    """The two rows' mean output lengths where the table has a ``length`` column (Table 3): a verdict on captions
    says at which lengths it compared them."""
    if not isinstance(worse, str) or "length" not in cells[better] or "length" not in cells[worse]:
        return None
    return [sum(c.values.values()) / len(c.values) for c in (cells[better]["length"], cells[worse]["length"])]


def evaluate_claim(claim: Claim, cells: Table | None) -> dict[str, Any]:
    """Verdict of one claim on a gathered table (``None``: the table was not measured).

    Returns ``{"key", "kind", "source", "text", "tested_as", "table", "combine", "verdict", "verdict_text",
    "counts", "seeds", "parts": [{"better", "relation", "worse", "column", "margin", "difference": Estimate dict |
    None, "holm": {"level", "low", "high"} | None (a part read at a Holm level, not at 95%), "lengths": [mean
    length of each row] | None (tables with a ``length`` column), "detectable": the difference its test detects
    with 80% power | None, "effect": the paper's effect or the part's margin | None, "verdict", "verdict_text"}],
    "missing"}``. Observations and exploratory entries have verdict None (and None per part). The verdict is
    :func:`~mdc_workbench.eval.decision.decide`'s for the claim's :attr:`Claim.combine`; ``counts`` says how many parts'
    estimates point each way (:meth:`~mdc_workbench.eval.decision.Decision.counts`).
    """
    missing: list[str] = []
    base = {"key": claim.key, "kind": claim.kind, "source": claim.source, "text": claim.text,
            "tested_as": claim.tested_as, "table": claim.table, "combine": claim.combine}
    if cells is None:
        return {**base, "verdict": UNMEASURED if claim.kind in VERDICT_KINDS else None,
                "verdict_text": f"not measured (no `{claim.table}` table in these runs)", "counts": "", "seeds": 0,
                "parts": [], "missing": [f"table {claim.table}"]}
    uninformative: list[str] = []
    comparisons = _comparisons(claim, cells, missing, uninformative)
    base["uninformative"] = uninformative
    judged = claim.kind in VERDICT_KINDS
    tests = [PartTest(c["spread"], c["relation"], c["margin"],
                      c["margin"] if c["relation"] in ("noninferior", "equivalent") else claim.effect)
             for c in comparisons]
    decision = decide(tests, claim.combine) if judged and tests else None
    parts: list[dict[str, Any]] = []
    for i, c in enumerate(comparisons):
        spread = c.pop("spread")
        diff = None if spread is None else spread.interval()
        part = {**c, "difference": None if diff is None else diff.to_dict(), "seeds": 0 if spread is None
                else spread.seeds, "holm": None, "detectable": detectable_difference(spread), "effect": tests[i].effect,
                "verdict": None, "verdict_text": ""}
        if decision is not None:
            outcome = decision.parts[i]
            by_holm = abs(outcome.level - (1 - ALPHA)) > 1e-12 or (claim.combine == "some" and len(tests) > 1)
            if outcome.interval is not None and by_holm:  # read at its Holm level (one Holm step is at 95%)
                part["holm"] = {"level": outcome.level, "low": outcome.interval.low, "high": outcome.interval.high}
            part["detectable"] = outcome.detectable
            part["verdict"] = outcome.verdict
            part["verdict_text"] = describe_verdict(outcome.verdict, c["relation"], c["margin"])
        parts.append(part)
    measured = [p for p in parts if p["difference"] is not None and p["difference"]["low"] is not None]
    seeds = min((p["seeds"] for p in measured), default=0)
    if not judged:
        text = "no verdict" if measured else "not measured"
        return {**base, "verdict": None, "verdict_text": text, "counts": "", "seeds": seeds, "parts": parts,
                "missing": missing}
    if decision is None:
        return {**base, "verdict": UNMEASURED, "verdict_text": UNMEASURED, "counts": "", "seeds": seeds,
                "parts": parts, "missing": missing}
    return {**base, "verdict": decision.verdict, "verdict_text": _overall_text(decision, parts, seeds),
            "counts": decision.counts(), "seeds": seeds, "parts": parts, "missing": missing}


def _overall_text(decision: Decision, parts: list[dict[str, Any]], seeds: int) -> str:
    """"holds in this run", "not resolved over 3 seeds (0 of 6 parts point the paper's way, 6 against)", ...: every
    verdict that is not resolved (or underpowered), and every verdict of several parts, says where the parts'
    estimates point."""
    overall = decision.verdict
    if overall == UNMEASURED:
        return overall
    text = parts[0]["verdict_text"] if len(parts) == 1 else overall
    scope = " in this run" if seeds <= 1 else f" over {seeds} seeds"
    head, _, tail = text.partition(" (")
    counts = f" ({decision.counts()})" if overall in (UNRESOLVED, UNDERPOWERED) or decision.measured > 1 else ""
    if decision.measured > 1 and decision.combination != "single":
        counts = f" (every part must hold: {decision.counts()})" if decision.combination == "every" else \
            f" (some part must hold: {decision.counts()})"
    return f"{head}{scope}" + (f" ({tail}" if tail else "") + counts


def evaluate_claims(tables: Mapping[str, Mapping[str, Any]], claims: Sequence[Claim] = PAPER_CLAIMS, *,
                    measured_only: bool = False) -> list[dict[str, Any]]:
    """:func:`evaluate_claim` for every claim (:func:`~mdc_workbench.eval.cells.gather_tables` output); a claim whose
    table is absent is kept as not measured unless `measured_only`. An observation that repeats a comparison a
    claim or check already made (Table 5's worst schedule when only two were trained) is marked
    ``duplicate_of`` that claim's key, so the same comparison is never counted twice."""
    out: list[dict[str, Any]] = []
    seen: dict[tuple[str, frozenset[str], str], str] = {}  # (table, {row, row}, column) -> key of a judged claim
    for claim in claims:
        if measured_only and claim.table not in tables:
            continue
        result = evaluate_claim(claim, tables[claim.table]["cells"] if claim.table in tables else None)
        keys = [(claim.table, frozenset((p["better"], str(p["worse"]))), p["column"]) for p in result["parts"]]
        if claim.kind in VERDICT_KINDS:
            seen.update({k: claim.key for k in keys if k not in seen})
        else:
            same = [seen.get(k) for k in keys]
            for part, key in zip(result["parts"], same, strict=True):
                part["same_as"] = key
            result["duplicate_of"] = same[0] if same and all(s == same[0] for s in same) else None
        out.append(result)
    return out


def _difference_text(d: dict[str, Any] | None, digits: int) -> str:
    if d is None:
        return "no interval (one seed and no per-item scores, e.g. a corpus-level metric: needs >= 2 seeds)"
    if d["low"] is None:
        return f"{d['mean']:+.{digits}f}, no interval ({d['method']})"
    return f"{d['mean']:+.{digits}f} [{d['low']:+.{digits}f}, {d['high']:+.{digits}f}] ({d['method']})"


def _digits(result: dict[str, Any], digits: int) -> int:
    """More digits for small quantities (slopes, nats) than for percentages."""
    ends = [abs(p["difference"][k]) for p in result["parts"] if p["difference"] for k in ("mean", "low", "high")
            if p["difference"][k] is not None]
    return 3 if ends and max(ends) < 1 else digits


def claims_markdown(results: Sequence[dict[str, Any]], digits: int = 1,
                    settings: Mapping[str, str] | None = None) -> list[str]:
    """Markdown lines: per claim its kind, source, text and verdict, what it was tested as and at what scale
    (`settings`: table -> a line on the models and data), then each part with its difference and interval
    (and, for a part read at a Holm level, that level and interval)."""
    lines: list[str] = []
    for r in results:
        verdict = f"**{r['verdict_text']}**" if r["verdict"] is not None else f"*{r['verdict_text']}*"
        lines.append(f"- **{r['source']}** ({KIND_LABELS[r['kind']]}): {r['text']} -> {verdict}")
        if not r["parts"] and r["missing"] == [f"table {r['table']}"]:
            continue  # the whole table is absent: the verdict line says so
        if r["tested_as"]:
            lines.append(f"  - tested as: {r['tested_as']}")
        if (settings or {}).get(r["table"]):
            lines.append(f"  - scale: {settings[r['table']]}")
        if r.get("duplicate_of"):
            lines.append(f"  - the same comparison as `{r['duplicate_of']}` above (not counted again)")
            continue
        n = _digits(r, digits)
        for p in r["parts"]:
            where = f" ({p['column']})" if p["column"] else ""
            rule = p.get("margin_rule", "")
            line = (f"  - {part_text(p['better'], p['relation'], p['worse'], p['margin'], rule)}{where}: "
                    f"difference {_difference_text(p['difference'], n)}")
            if p["holm"]:
                holm = p["holm"]
                line += f"; Holm {100 * holm['level']:.1f}%: [{holm['low']:+.{n}f}, {holm['high']:+.{n}f}]"
            if p.get("detectable") is not None and p["verdict"] is not None:
                line += f"; detectable with 80% power: {p['detectable']:.{n}f}"
                if p.get("effect") is not None:  # 3 significant digits, as part_text: 1.08 is not "1"
                    line += f" (paper's effect or margin {abs(p['effect']):.3g})"
            if p.get("lengths"):
                line += f"; lengths {p['lengths'][0]:.1f} vs {p['lengths'][1]:.1f} tokens"
            if p["verdict"] is not None:
                line += f": {p['verdict_text']}"
            lines.append(line)
        if r.get("uninformative"):
            lines.append("  - uninformative, not tested (an image-free model solves the column): "
                         + ", ".join(r["uninformative"]))
        if r.get("missing"):
            lines.append(f"  - not in these tables (not measured): {', '.join(r['missing'])}")
    return lines


def not_encoded_markdown(tables: Collection[str] = ()) -> tuple[list[str], list[str]]:
    """The paper's statements no workbench table tests with a verdict (:data:`NOT_ENCODED`), as markdown lines:
    ``(described, not_measured)``. A statement whose descriptive table is among `tables` (the names of the tables
    in the runs) is described, with no verdict; the others are not measured."""
    described, missing = [], []
    for source, text, why, table in NOT_ENCODED:
        if table is not None and table in tables:
            described.append(f"- **{source}**: {text} -> *measured without a verdict*: {why} (the table `{table}` "
                             "above)")
        else:
            missing.append(f"- **{source}**: {text} -> *not measured*: {why}")
    return described, missing


def report_markdown(tables: dict[str, dict[str, Any]], seed: int | None = None, digits: int = 1) -> str:
    """What a notebook shows for its own paper tables (``metrics.json`` layout, one training seed): each cell as
    ``mean [95% interval]`` (a bootstrap over test items where the table has ``items``, test-set noise only),
    then the verdicts of the paper's claims on these tables. Repeats over seeds are the summary's job."""
    gathered = gather_tables([("notebook", seed, {"tables": tables})])
    lines: list[str] = []
    for name, table in gathered.items():
        est = table_estimates(table["cells"])
        columns = list(dict.fromkeys(c for cols in est.values() for c in cols))
        head = [name, *(c or table["metric"] for c in columns)]
        lines += ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
        for row, cols in est.items():
            cells = [cols[c].format(digits) if c in cols else "-" for c in columns]
            lines.append("| " + " | ".join([row, *cells]) + " |")
        lines.append("")
    lines.append("Brackets: 95% bootstrap intervals over the test items (one training seed: test-set noise only).")
    verdicts = evaluate_claims(gathered, measured_only=True)
    if verdicts:
        lines += ["", "**The paper's claims on these tables** (one training seed: every verdict is about this run; "
                  "see docs/evidence.md):", "", *claims_markdown(verdicts, digits)]
    return "\n".join(lines)

