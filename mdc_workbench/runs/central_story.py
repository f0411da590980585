"""One story of the central claim, from one results file (``docs/central_claim.json``).

Lesson 00 section 9, notebook 03, the exercise messages, docs/notebooks.md, docs/results.md and README state the
central claim's verdicts; every one of them takes them from the file written after ``make central-claim``
(:func:`write_results`, from the plan's ``summary.json``), or, before that run, says the measure is declared and
not yet run. A passage that cites a results file (names ``central_claim.json`` or ``results.md``) may quote only
numbers that file holds: :func:`check_quotes` finds the others, and ``tests/workbench/test_central_story.py`` runs it
on every
such text.

    python -m mdc_workbench.runs.central_story papermill_runs/cpu_central_claim/summary.json
    python -m mdc_workbench.runs.central_story docs/gpu_central_claim_1600_summary.json --rejudge  # as now declared
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mdc_workbench.eval.paper import CENTRAL_TABLE, FEATURE_EFFECT, FLAT_SHARE

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "central_claim.json"
CLAIM_KEYS = ("central_claim", "central_claim_arc", "central_claim_flat", "feature_order")  # with a verdict
# what docs/evidence.md declared before the run (a text may quote these as well as the measured values)
DECLARED = {"flat_share": FLAT_SHARE, "feature_effect": FEATURE_EFFECT, "steps": 1600, "seeds": 3,
            "captions": 512, "link_share": 0.8, "link_percent": 80, "bins": 5, "pool": 16}
NOT_RUN = ("declared in docs/evidence.md and not yet run (`make central-claim`); no verdict exists, so none is "
           "quoted")
_NUMBER = re.compile(r"(?<![\w.])[-+−]?\d+(?:\.\d+)?")


def load_results(path: str | Path = RESULTS) -> dict[str, Any]:
    """The results file: ``{"status": "declared" | "measured", "declared": {...}, "claims": {key: {"verdict_text",
    "parts": [{"column", "better", "worse", "mean", "low", "high"}]}}, "source"}``."""
    data = json.loads(Path(path).read_text())
    if data.get("status") not in ("declared", "measured"):
        raise ValueError(f"{path}: status must be 'declared' or 'measured', got {data.get('status')!r}")
    return data


def write_results(summary: str | Path, path: str | Path = RESULTS, rejudge: bool = False) -> Path:
    """The results file from a plan's ``summary.json``: the verdicts and part intervals of the central claim's
    claims (measured), with the declared constants; beside it (same name, ``.png``) the profiles and the feature
    penalties with their intervals over seeds. `rejudge`: the verdicts not as the summary recorded them but judged
    again under the current definitions from the summary's per-seed values
    (:func:`mdc_workbench.eval.recompute.recompute`; t over seeds): for runs that finished before the claims were
    re-declared (the file says so, with the definitions' fingerprint)."""
    record = json.loads(Path(summary).read_text())
    judged = record.get("claims", [])
    if rejudge:
        from mdc_workbench.eval.recompute import recompute, summary_runs
        from mdc_workbench.runs.declared import fingerprint

        judged = recompute(summary_runs(record))["claims"]
    claims = {}
    for c in judged:
        if c.get("table") not in (CENTRAL_TABLE, "feature_order"):
            continue
        parts = [{"column": p["column"], "better": p["better"], "worse": p["worse"],
                  **{k: None if p.get("difference") is None else p["difference"].get(k)
                     for k in ("mean", "low", "high")}} for p in c.get("parts", [])]
        claims[c["key"]] = {"verdict_text": c.get("verdict_text", ""), "kind": c.get("kind"), "parts": parts}
    if not any(k in claims for k in CLAIM_KEYS):
        raise ValueError(f"{summary} holds no verdict of the central claim: run `make central-claim` first")
    out = {"status": "measured", "declared": DECLARED, "source": str(summary), "claims": claims}
    if rejudge:
        out["rejudged"] = (f"judged again from the summary's per-seed values (t over seeds) under definitions "
                           f"{fingerprint()['definitions']}, not as the summary recorded them")
    Path(path).write_text(json.dumps(out, indent=1) + "\n")
    tables = record.get("tables", {})
    if CENTRAL_TABLE in tables:  # the picture beside it: profiles and feature penalties with their intervals
        from mdc_workbench.eval.central_claim import plot_profiles
        plot_profiles(tables[CENTRAL_TABLE], Path(path).with_suffix(".png"), features=tables.get("feature_order"))
    return Path(path)


def _fmt(v: float) -> str:
    return f"{v:+.2f}"


def verdict_lines(results: dict[str, Any]) -> list[str]:
    """One markdown bullet per claim: its verdict and each part's mean and interval; before the run, one line
    saying it is declared and not yet run."""
    if results["status"] == "declared":
        return [f"- The central claim is {NOT_RUN}."]
    lines = []
    for key, claim in results["claims"].items():
        parts = "; ".join(f"{p['column']} ({p['better']} vs {p['worse']}): {_fmt(p['mean'])} "
                          f"[{_fmt(p['low'])}, {_fmt(p['high'])}]" for p in claim["parts"]
                          if None not in (p["mean"], p["low"], p["high"]))
        lines.append(f"- `{key}`: **{claim['verdict_text']}**" + (f" ({parts})" if parts else ""))
    return lines


def story(results: dict[str, Any] | None = None) -> str:
    """The markdown paragraph every text shows (source: docs/central_claim.json)."""
    results = load_results() if results is None else results
    head = ("**The central claim on this workbench** (both caption kinds side by side, and its consequence for "
            "features; source: `docs/central_claim.json`):")
    tail = ("" if results["status"] == "declared" else
            "\n\nWhere the short and the two-clause captions disagree, that disagreement is the finding.")
    return "\n".join([head, "", *verdict_lines(results)]) + tail


def allowed_numbers(results: dict[str, Any]) -> set[float]:
    """Every number a citing text may quote: the declared constants and each measured mean and bound."""
    values = {float(v) for v in {**DECLARED, **results.get("declared", {})}.values()}
    for claim in results.get("claims", {}).values():
        for part in claim.get("parts", []):
            values |= {float(part[k]) for k in ("mean", "low", "high") if part.get(k) is not None}
    return values


def numbers_in(text: str) -> set[float]:
    """Every number written in `text` (what a text citing it may quote)."""
    return {float(m.group().replace("−", "-")) for m in _NUMBER.finditer(text)}


def sources(root: Path = RESULTS.parents[1], results: dict[str, Any] | None = None) -> dict[str, set[float]]:
    """The results files a text may cite, each with the numbers it holds: ``central_claim.json`` (declared constants
    and measured values) and ``docs/results.md`` (every number written there)."""
    results = load_results(root / "docs" / "central_claim.json") if results is None else results
    return {"central_claim.json": allowed_numbers(results), "results.md": numbers_in((root / "docs" /
                                                                                       "results.md").read_text())}


def check_quotes(text: str, cited: dict[str, set[float]]) -> list[str]:
    """Numbers in the paragraphs of `text` that cite one of `cited`'s files (name a key) and that none of the cited
    files holds (a quote matches a value when it equals it at the digits quoted). Integers below 10 and years are
    not quotes (section numbers, counts of seeds)."""
    wrong = []
    for paragraph in re.split(r"\n\s*>?\s*\n|\n(?=\s*- |\|)", text):  # paragraphs, quotes, list items, table rows
        names = [k for k in cited if k in paragraph]
        if not names:
            continue
        allowed = set().union(*(cited[k] for k in names))
        body = paragraph
        for k in names:
            body = body.replace(k, "")
        for match in _NUMBER.finditer(body):
            quoted = match.group().replace("−", "-")
            digits = len(quoted.partition(".")[2])
            value = float(quoted)
            if digits == 0 and (abs(value) < 10 or 1900 < value < 2100):
                continue
            if not any(abs(value - a) <= 0.5 * 10 ** -digits + 1e-12 for a in allowed):
                wrong.append(f"{quoted} (citing {', '.join(names)}: {paragraph.strip()[:80]}...)")
    return wrong


def citing_texts(root: Path) -> Iterable[tuple[str, str]]:
    """(name, text) of every text that states the central claim: README, docs/results.md, docs/notebooks.md,
    notebooks 00 and 03 (their markdown), and the exercise messages."""
    import nbformat

    for rel in ("README.md", "docs/results.md", "docs/notebooks.md", "docs/evidence.md"):
        yield rel, (root / rel).read_text()
    for rel in ("notebooks/00_masked_diffusion_captioning.ipynb", "notebooks/03_linear_probing.ipynb"):
        nb = nbformat.read(root / rel, as_version=4)
        yield rel, "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    rel = "mdc_workbench/notebooks/exercises/lesson.py"  # the checks' messages of 00 (00.arc_signal)
    yield rel, (root / rel).read_text()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    rejudge = "--rejudge" in args
    args = [a for a in args if a != "--rejudge"]
    if len(args) not in (1, 2):
        print("usage: python -m mdc_workbench.runs.central_story SUMMARY_JSON [RESULTS_JSON] [--rejudge]",
              file=sys.stderr)
        return 2
    print(f"wrote {write_results(*args, rejudge=rejudge)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
