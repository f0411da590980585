"""The GPU check's plan and time: the evidence plan scaled to another budget (:func:`scale_plan`), its wall-clock
estimate on one GPU (:func:`plan_minutes`), each bench phase's from its last measurement (:func:`measured_bench`),
and how the check spends its budget (:func:`estimate`; ``make gpu-check-estimate`` prints it). What
:mod:`mdc_workbench.runs.gpu_check` runs; torch-free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

BENCHMARKS = Path("benchmarks")  # the last measured figures (the bench's JSON reports) the estimate reads
GOAL_MIN = 8.0  # the evidence plan's wall-clock goal on one GPU (minutes)
STEP_S = 0.0228  # tiny_fast training step, batch 64, eager, one process on an H200 (benchmarks/README.md)
RUN_EXTRA_S = 45.0  # per run: kernel start, data load, probes or the signal measure (an allowance, not measured)
LOAN_S = 600.0  # what the check may take of a lent machine, its start included (10 minutes)
# allowances, not measured (make gpu-check has not run end to end on a GPU yet): a lent machine's start, the transfer
# and the wheelhouse install ("a minute or more" to start); per mdc bench: imports, inputs, the matmul peak; per
# training row: a fresh process, the model, the FLOP count; a row the last figures lack; the CUDA tests; the curves
STARTUP_S, BENCH_START_S, ROW_START_S, UNMEASURED_ROW_S, CUDA_TESTS_S, CURVES_S = 120.0, 30.0, 15.0, 90.0, 150.0, 90.0
BUDGET_S = LOAN_S - STARTUP_S  # the check's default budget: with the machine's start, 10 minutes
PLAN_MARGIN_S, BENCH_RESERVE_S = 45.0, 180.0  # the plan's deadline: what is left - 45 s; a bench leaves 180 s
# seed stacks (issue 63): the seed-stack bench's GPU figures (make gpu-check writes them as seed_stack.json; copied here
# as benchmarks/seed_stack_h200.json), else the goal as an assumption: K=16 members at 8x fewer GPU-seconds
# per member-step than the solo step (benchmarks/step_phases_h200_after.json: 18.6 ms, host-bound)
STACK_FILE, SOLO_STEP_FILE, STACK_GOAL, STACK_GOAL_K = "seed_stack_h200.json", "step_phases_h200_after.json", 8.0, 16
MEMBER_EXTRA_S = 10.0  # per member of a stack: its probes or signal measure after training (an allowance)
# the seed-stack bench (python -m mdc_workbench.seed_stack.bench on CUDA, first of the benches): solo and vmap rows at
# K = 1, 4, 16, each a fresh process; a row not measured yet takes an allowance of 20 s (CUDA start, model, 7 steps)
STACK_BENCH, STACK_BENCH_TIMEOUT_S, STACK_BENCH_MEMBERS = "bench_seed_stack", 120.0, (1, 4, 16)
STACK_BENCH_ROWS, STACK_BENCH_STEPS, STACK_BENCH_WARMUP, UNMEASURED_STACK_ROW_S = ("solo", "vmap"), 5, 2, 20.0


@dataclass(frozen=True)
class BenchRun:
    """One ``mdc bench`` of the check: its preset, batch and training rows, and the report of its last measurement
    (under ``benchmarks/``), whose rows' warm-up and step times give its estimate."""

    name: str
    preset: str
    batch: int  # 0: the preset's
    rows: tuple[str, ...]
    timeout_s: float
    measured: str  # file under benchmarks/
    extra: tuple[str, ...] = ()  # more mdc bench options (profile, host operations)


BENCH_RUNS = (  # eager and compiled: CUDA graphs (graphs), the whole step compiled (whole); MDC vs ARC at 128
    BenchRun("bench_vit_b32_b128", "vit_b32", 128, ("mdc", "mdc_graphs", "arc", "arc_graphs"), 210,
             "vit_b32_h200_b128.json", ("--profile", "25", "--count-ops")),
    BenchRun("bench_vit_b32_b256", "vit_b32", 256, ("mdc", "mdc_graphs"), 120, "vit_b32_h200_b256.json"),
    BenchRun("bench_tiny_fast", "tiny_fast", 0, ("mdc", "mdc_graphs", "mdc_whole"), 90, "tiny_fast_h200.json",
             ("--count-ops",)),
)
BENCH_STEPS = 10  # timed steps per row (--steps)


