"""Pre-declaration, enforced: the fingerprint of what a plan's verdicts are judged under, recorded when its first run
starts and compared when its summary is written (torch-free).

The *definitions* are everything that decides a verdict besides the data: the claims table and the statements no
table tests (:data:`~mdc_workbench.eval.paper.PAPER_CLAIMS`, ``NOT_ENCODED``), the paper's numbers
(:data:`~mdc_workbench.eval.paper.PAPER`), the statistical constants and margins (``mdc_workbench.eval.stats``'s
confidence, power and bootstrap sizes; ``mdc_workbench.eval.paper``'s upper-case constants), and the source text
of the deciding functions (:func:`deciding_functions`, read by :func:`inspect.getsource`); and, since 2026-12-02
(issue 61), everything else that can change what a verdict reads: the **measurement** code (the central claim, its
content words, the probe, the statistics and the tables' builders: :data:`MEASUREMENT`), the **data** and caption
generators (every module of ``mdc_workbench/data/``), and the **plan** (its YAML file and the notebooks it runs,
:func:`plan_files`: steps, seeds, test sizes and what the notebook measures). :func:`fingerprint` hashes each group
and the whole. The runner writes it into the plan folder as ``declared.json`` when a plan starts and the
file is absent (:func:`record_start`); the summary records the fingerprint it was judged under beside it and, when
the two differ, says so in its first lines (:func:`declaration_lines`). A plan folder whose runs finished before
this existed has no record, and its summary says that instead.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DECLARED = "declared.json"  # in the plan folder, beside summary.md
RECORDED_SINCE_2026_11_28 = ("claims", "paper", "constants", "source")  # every record has these
GROUPS = (*RECORDED_SINCE_2026_11_28, "measurement", "data", "plan")
GROUP_TEXT = {"claims": "the claims table", "paper": "the paper's numbers",
              "constants": "the margins and statistical constants", "source": "the code of the deciding functions",
              "measurement": "the measurement code", "data": "the data and caption generators",
              "plan": "the plan file or its notebooks"}
ROOT = Path(__file__).resolve().parents[2]  # the checkout: the paths below are relative to it
# the code that turns a trained model into the numbers a verdict reads (beside the deciding functions' source)
MEASUREMENT = tuple(f"mdc_workbench/eval/{m}.py" for m in (
    "central_claim", "claim_stats", "content_words", "stats", "decision", "cells", "claims", "probe", "probe_pool",
    "probe_lbfgs", "probe_baselines", "probe_data", "probe_tables", "items", "recompute")) + (
    "mdc_workbench/notebooks/probe_report.py",
    *(f"mdc_workbench/seed_stack/{m}.py" for m in ("features", "claim", "items")))  # a seed stack's members' measures
DATA = "mdc_workbench/data"  # every module in it: the synthetic scenes, the caption generators, the shards


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def deciding_functions() -> list[Any]:
    """The functions whose code turns gathered tables into verdicts (their source is part of the fingerprint)."""
    from mdc_workbench.eval import cells, claims, decision, stats

    return [claims.evaluate_claim, claims._comparisons, claims._rows, claims._match, claims._solved_blind,
            cells.difference_spread, decision.decide, decision._part_at, decision.holm_step_down,
            stats.detectable_difference, stats._t_power_multiple, stats.power_verdict, stats.equivalence_verdict,
            stats.null_value, stats.Spread.interval, stats.Spread.p_value]


def constants() -> dict[str, Any]:
    """The statistical constants and the claims module's margins and effects, by name."""
    from mdc_workbench.eval import paper, stats

    out = {f"stats.{k}": getattr(stats, k) for k in ("CONFIDENCE", "ALPHA", "POWER", "N_BOOT", "N_BOOT_TESTS",
                                                     "MIN_ITEMS")}
    tables = ("PAPER_CLAIMS", "NOT_ENCODED")  # hashed as the claims table
    out.update({f"paper.{k}": v for k, v in vars(paper).items()
                if k.isupper() and k not in tables and isinstance(v, (int, float, str, tuple))})
    return out


def plan_files(plan: str | Path | None) -> list[Path]:
    """The plan file and the notebooks it names (each entry's path, found as :func:`~mdc_workbench.runs.plans.load_plan`
    finds it: relative to the working directory, else to the plan's folder); [] for None. A notebook found in
    neither place is listed where the working directory would hold it (hashed as missing)."""
    import yaml

    if plan is None:
        return []
    plan = Path(plan)
    try:
        entries = (yaml.safe_load(plan.read_text()) or {}).get("notebooks") or []
    except (OSError, yaml.YAMLError, AttributeError):
        return [plan]
    found = []
    for entry in entries:
        name = str(entry.get("path") if isinstance(entry, dict) else entry)
        here = Path.cwd() / name
        found.append(here if here.is_file() or not (plan.parent / name).is_file() else plan.parent / name)
    return [plan, *sorted(set(found))]


