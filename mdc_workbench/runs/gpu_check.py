"""``make gpu-check``: everything a rare, short GPU loan should measure, in one command that stops itself in time.

    python -m mdc_workbench.runs.gpu_check --out gpu_check_out [--budget-s 540]   # on a CUDA machine
    python -m mdc_workbench.runs.gpu_check --out /tmp/gc --tiny                  # the same structure on a CPU

Phases, each a child process with its own time limit, all writing into `--out`:

1. ``bench/``: the seed-stack bench first (``python -m mdc_workbench.seed_stack.bench --device cuda``: seconds per
   member-step of stacks of K = 1, 4, 16 ``tiny_fast`` members against the solo step, into ``seed_stack.json``; copied
   to ``benchmarks/seed_stack_h200.json`` it replaces the estimate's assumption for stacked plans), then ``mdc bench``
   on ``vit_b32`` at batch 128 (training rows eager and compiled with CUDA graphs, ARC,
   OpenCLIP CoCa; captioning at N' = 20; the profile of the compiled step in the training precision; host
   operations per step) and at batch 256 (training rows only), and ``tiny_fast`` (eager vs CUDA graphs). The bench
   runs alone, so its timings are the machine's.
2. Then, side by side (none of them times anything the bench reports): the evidence plan
   ``plans/gpu_check.yaml`` (``mdc runs`` with a deadline: whatever finished is summarised), the CUDA tests, and
   ``python -m mdc_workbench.bench.precision_curves`` (fp32 vs bf16 loss curves of the CUDA test's setting).
3. ``summary.md``: the machine, each phase's outcome and time, the bench's targets, the plan's summary.

Each phase runs in its own process group (session): a phase past its time limit, and every running phase when the
check gets SIGTERM or SIGINT, is stopped as a whole group (SIGTERM, then after a grace period SIGKILL to what is
left), so no child outlives the check; a stopped check still writes ``summary.md`` with what finished, what was
stopped and what never started, and exits 128 + the signal number.

``--tiny`` runs the same phases on the CPU at a budget of seconds (a plain-ViT bench with ``--quick``, the plan
scaled to a few steps and one seed by :func:`scale_plan`, no CUDA tests): the structure is tested in CI.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mdc_workbench.runs.gpu_estimate import (
    BENCH_RUNS,
    BENCH_STEPS,
    BENCHMARKS,
    BUDGET_S,
    GOAL_MIN,
    LOAN_S,
    MEMBER_EXTRA_S,
    RUN_EXTRA_S,
    STACK_BENCH,
    STACK_BENCH_MEMBERS,
    STACK_BENCH_ROWS,
    STACK_BENCH_STEPS,
    STACK_BENCH_TIMEOUT_S,
    STACK_BENCH_WARMUP,
    STACK_FILE,
    bench_limit,
    call_estimates,
    estimate,
    format_calls,
    format_estimate,
    measured_bench,
    plan_minutes,
    scale_plan,
    side_deadline,
    stack_step,
)

PLAN = Path("plans/gpu_check.yaml")
CUDA_TESTS = ["tests/core/test_cuda.py", "tests/core/test_step_parts.py", "tests/core/test_static_step.py",
              "tests/core/test_whole_step.py::test_the_whole_step_with_cuda_graphs_trains_like_the_eager_step"]


@dataclass
class Phase:
    """One child process of the check: its command, time limit, log file, and what happened."""

    name: str
    cmd: list[str]
    timeout_s: float
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    returncode: int | None = None
    seconds: float = 0.0
    timed_out: bool = False
    proc: Any = None
    start: float = 0.0
    stopped: str = ""  # why the check stopped this phase before it ended ("" when it ended or hit its limit)
    grace_s: float = 20.0  # after SIGTERM to the phase's process group, how long before SIGKILL

    def launch(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.start = time.monotonic()
        self.fh = open(self.log, "w")
        self.fh.write("$ " + " ".join(self.cmd) + "\n")
        self.fh.flush()
        self.proc = subprocess.Popen(self.cmd, stdout=self.fh, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})

    def wait(self) -> None:
        try:
            self.returncode = self.proc.wait(timeout=max(1.0, self.timeout_s - (time.monotonic() - self.start)))
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self.returncode = end_group(self.proc, self.grace_s)
        self._close()

    def stop(self, why: str) -> None:
        """End the phase's whole process group now (the check was stopped); nothing when it has ended."""
        if self.proc is None or self.returncode is not None:
            return
        self.stopped = why
        self.returncode = end_group(self.proc, self.grace_s)
        self._close()

    def _close(self) -> None:
        self.seconds = time.monotonic() - self.start
        note = " (time limit)" if self.timed_out else f" ({self.stopped})" if self.stopped else ""
        self.fh.write(f"\n[gpu_check] {self.name}: exit {self.returncode} after {self.seconds:.0f} s{note}\n")
        self.fh.close()

    def record(self) -> dict[str, Any]:
        return {"phase": self.name, "command": " ".join(self.cmd), "returncode": self.returncode,
                "seconds": round(self.seconds, 1), "timed_out": self.timed_out, "stopped": self.stopped,
                "log": self.log.name}