def scale_plan(source: Path, out: Path, *, steps: dict[int, int], device: str, seeds: list[int], n_train: int,
               n_eval: int, probe_limit: int, position_limit: int, jobs: int, name: str, output_root: Path) -> Path:
    """A copy of the plan `source` at another budget: every ``steps`` value (the base one and each entry's) mapped by
    `steps` (old -> new; warm-up and checkpoint intervals follow as the same fraction), on `device`, with `seeds`,
    smaller data and probes, and its own output folders: runs, ``_data`` and ``_models`` under
    `output_root`/<name>/."""
    plan = yaml.safe_load(source.read_text())
    old_prefix = f"{plan.get('output_root', 'papermill_runs')}/{plan['name']}/"
    new_prefix = f"{output_root}/{name}/"

    def rescale(params: dict[str, Any]) -> None:
        if "steps" in params:
            old = params["steps"]
            if old not in steps:
                raise ValueError(f"plan {source}: no scaled budget for {old} steps; give scale_plan one")
            new = steps[old]
            params["steps"] = new
            over = params.get("overrides", {})
            for key in ("train.warmup_steps", "train.ckpt_every", "train.log_every"):
                if key in over:
                    over[key] = max(1, round(over[key] * new / old))
        for key, value in list(params.items()):
            if isinstance(value, str):
                params[key] = value.replace(old_prefix, new_prefix)

    base = plan["parameters"]
    base.update(device=device, n_train=n_train, n_eval=n_eval, probe_limit=probe_limit)
    rescale(base)
    for entry in plan["notebooks"]:
        params = entry.setdefault("parameters", {}) if isinstance(entry, dict) else {}
        if "overrides" in params and "steps" not in params:
            params["steps"] = base["steps"]
        if "steps" in params and "overrides" not in params:
            params["overrides"] = dict(base.get("overrides", {}))
        if "steps" in params:
            old = params["steps"]
            if old not in steps:
                raise ValueError(f"plan {source}: no scaled budget for {old} steps; give scale_plan one")
        rescale(params)
        if "position_limit" in params:
            params["position_limit"] = min(params["position_limit"], position_limit)
        if isinstance(entry, dict) and "seeds" in entry:
            entry["seeds"] = seeds
    plan.update(name=name, seeds=seeds, jobs=jobs, output_root=str(output_root))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(plan, sort_keys=False))
    return out


def _param(run: Any, declared: dict[str, Any], key: str) -> Any:
    """A run's parameter `key`: the plan's value, else the notebook's declared default."""
    import ast

    if key in run.parameters:
        return run.parameters[key]
    default = declared.get(key, {}).get("default")
    return None if default is None else ast.literal_eval(default.replace("true", "True").replace("false", "False"))


def trained_models(run: Any, declared: dict[str, Any]) -> int:
    """How many models of the run's ``steps`` notebook 03 trains for `run`: one per objective, one per (objective,
    learning rate) of a sweep (``lrs``; the chosen one is reused), an ARC + MDC pair per caption kind for the central
    claim (``position_signal``: short and two-clause captions; the short pair is the run's own ARC and MDC when it
    trains them) and per caption order for its features (``feature_orders``)."""
    objectives = _param(run, declared, "objectives") or []
    swept = [o for o in objectives if o in ("clip", "arc", "mdc")]
    n = len(objectives) + len(swept) * max(0, len(_param(run, declared, "lrs") or []) - 1)
    if _param(run, declared, "position_signal"):
        own = _param(run, declared, "captions") == "short" and {"arc", "mdc"} <= set(objectives) and not \
            _param(run, declared, "lrs")  # this run's own ARC and MDC are the short pair
        n += 2 if own else 4
    if _param(run, declared, "feature_orders"):
        n += 4
    return n


@dataclass(frozen=True)
class StackStep:
    """Seconds per member-step of a seed stack of K tiny_fast members on the GPU, ``solo_s / K + per_member_s``: a
    line through K = 1 and the largest K, read as the host's cost of a step paid once for the stack (``solo_s``)
    and the GPU's per member (``per_member_s``), and where the figures come from."""

    solo_s: float  # the host's share: what a stack of K pays once per step
    per_member_s: float  # the GPU's share per member
    measured: bool
    source: str

    def member_step_s(self, members: int) -> float:
        """Seconds per member-step of a stack of `members`."""
        return self.solo_s / members + self.per_member_s


