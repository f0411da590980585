"""The evidence part of a plan's summary: every table cell as a mean with its 95% interval, and the paper's claims
with their verdicts (:mod:`mdc_workbench.eval.stats`, :mod:`mdc_workbench.eval.claims`).

Runs that repeat one notebook over training seeds (a plan's ``seeds``; the seed is the run's
:data:`SEED_PARAM` parameter) are gathered cell by cell: with two or more seeds a cell's interval is the
t-interval over seeds (with per-item scores: also a hierarchical bootstrap over seeds and test items); with one
seed it is a bootstrap over the test items the notebook recorded (the table's ``items``), which captures test-set
noise only; without items it has none. Torch-free.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from mdc_workbench.eval.budget_curve import ANNEALED_TABLE, annealed_budget_table, steps_table_name
from mdc_workbench.eval.claims import (
    claims_markdown,
    evaluate_claims,
    gather_tables,
    not_encoded_markdown,
    table_estimates,
)
from mdc_workbench.eval.data_scaling import data_scaling_table
from mdc_workbench.eval.paper import CHECK, CLAIM, EXPLORATORY, OBSERVATION
from mdc_workbench.eval.stats import Estimate

SCALING_TABLE = "data_scaling"  # Fig. 5: Table 1 gathered by training-set size
SEED_PARAM = "train_seed"  # the notebook parameter a plan's `seeds` sets (mdc_workbench.runs.plans)
SECTIONS = ((CLAIM, "The paper's claims"), (CHECK, "Workbench checks (not claims of the paper)"),
            (OBSERVATION, "Observations: row orders the paper's tables show but its text does not claim (no verdict)"),
            (EXPLORATORY, "Exploratory measurements (no verdict)"))


def gather_runs(runs: Sequence[tuple[str, dict[str, Any], dict[str, Any]]],
                reference: int | None = None, reference_size: int | None = None) -> dict[str, dict[str, Any]]:
    """``[(run id, parameters, metrics.json)]`` -> :func:`~mdc_workbench.eval.claims.gather_tables` output, each table
    with a ``setting`` line (:func:`run_setting`) for the runs that wrote it.

    Runs trained for another number of steps than the plan's reference budget (`reference`: the plan's own
    ``steps``; by default :func:`reference_steps`) are
    separate models, not repeats: their tables are gathered as ``<table>_at_<N>_steps``, and Table 1 at every
    budget makes the annealed budget curve (``budget_annealed``, :func:`~mdc_workbench.eval.budget_curve.
    annealed_budget_table`). Likewise runs trained on another number of images than the plan's own ``n_train``
    (`reference_size`; by default the most common): their tables are ``<table>_at_<N>_images``, and Table 1 at every
    size makes the data-scaling table (``data_scaling``, Fig. 5, :func:`~mdc_workbench.eval.data_scaling.
    data_scaling_table`)."""
    measured = [(rid, params, metrics) for rid, params, metrics in runs if metrics]
    if reference is None:
        reference = reference_steps([params for _, params, _ in measured])
    if reference_size is None:
        reference_size = reference_steps([p for _, p, _ in measured], "n_train")
    gathered = gather_tables([(rid, params.get(SEED_PARAM),
                               _at_size(_at_budget(metrics, params.get("steps"), reference), params.get("n_train"),
                                        reference_size))
                              for rid, params, metrics in measured])
    params = {rid: p for rid, p, _ in runs}
    for name, table in gathered.items():
        seeds = {params.get(rid, {}).get(SEED_PARAM) for rid in table["runs"]}
        settings = dict.fromkeys(run_setting(params.get(rid, {}), name) for rid in table["runs"])
        table["setting"] = " | ".join(s for s in settings if s)
        if table["setting"]:
            table["setting"] += f"; {len(seeds)} training seed{'s' if len(seeds) > 1 else ''}"
    annealed = annealed_budget_table(gathered, reference)
    if annealed is not None:
        seeds = {params.get(SEED_PARAM) for rid, params, _ in runs if rid in set(annealed["runs"])}
        budgets = ", ".join(f"{n}" for n in sorted({int(c.split()[0]) for cols in annealed["cells"].values()
                                                      for c in cols}))
        annealed["setting"] = f"{budgets} steps; {len(seeds)} training seed{'s' if len(seeds) > 1 else ''}"
        gathered[ANNEALED_TABLE] = annealed
    scaling = None
    if len({p.get("n_train") for _, p, _ in measured if p.get("n_train") is not None}) > 1:
        try:
            scaling = data_scaling_table(measured, steps=reference)
        except ValueError as err:  # e.g. one method, size and seed twice: the tables above still stand
            print(f"data scaling: not gathered ({err})")
    if scaling is not None:
        seeds = {params.get(SEED_PARAM) for rid, params, _ in measured if rid in set(scaling["runs"])}
        scaling["setting"] = (f"{', '.join(str(n) for n in scaling['sizes'])} training images, {reference} steps; "
                              f"{len(seeds)} training seed{'s' if len(seeds) > 1 else ''}")
        gathered[SCALING_TABLE] = scaling
    return gathered


def reference_steps(params: Sequence[dict[str, Any]], key: str = "steps") -> int | None:
    """The plan's reference training budget: the ``steps`` (or another integer parameter `key`, e.g. ``n_train``)
    most of its runs use (a tie: the larger), None when no run names it. Runs at other values are other models
    (:func:`gather_runs`)."""
    counts = Counter(int(p[key]) for p in params if isinstance(p.get(key), (int, float)))
    if not counts:
        return None
    return max(counts, key=lambda value: (counts[value], value))


def _at_size(metrics: dict[str, Any], n_train: Any, reference: int | None) -> dict[str, Any]:
    """`metrics` with every table renamed ``<table>_at_<N>_images`` when the run trained on another number of images
    than `reference`; unchanged otherwise."""
    if reference is None or not isinstance(n_train, (int, float)) or int(n_train) == reference:
        return metrics
    tables = metrics.get("tables") or {}
    return {**metrics, "tables": {f"{name}_at_{int(n_train)}_images": t for name, t in tables.items()}}


def _at_budget(metrics: dict[str, Any], steps: Any, reference: int | None) -> dict[str, Any]:
    """`metrics` with every table renamed :func:`~mdc_workbench.eval.budget_curve.steps_table_name` when the run trained
    another number of steps than `reference`; unchanged otherwise."""
    if reference is None or not isinstance(steps, (int, float)) or int(steps) == reference:
        return metrics
    tables = metrics.get("tables") or {}
    return {**metrics, "tables": {steps_table_name(name, int(steps)): t for name, t in tables.items()}}


def run_setting(params: dict[str, Any], table: str = "") -> str:
    """The scale a run measured at, from its notebook parameters: ``"tiny_fast models, 400 steps; 20000 embedded
    images (easy, short captions)"`` ('' when the parameters say nothing about it)."""
    bits = []
    if params.get("preset"):
        bits.append(f"{params['preset']} models" + (f", {params['steps']} steps" if params.get("steps") else ""))
    captions = params.get("captions")
    if table == "central_claim":
        captions = "short and two-clause"  # notebook 03 measures the central claim on a pair per caption kind
    elif table == "feature_order":
        captions = "linked shape-colour, either order,"  # a pair per caption order of the linked data
    if params.get("n_train"):
        detail = ", ".join(x for x in (params.get("difficulty"), f"{captions} captions" if captions else "") if x)
        bits.append(f"{params['n_train']} embedded images" + (f" ({detail})" if detail else ""))
    return "; ".join(bits)