def _files_sha(paths: list[Path], root: Path | None = None) -> str:
    """One hash of the files' names (relative to `root`, else their own names) and bytes; a missing file hashes as
    missing, so that its appearing moves the hash too."""
    h = hashlib.sha256()
    for p in paths:
        name = str(p.relative_to(root)) if root is not None else p.name
        h.update(name.encode() + b"\0" + (p.read_bytes() if p.is_file() else b"<missing>") + b"\0")
    return h.hexdigest()[:12]


def covered_files(root: Path = ROOT) -> dict[str, list[Path]]:
    """The files of the measurement and data groups under `root` (the checkout; a test passes a copy)."""
    return {"measurement": [root / m for m in MEASUREMENT], "data": sorted((root / DATA).glob("*.py"))}


def fingerprint(plan: str | Path | None = None, root: Path = ROOT) -> dict[str, str]:
    """12-hex-digit hashes of each group of definitions (:data:`GROUPS`) and of all of them (``"definitions"``).
    `plan`: the plan file whose file and notebooks make the ``plan`` group (None: no plan, an empty group);
    `root`: where the measurement and data files are read (the checkout)."""
    from mdc_workbench.eval.paper import NOT_ENCODED, PAPER, PAPER_CLAIMS

    files = covered_files(root)
    parts = {"claims": _sha(repr(PAPER_CLAIMS) + repr(NOT_ENCODED)),
             "paper": _sha(repr([(k, v.title, v.metric, v.values) for k, v in PAPER.items()])),
             "constants": _sha(repr(sorted(constants().items()))),
             "source": _sha("".join(inspect.getsource(f) for f in deciding_functions())),
             "measurement": _files_sha(files["measurement"], root), "data": _files_sha(files["data"], root),
             "plan": _files_sha(plan_files(plan))}
    return {**parts, "definitions": _sha(json.dumps(parts, sort_keys=True))}


def read_start(out: Path) -> dict[str, Any] | None:
    """The record `out`/declared.json holds (None when absent). A file that is not a record raises, naming it."""
    path = Path(out) / DECLARED
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err}); it records the definitions a plan's runs started under") from err
    needed = (*RECORDED_SINCE_2026_11_28, "definitions")  # the later groups are absent from earlier records
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in needed):
        raise ValueError(f"{path}: needs the fingerprints {', '.join(needed)} as strings")
    return record


def record_start(out: Path, runs_finished: bool, plan: str | Path | None = None) -> dict[str, Any] | None:
    """At a plan's start: write the current :func:`fingerprint` (of the plan file `plan`) into `out`/declared.json
    unless it is there; return the record. When the file is absent but runs of the plan already finished
    (`runs_finished`: a folder from before declarations were recorded), nothing is written and None returned:
    when those runs began is not known."""
    record = read_start(out)
    if record is not None or runs_finished:
        return record
    record = {**fingerprint(plan), "recorded": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / DECLARED).write_text(json.dumps(record, indent=2) + "\n")
    return record


def declaration_lines(start: dict[str, Any] | None, now: dict[str, str]) -> list[str]:
    """The summary's first lines on pre-declaration: a warning when the definitions `now` (the summary's
    :func:`fingerprint`) differ from those recorded at the start (`start`), naming what changed; one plain line
    when they match; a note when the start was not recorded."""
    if start is None:
        return [f"Definitions `{now['definitions']}` (claims, paper numbers, margins, deciding code, "
                f"measurement code, data generators, plan: "
                f"`{DECLARED}`); when this plan's first run started was not recorded (runs from before "
                "2026-11-28), so whether they changed since is not known.", ""]
    unrecorded = [g for g in GROUPS if not isinstance(start.get(g), str)]  # records from before 2026-12-02
    changed = ", ".join(GROUP_TEXT[g] for g in GROUPS if g not in unrecorded and start[g] != now[g])
    if not changed:
        later = "" if not unrecorded else (
            f"; {', '.join(GROUP_TEXT[g] for g in unrecorded)} were not yet fingerprinted then (before 2026-12-02), "
            "so whether they changed is not known")
        return [f"Definitions `{now['definitions']}`: the same as when this plan's first run started "
                f"({start.get('recorded', 'time not recorded')}; `{DECLARED}`){later}.", ""]
    when = start.get("recorded", "time not recorded")
    return [f"**Warning: the claim definitions changed after this plan's runs began.** Judged under "
            f"`{now['definitions']}`; its first run started under `{start['definitions']}` ({when}). "
            f"Changed: {changed}. The verdicts below were not declared before the data were seen.", ""]