def stack_step(root: Path = BENCHMARKS) -> StackStep:
    """:class:`StackStep` from the seed-stack bench's last GPU figures (`root`/:data:`STACK_FILE`: the ``vmap`` rows'
    member-steps at the smallest and largest K, a line through them), else the issue's goal as an assumption: the
    solo step of `root`/:data:`SOLO_STEP_FILE` (18.6 ms, host-bound) at K = 1 and :data:`STACK_GOAL` x fewer
    GPU-seconds per member-step at K = 16 (unmeasured)."""
    path = root / STACK_FILE
    rows = json.loads(path.read_text()).get("rows", []) if path.is_file() else []
    vmap = sorted((r["members"], r["step_s"]) for r in rows if r.get("row") == "vmap" and r.get("device") == "cuda")
    if len(vmap) >= 2 and vmap[-1][0] > vmap[0][0]:
        (k1, s1), (k2, s2) = vmap[0], vmap[-1]
        per_member = (s2 - s1) / (k2 - k1)
        ks = ", ".join(f"K={k}: {1e3 * s / k:.2f} ms" for k, s in vmap)
        return StackStep(s1 - k1 * per_member, per_member, True, f"measured ({root / STACK_FILE}: per member-step "
                                                                       f"{ks})")
    solo = json.loads((root / SOLO_STEP_FILE).read_text())["step_ms"] / 1e3
    per_member = (STACK_GOAL_K * solo / STACK_GOAL - solo) / (STACK_GOAL_K - 1)  # the line through K=1 and K=16
    return StackStep(solo - per_member, per_member, False,
                     f"UNMEASURED: assumed the goal, {STACK_GOAL:g}x fewer GPU-seconds per member-step at K="
                     f"{STACK_GOAL_K} than the solo step's {1e3 * solo:.1f} ms ({root / SOLO_STEP_FILE}), "
                     f"{1e3 * solo / STACK_GOAL:.2f} ms; no GPU stack was measured ({STACK_FILE} absent)")


def plan_minutes(plan: Any, *, step_s: float = STEP_S, extra_s: float = RUN_EXTRA_S, jobs: int | None = None,
                 stack: StackStep | None = None, member_extra_s: float = MEMBER_EXTRA_S
                 ) -> tuple[float, list[tuple[str, float, float]]]:
    """The plan's wall-clock estimate on one GPU, in minutes, and ``(run id, start, end)`` per run (minutes): runs
    start in plan order as one of `jobs` slots frees (:mod:`mdc_workbench.runs.runner`). A solo run takes
    ``trained_models x steps x step_s + extra_s``, taking runs that share the GPU not to slow each other (not
    measured). A seed stack's run (a ``members`` entry: the notebook's ``train_seeds``) of K members takes
    `extra_s`, then ``trained_models x steps`` stack steps of `stack`'s ``solo_s + K x per_member_s`` (the host's
    share once, the GPU's per member), then ``K x member_extra_s`` (each member's probes or signal measure). The
    stacks' host shares run side by side, their GPU shares add up: when the GPU's total (plus one `extra_s`) is
    longer than the slots' schedule, every run is stretched by the same factor to it. `plan` is a
    :class:`~mdc_workbench.runs.plans.Plan`. Example: 2 solo runs of 1 model x 1000 steps at 0.06 s, ``extra_s=0``,
    one slot: 1 + 1 = 2.0 minutes."""
    from mdc_workbench.runs.members import MEMBERS_PARAM

    if step_s <= 0 or extra_s < 0 or member_extra_s < 0:
        raise ValueError(f"step_s must be > 0, extra_s and member_extra_s >= 0, got {step_s}, {extra_s} and "
                         f"{member_extra_s}")
    slots = [0.0] * (jobs or plan.jobs)
    gpu_s = 0.0  # the stacks' GPU shares, all runs together
    schedule = []
    for run in plan.runs:
        declared = plan.declared.get(str(run.notebook), {})
        k = min(range(len(slots)), key=slots.__getitem__)
        steps = trained_models(run, declared) * int(_param(run, declared, "steps"))
        members = len(run.parameters.get(MEMBERS_PARAM) or [])
        if members:
            stack = stack or stack_step()
            seconds = extra_s + steps * members * stack.member_step_s(members) + members * member_extra_s
            gpu_s += steps * members * stack.per_member_s
        else:
            seconds = steps * step_s + extra_s
        schedule.append((run.run_id, slots[k], slots[k] + seconds))
        slots[k] += seconds
    makespan = max(slots)
    stretch = max(1.0, (extra_s + gpu_s) / makespan) if gpu_s and makespan > 0 else 1.0
    return stretch * makespan / 60, [(rid, stretch * a / 60, stretch * b / 60) for rid, a, b in schedule]