def end_group(proc: subprocess.Popen, grace_s: float) -> int:
    """SIGTERM the process group led by `proc` (a phase started in its own session), wait up to `grace_s` for the
    leader to exit and the group to empty, then SIGKILL whatever of the group is left; returns the exit code."""
    _signal_group(proc.pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and (proc.poll() is None or _group_alive(proc.pid)):
        time.sleep(0.1)
    _signal_group(proc.pid, signal.SIGKILL)
    return proc.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):  # the group has ended
        pass


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group is still running (zombies waiting for their reaper do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class CheckStopped(Exception):
    """SIGTERM or SIGINT reached the check: stop the running phases and write what finished."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "cpu_count": os.cpu_count(), "platform": platform.platform()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count, cuda=torch.version.cuda)
    return info


def bench_phases(out: Path, tiny: bool, python: str) -> list[Phase]:
    """The bench runs, one after another: the seed-stack bench (:func:`stack_phase`), then :data:`BENCH_RUNS` (each
    a fresh ``mdc bench``; each row its own process inside)."""
    mdc = [python, "-m", "mdc_workbench", "bench"]
    if tiny:
        return [stack_phase(out, tiny, python),
                Phase("bench_tiny", [*mdc, "--quick", "--device", "cpu", "--rows", "mdc,arc", "--sections", "none",
                                     "--count-ops", "--out", str(out / "bench_tiny.json")], 600,
                      out / "bench_tiny.log")]
    return [stack_phase(out, tiny, python)] + [
        Phase(b.name, [*mdc, "--preset", b.preset, "--device", "cuda", "--steps", str(BENCH_STEPS),
                       "--row-timeout", "120", *(["--set", f"train.batch_size={b.batch}"] if b.batch else []),
                       "--rows", ",".join(b.rows), "--sections", "none", *b.extra,
                       "--out", str(out / f"{b.name}.json")], b.timeout_s, out / f"{b.name}.log")
        for b in BENCH_RUNS]


def stack_phase(out: Path, tiny: bool, python: str) -> Phase:
    """The seed-stack bench (issue 63): seconds per member-step of K = 1, 4, 16 members (``vmap``, what a stack
    trains with on CUDA) against the solo step, into `out`/seed_stack.json, which the estimate reads once copied to
    ``benchmarks/`` (:data:`~mdc_workbench.runs.gpu_estimate.STACK_FILE`); `tiny`: K = 1, 2 at batch 8 on the CPU."""
    size = ["--members", "1", "2", "--steps", "1", "--warmup", "0", "--batch", "8", "--device", "cpu"] if tiny else [
        "--members", *map(str, STACK_BENCH_MEMBERS), "--steps", str(STACK_BENCH_STEPS), "--warmup",
        str(STACK_BENCH_WARMUP), "--device", "cuda"]
    return Phase(STACK_BENCH, [python, "-m", "mdc_workbench.seed_stack.bench", *size, "--rows",
                               ",".join(STACK_BENCH_ROWS), "--out", str(out / "seed_stack.json")],
                 600 if tiny else STACK_BENCH_TIMEOUT_S, out / f"{STACK_BENCH}.log")


def side_phases(out: Path, tiny: bool, python: str, plan: Path, deadline_s: float) -> list[Phase]:
    """The evidence plan, the CUDA tests and the precision curves, run side by side. The plan starts with
    ``--underpowered-ok``: it holds the seeds that fit, fewer than its declared claim needs, and its summary says
    so."""
    phases = [Phase("evidence_plan", [python, "-m", "mdc_workbench", "runs", "--quiet", "--underpowered-ok", str(plan),
                                      "--deadline", str(round(deadline_s))],
                    deadline_s + 40, out / "evidence_plan.log")]
    if not tiny:
        phases.append(Phase("cuda_tests", [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CUDA_TESTS],
                            deadline_s, out / "cuda_tests.log"))
        phases.append(Phase("precision_curves", [python, "-m", "mdc_workbench.bench.precision_curves", "--out",
                                                 str(out / "precision_curves.json")], deadline_s,
                            out / "precision_curves.log"))
    return phases


def _stack_rows(out: Path) -> list[str]:
    """The seed-stack bench's rows (seed_stack.json) as a table: seconds per member-step against the solo step."""
    path = out / "seed_stack.json"
    if not path.is_file():
        return []
    lines = ["\n### seed stack (seconds per member-step; copy seed_stack.json to benchmarks/"
             f"{STACK_FILE} for the estimate)\n", "| row | K | step ms | ms per member-step | vs solo | peak MiB |",
             "|---|---|---|---|---|---|"]
    for r in json.loads(path.read_text()).get("rows", []):
        lines.append(f"| {r['row']} | {r['members']} | {1e3 * r['step_s']:.2f} | {1e3 * r['member_step_s']:.2f} | "
                     f"{r.get('vs_solo', float('nan')):.2f}x | {r['peak_mib']:.0f} |")
    return lines


def _targets(out: Path) -> list[str]:
    lines = _stack_rows(out)
    for path in sorted(out.glob("bench_*.json")):
        report = json.loads(path.read_text())
        lines.append(f"\n### {path.stem}\n")
        lines.append("| row | samples/s | step ms | MFU | compile s | error |")
        lines.append("|---|---|---|---|---|---|")
        for name, row in report.get("train", {}).items():
            if "error" in row:
                lines.append(f"| {name} | | | | | {row['error'][:150]} |")
                continue
            compile_s = row.get("compile_s")
            lines.append(f"| {name} | {row['samples_per_s']:.1f} | {row['step_s'] * 1e3:.2f} | "
                         f"{row.get('mfu', float('nan')):.3f} | {'' if compile_s is None else f'{compile_s:.0f}'} | |")
        for target in report.get("targets", []):
            status = {True: "reached", False: "missed", None: "not measured"}[target["reached"]]
            value = "-" if target["value"] is None else f"{target['value']:.3g}"
            lines.append(f"- {target['target']}: {value} (goal {target['goal']}): {status}")
    return lines


def write_summary(out: Path, phases: list[Phase], info: dict[str, Any], plan_out: Path, *, stopped_by: str = "",
                  not_started: list[str] | None = None) -> Path:
    """``summary.md`` and ``summary.json`` of the check; the plan's summary files are copied beside them.
    `stopped_by` (a signal's name) and `not_started` (phase names) describe a check that was stopped early."""
    for name in ("summary.md", "summary.json", "summary.png", "budget_annealed.png"):
        if (plan_out / name).is_file():
            shutil.copy(plan_out / name, out / f"plan_{name}")
    records = [p.record() for p in phases]
    record: dict[str, Any] = {"machine": info, "phases": records}
    if stopped_by:
        record.update(stopped_by=stopped_by, not_started=list(not_started or []))
    (out / "summary.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = ["# gpu-check", "", f"machine: {json.dumps(info)}", ""]
    if stopped_by:
        finished = [r["phase"] for r in records if not r["stopped"]]
        lines += [f"**Stopped by {stopped_by}.** Finished: {', '.join(finished) or 'none'}; stopped: "
                  f"{', '.join(r['phase'] for r in records if r['stopped']) or 'none'}; not started: "
                  f"{', '.join(not_started or []) or 'none'}.", ""]
    lines += ["| phase | exit | seconds | time limit hit | stopped |", "|---|---|---|---|---|"]
    lines += [f"| {r['phase']} | {r['returncode']} | {r['seconds']} | {r['timed_out']} | {r['stopped']} |"
              for r in records]
    lines += ["", "## bench", *_targets(out)]
    if (out / "plan_summary.md").is_file():
        lines += ["", "## evidence plan", "", "See plan_summary.md (and plan_summary.png)."]
    path = out / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def run(out: Path, *, tiny: bool, budget_s: float, python: str = sys.executable, plan: Path = PLAN) -> Path:
    """All phases into `out`; returns the summary's path. `budget_s`: the whole check's wall-clock budget."""
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    info = machine()
    spec = yaml.safe_load(plan.read_text())
    plan_out = Path(spec.get("output_root", "papermill_runs")) / spec["name"]
    if tiny:
        plan = scale_plan(plan, out / "gpu_check_tiny.yaml", steps={8000: 4, 1600: 2, 400: 1}, device="cpu",
                          seeds=[0], n_train=64, n_eval=32, probe_limit=32, position_limit=8, jobs=2,
                          name="gpu_check_tiny", output_root=out / "plan_runs")
        plan_out = out / "plan_runs" / "gpu_check_tiny"
    bench = bench_phases(out, tiny, python)
    planned = [p.name for p in bench] + [p.name for p in side_phases(out, tiny, python, plan, deadline_s=60.0)]
    phases: list[Phase] = []  # in the order they were launched
    try:
        with _signals_raise():
            for phase in bench:
                left = budget_s - (time.monotonic() - start)
                phase.timeout_s = bench_limit(phase.timeout_s, left)  # keep time for the plan
                phases.append(phase)
                phase.launch()
                phase.wait()
                print(f"[gpu_check] {phase.name}: exit {phase.returncode} in {phase.seconds:.0f} s", flush=True)
            left = budget_s - (time.monotonic() - start)
            side = side_phases(out, tiny, python, plan, deadline_s=side_deadline(left))
            for phase in side:
                phases.append(phase)
                phase.launch()
            for phase in side:
                phase.wait()
                print(f"[gpu_check] {phase.name}: exit {phase.returncode} in {phase.seconds:.0f} s", flush=True)
    except CheckStopped as stop:
        with _signals_ignored():  # a second signal must not cut the clean-up short
            phases = [p for p in phases if p.proc is not None]  # one the signal came before is not started
            for phase in phases:
                phase.stop(f"stopped by {stop}")
            launched = {p.name for p in phases}
            summary = write_summary(out, phases, info, plan_out, stopped_by=str(stop),
                                    not_started=[name for name in planned if name not in launched])
        print(f"[gpu_check] stopped by {stop} after {time.monotonic() - start:.0f} s; what finished: {summary}",
              file=sys.stderr, flush=True)
        raise SystemExit(128 + stop.signum) from None
    summary = write_summary(out, phases, info, plan_out)
    print(f"[gpu_check] done in {time.monotonic() - start:.0f} s: {summary}", flush=True)
    return summary


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGINT raise :class:`CheckStopped` inside the block (the phases run in their own sessions, so
    a Ctrl-C in the terminal reaches only the check, which stops them)."""
    def stop(signum: int, _frame: Any) -> None:
        raise CheckStopped(signum)

    before = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _signals_ignored() -> Iterator[None]:
    before = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="the GPU check: bench, evidence plan, CUDA tests (module docstring)")
    ap.add_argument("--out", default="gpu_check_out", help="folder for every result (default gpu_check_out)")
    ap.add_argument("--tiny", action="store_true", help="the same structure on the CPU at a budget of seconds")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S,
                    help=f"wall-clock budget of the whole check, s (default {BUDGET_S:g}: with the machine's start, "
                         f"{LOAN_S / 60:g} minutes)")
    ap.add_argument("--estimate", action="store_true",
                    help="print the minutes each part will take under the budget (benchmarks/*.json) and exit")
    args = ap.parse_args(argv)
    if args.estimate:
        from mdc_workbench.runs.plans import load_plan

        step_s = json.loads((BENCHMARKS / "tiny_fast_h200.json").read_text())["train"]["mdc"]["step_s"]
        stack = stack_step()
        total, schedule = plan_minutes(load_plan(PLAN), step_s=step_s, stack=stack)
        print(format_estimate(estimate(args.budget_s, measured_bench(), schedule)))
        print(f"{PLAN}: {total:.1f} minutes for all {len(schedule)} runs (goal {GOAL_MIN:g}; the tiny_fast step "
              f"{step_s * 1000:.1f} ms of benchmarks/tiny_fast_h200.json, {RUN_EXTRA_S:.0f} s per run besides "
              f"training and {MEMBER_EXTRA_S:.0f} s per member of a seed stack (allowances), solo runs sharing the GPU "
              "assumed not to slow each other, seed stacks' GPU shares adding up)\n")
        print(format_calls(call_estimates(step_s=step_s, stack=stack), stack))
        return
    run(Path(args.out), tiny=args.tiny, budget_s=args.budget_s)


if __name__ == "__main__":
    main()