def _cell_text(est: Estimate) -> str:
    digits = 3 if abs(est.mean) < 1 and (not est.has_interval or abs(est.high) < 1) else 1
    return est.format(digits)


def display_tables(gathered: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Tables in :func:`mdc_workbench.runs.summary.table_markdown`'s layout, each cell the text ``mean [low,
    high]``; ``means`` and ``intervals`` ((low, high) or None per cell) alongside, for figures."""
    out: dict[str, dict[str, Any]] = {}
    for name, table in gathered.items():
        est = table_estimates(table["cells"])
        values: dict[str, Any] = {}
        means: dict[str, Any] = {}
        intervals: dict[str, Any] = {}
        for row, cols in est.items():
            if set(cols) == {""}:
                e = cols[""]
                values[row], means[row] = _cell_text(e), e.mean
                intervals[row] = (e.low, e.high) if e.has_interval else None
            else:
                values[row] = {c: _cell_text(e) for c, e in cols.items()}
                means[row] = {c: e.mean for c, e in cols.items()}
                intervals[row] = {c: (e.low, e.high) if e.has_interval else None for c, e in cols.items()}
        out[name] = {"metric": table["metric"], "setting": table.get("setting", ""), "values": values,
                     "means": means, "intervals": intervals}
    return out


def interval_note(gathered: dict[str, dict[str, Any]]) -> str:
    """One sentence saying what the intervals are: over how many seeds, or test-set bootstrap for one seed."""
    seeds = sorted({len(c.values) for t in gathered.values() for cols in t["cells"].values() for c in cols.values()})
    if not seeds:
        return "No table was measured."
    if seeds == [1]:
        return ("**One training seed per model**: the brackets are 95% bootstrap intervals over the test items "
                "(test-set noise only, not training noise); cells without per-item scores have none. Repeat the "
                "plan over seeds (`seeds: [0, 1, 2]`) for intervals that include training noise.")
    counts = ", ".join(str(n) for n in seeds)
    return (f"Brackets: 95% intervals over training seeds (seeds per cell: {counts}): the t-interval over seeds, "
            "widened where the cell has per-item scores to cover a hierarchical bootstrap (seeds, then test items); "
            "a cell with one seed uses a bootstrap over test items (test-set noise only). Differences are paired by "
            "seed.")


def evidence_markdown(gathered: dict[str, dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """The summary's verdict section (markdown lines) and the claims' JSON-ready verdicts."""
    verdicts = evaluate_claims(gathered)
    one_seed = all(v["seeds"] <= 1 for v in verdicts if v["parts"])
    settings = {name: t.get("setting", "") for name, t in gathered.items()}
    lines = ["## The paper's claims, tested at this scale", "",
             "Each claim is stated as the paper's text makes it (section and table named), and tested as the line "
             "under it says, on this plan's small models and embedded synthetic data: a verdict says whether *these "
             "runs* show the paper's effect, not whether the paper is right at its scale. A part's verdict reads "
             "the 95% interval of its difference: **holds** (on the paper's side of 0, or of the stated margin for "
             "a claim of 'comparable': non-inferiority), **reversed** (on the other side), **not resolved** "
             "(containing it), **underpowered** (not resolved, and the difference the design detects with 80% power "
             "in a two-sided 5% test, printed per part, exceeds the paper's effect or the margin). A claim that "
             "something does not depend on a variable is an equivalence test against +-margin: **equivalent**, "
             "**not equivalent** or underpowered. A claim about *every* part (\"consistently\", \"the best of\", "
             "\"in every column\") holds when every part holds at 95%, with no multiplicity correction "
             "(intersection-union), and is reversed when Holm's step-down finds a part reversed (the level it used "
             "is shown); a claim about *some* part is the mirror image. Beside every verdict that is not resolved, "
             "the number of parts whose estimates point each way. Row orders that the paper's tables show but its "
             "text does not claim are observations, shown without a verdict. See docs/evidence.md.", ""]
    if one_seed:
        lines += ["**One training seed**: every verdict is about *this run* (its intervals hold test-set noise "
                  "only; another seed can change them). Repeat the plan over seeds before reading a verdict as a "
                  "statement about a method.", ""]
    measured = [v for v in verdicts if v["parts"]]
    for kind, title in SECTIONS:
        chosen = [v for v in measured if v["kind"] == kind]
        if chosen:
            lines += [f"### {title}", "", *claims_markdown(chosen, settings=settings), ""]
    absent = [v for v in verdicts if not v["parts"]]
    described, not_measured = not_encoded_markdown(gathered)
    if described:
        lines += ["### Measured without a verdict", "", *described, ""]
    lines += ["### Not measured in these runs", "",
              *claims_markdown(absent), *not_measured, ""]
    return lines, verdicts