def bench_limit(timeout_s: float, left_s: float) -> float:
    """A bench phase's time limit: its own, cut to leave :data:`BENCH_RESERVE_S` of the `left_s` for the plan."""
    return min(timeout_s, max(30.0, left_s - BENCH_RESERVE_S))


def side_deadline(left_s: float) -> float:
    """The evidence plan's deadline (and the CUDA tests' limit) when `left_s` of the budget is left after the bench."""
    return max(60.0, left_s - PLAN_MARGIN_S)


def bench_seconds(run: BenchRun, figures: dict[str, Any]) -> float:
    """`run`'s wall time from a report of its last measurement (`figures`: ``mdc bench``'s JSON): per row a fresh
    process, its warm-up (the compile included) and its timed steps (+2 counting host operations, +1 counting FLOPs);
    a row the report lacks takes :data:`UNMEASURED_ROW_S`."""
    rows = figures.get("train", {})
    steps = BENCH_STEPS + 1 + (2 if "--count-ops" in run.extra else 0)
    total = BENCH_START_S
    for name in run.rows:
        row = rows.get(name, {})
        measured = "step_s" in row and "error" not in row
        total += ROW_START_S + row["warmup_s"] + steps * row["step_s"] if measured else UNMEASURED_ROW_S
    return total


def estimate(budget_s: float, bench_s: list[tuple[str, float, float]], plan_schedule: list[tuple[str, float, float]]
             ) -> list[dict[str, Any]]:
    """What each part of the check takes under `budget_s` (seconds), as :func:`run` spends it: ``bench_s`` gives each
    bench phase's (name, estimated seconds, own time limit), in order, each cut by :func:`bench_limit`; then the plan
    (``plan_schedule``: :func:`plan_minutes`'s (run id, start, end) in minutes) and the CUDA tests and the precision
    curves side by side until :func:`side_deadline`. Per part: ``estimate_s``, ``limit_s`` (what it gets) and
    ``takes_s`` (the smaller); the plan's ``finished``/``runs`` (the runs that end by its deadline). The last entry
    is the whole check: ``takes_s`` with the machine's start (:data:`STARTUP_S`), ``fits`` within :data:`LOAN_S`."""
    parts = [{"part": "start-up (allowance)", "estimate_s": STARTUP_S, "limit_s": None, "takes_s": STARTUP_S}]
    used = 0.0
    for name, seconds, timeout in bench_s:
        limit = bench_limit(timeout, budget_s - used)
        parts.append({"part": name, "estimate_s": seconds, "limit_s": limit, "takes_s": min(seconds, limit)})
        used += min(seconds, limit)
    deadline = side_deadline(budget_s - used)
    plan_s = 60 * max((end for _, _, end in plan_schedule), default=0.0)
    finished = sum(end * 60 <= deadline for _, _, end in plan_schedule)
    side = [{"part": "evidence_plan", "estimate_s": plan_s, "finished": finished, "runs": len(plan_schedule)},
            {"part": "cuda_tests", "estimate_s": CUDA_TESTS_S}, {"part": "precision_curves", "estimate_s": CURVES_S}]
    for part in side:
        part.update(limit_s=deadline, takes_s=min(part["estimate_s"], deadline))
    parts += side
    total = STARTUP_S + used + max(p["takes_s"] for p in side)
    parts.append({"part": "whole check", "estimate_s": None, "limit_s": STARTUP_S + budget_s, "takes_s": total,
                  "fits": total <= LOAN_S})
    return parts


def format_estimate(parts: list[dict[str, Any]]) -> str:
    """:func:`estimate`'s parts as a table in minutes."""
    def minutes(x: float | None) -> str:
        return "-" if x is None else f"{x / 60:.1f}"

    lines = [f"{'part':<24}{'estimate min':>14}{'limit min':>11}{'takes min':>11}  note"]
    for p in parts:
        note = f"{p['finished']} of {p['runs']} runs end by its deadline" if "runs" in p else ""
        if "fits" in p:
            note = f"{'fits' if p['fits'] else 'does NOT fit'} {LOAN_S / 60:g} minutes of a lent machine"
        lines.append(f"{p['part']:<24}{minutes(p['estimate_s']):>14}{minutes(p['limit_s']):>11}"
                     f"{minutes(p['takes_s']):>11}  {note}".rstrip())
    return "\n".join(lines)


def stack_bench_seconds(root: Path = BENCHMARKS) -> float:
    """The seed-stack bench's wall time from its last GPU figures (`root`/:data:`STACK_FILE`: per row a fresh process
    and its warm-up and timed steps), else :data:`UNMEASURED_STACK_ROW_S` per row."""
    path = root / STACK_FILE
    rows = [r for r in json.loads(path.read_text()).get("rows", []) if r.get("device") == "cuda"] \
        if path.is_file() else []
    if not rows:
        return BENCH_START_S + (1 + len(STACK_BENCH_ROWS[1:]) * len(STACK_BENCH_MEMBERS)) * UNMEASURED_STACK_ROW_S
    return BENCH_START_S + sum(ROW_START_S + (STACK_BENCH_WARMUP + STACK_BENCH_STEPS) * r["step_s"] for r in rows)


def measured_bench(root: Path = BENCHMARKS) -> list[tuple[str, float, float]]:
    """(name, estimated seconds, time limit) of each bench phase, in the check's order (the seed-stack bench, then
    :data:`BENCH_RUNS`), from its last report under `root`; a report that is missing counts every row as
    unmeasured."""
    out = [(STACK_BENCH, stack_bench_seconds(root), STACK_BENCH_TIMEOUT_S)]
    for run in BENCH_RUNS:
        path = root / run.measured
        out.append((run.name, bench_seconds(run, json.loads(path.read_text()) if path.is_file() else {}),
                    run.timeout_s))
    return out


DECIDING = (Path("plans/gpu_check.yaml"), Path("plans/gpu_central_claim.yaml"),  # the deciding GPU plans
            Path("plans/gpu_central_claim_1600.yaml"))


def call_estimates(paths: tuple[Path, ...] = DECIDING, *, step_s: float = STEP_S, stack: StackStep | None = None,
                   root: Path | None = None) -> list[dict[str, Any]]:
    """Each plan of `paths` run alone in one lent call (``mdc runs PLAN``): its runs, seeds and largest stack, its
    minutes (:func:`plan_minutes` with `stack`), the call's seconds with the machine's start (:data:`STARTUP_S`),
    whether that fits :data:`LOAN_S`, and each claim it declares with its power (``Plan.power_checks``)."""
    from mdc_workbench.runs.members import MEMBERS_PARAM
    from mdc_workbench.runs.plans import load_plan

    out = []
    for path in paths:
        plan = load_plan(path, root=root)
        minutes, _ = plan_minutes(plan, step_s=step_s, stack=stack)
        call_s = STARTUP_S + 60 * minutes
        out.append({"plan": str(path), "runs": len(plan.runs), "seeds": plan.seeds,
                    "members": max((len(r.parameters.get(MEMBERS_PARAM) or []) for r in plan.runs), default=0),
                    "plan_s": 60 * minutes, "call_s": call_s, "fits": call_s <= LOAN_S,
                    "power": [c.text() for c in plan.power_checks()]})
    return out


def format_calls(calls: list[dict[str, Any]], stack: StackStep) -> str:
    """:func:`call_estimates` as a table in minutes, with the source of the stacks' member-step and each plan's
    power."""
    lines = [f"Deciding plans, each alone in one lent call (start-up {STARTUP_S / 60:.1f} min + the plan); seed "
             f"stacks' member-step: {stack.source}",
             f"{'plan':<34}{'runs':>5}{'seeds':>6}{'K':>4}{'plan min':>10}{'call min':>10}  note"]
    for c in calls:
        fits = f"{'fits' if c['fits'] else 'does NOT fit'} {LOAN_S / 60:g} minutes"
        lines.append(f"{c['plan']:<34}{c['runs']:>5}{c['seeds']:>6}{c['members'] or '-':>4}{c['plan_s'] / 60:>10.1f}"
                     f"{c['call_s'] / 60:>10.1f}  {fits}")
        lines += [f"    power: {text}" for text in c["power"]]
    return "\n".join(lines)
