"""Issue 62: a plan's runs and a multi-node training job through submitit, tested for real with submitit's local
executor (the same job objects as on SLURM, as subprocesses): the same results as the local runner and as a
2-process gloo run, cancelling leaves nothing running, pre-emption checkpoints and requeues exactly, and the sbatch
file submitit would write carries the plan's resources. No test needs a cluster or ``sbatch``."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import nbformat
import psutil
import pytest
from safetensors.torch import load_file

submitit = pytest.importorskip("submitit", reason="the [cluster] extra (make setup installs it)")

from mdc_core import checkpoint as ck  # noqa: E402
from mdc_core.train import train  # noqa: E402
from mdc_workbench.cli import main  # noqa: E402
from mdc_workbench.runs.executor import (  # noqa: E402
    DEADLINE_STOP,
    JOB_RECORDS,
    JOBS_DIR,
    NOT_STARTED,
    Resources,
    TrainJob,
    make_executor,
    plan_resources,
    plan_status,
    submit_plan,
)
from mdc_workbench.runs.plans import load_plan  # noqa: E402
from mdc_workbench.runs.runner import DONE, FAILED, INTERRUPTED, run_plan  # noqa: E402
from tests.train_helpers import (  # noqa: E402
    assert_same_metrics,
    free_port,
    join_all,
    micro_run,
    read_metrics,
    start_training,
    write_micro_data,
)

ROOT = Path(__file__).resolve().parents[2]
TAG = "MDC_CLUSTER_TEST_TAG"  # inherited by every process a test starts (controllers, tasks, kernels)

PARAMS = ('output_dir: str = "."  # run folder\nvalue: int = 1  # toy\ntrain_seed: int = 0  # seed\n'
          'sleep_s: float = 0.0  # hold the kernel\ndie: bool = False  # kill the job process')
BODY = """\
import json, os, pathlib, random, signal, time
out = pathlib.Path(output_dir)
rng = random.Random(1000 * train_seed + value)
(out / "metrics.json").write_text(json.dumps({"metrics": {"score": rng.random(), "value": value}}))
if sleep_s:
    (out / "sleeping").write_text(str(os.getpid()))
    time.sleep(sleep_s)
if die:  # the kernel's parent is the job's task process: a job that dies before any marker is written
    os.kill(os.getppid(), signal.SIGKILL)
"""


def _notebook(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(PARAMS)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_code_cell("import json"), cell, nbformat.v4.new_code_cell(BODY)]
    nb.metadata["kernelspec"] = {"name": "mdc", "display_name": "MDC workbench", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def _plan(root: Path, name: str, extra: str = "", entries: str | None = None) -> Path:
    _notebook(root / "toy_a.ipynb")
    _notebook(root / "toy_b.ipynb")
    entries = entries or "  - toy_a.ipynb\n  - path: toy_b.ipynb\n    parameters: {value: 3}\n"
    path = root / f"{name}.yaml"
    path.write_text(f"name: {name}\noutput_root: {root / 'out'}\nseeds: [0, 1]\n{extra}notebooks:\n{entries}")
    return path


@pytest.fixture
def tagged(monkeypatch) -> str:
    """A tag in the environment of every process the test starts, so that none can hide from the final check."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG, tag)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tag


def _tagged_processes(tag: str) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == os.getpid():
            continue
        try:
            if proc.environ().get(TAG) == tag:
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _none_left(tag: str, timeout_s: float = 60.0) -> list[int]:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        left = _tagged_processes(tag)
        if not left:
            return []
        time.sleep(0.5)
    return _tagged_processes(tag)


def _local(folder: Path, **resources) -> object:
    return make_executor("local", folder, Resources(timeout_min=20, **resources), name="mdc-test")


def test_a_plan_through_the_local_executor_gives_the_local_runners_results(tmp_path, tagged):
    """2 notebooks x 2 seeds: the same metrics, the same DONE markers (notebook hash) and statuses as `mdc runs`;
    job logs land in the run folders; a second submission skips every finished run and submits nothing."""
    plan = load_plan(_plan(tmp_path, "grid"), root=tmp_path)
    assert [r.run_id for r in plan.runs] == ["toy_a__seed=0", "toy_a__seed=1", "toy_b__seed=0", "toy_b__seed=1"]
    local = run_plan(replace(plan, output_root=tmp_path / "local"), progress=False, cwd=tmp_path)
    cluster = submit_plan(plan, _local(plan.out_dir / JOBS_DIR), cwd=tmp_path, progress=False, poll_s=0.5)
    assert [r.status for r in local] == [r.status for r in cluster] == ["done"] * 4
    for a, b in zip(local, cluster, strict=True):
        metrics_a, metrics_b = (json.loads((r.run_dir / "metrics.json").read_text()) for r in (a, b))
        assert metrics_a == metrics_b
        marker_a, marker_b = (json.loads((r.run_dir / DONE).read_text()) for r in (a, b))
        assert marker_a.keys() == marker_b.keys() and marker_a["notebook_sha256"] == marker_b["notebook_sha256"]
        assert (b.run_dir / "job.out").is_file() and (b.run_dir / "job.err").is_file()
    scores = {r.run_id: json.loads((r.run_dir / "metrics.json").read_text())["metrics"]["score"] for r in cluster}
    assert len(set(scores.values())) == 4  # the seeds and values reached the notebooks
    gathered = [json.loads((tmp_path / root / "grid" / "summary.json").read_text()) for root in ("local", "out")]
    rows = [[{k: v for k, v in row.items() if k != "duration_s"} for row in s["runs"]] for s in gathered]
    assert rows[0] == rows[1] and [s["tables"] for s in gathered] == [gathered[0]["tables"]] * 2
    records = json.loads((plan.out_dir / JOBS_DIR / JOB_RECORDS).read_text())
    assert set(records) == {r.run_id for r in plan.runs}
    assert [state for _, state, _ in plan_status(plan)] == ["done"] * 4

    class NoSubmission:
        def batch(self):
            raise AssertionError("a finished plan submitted jobs")

    again = submit_plan(load_plan(tmp_path / "grid.yaml", root=tmp_path), NoSubmission(), progress=False)
    assert [r.status for r in again] == ["skipped"] * 4


def test_a_job_that_dies_is_failed_with_its_log_and_the_others_finish(tmp_path, tagged, capsys):
    entries = "  - toy_a.ipynb\n  - path: toy_b.ipynb\n    parameters: {die: true}\n    seeds: [0]\n"
    plan = load_plan(_plan(tmp_path, "dies", entries=entries), root=tmp_path)
    results = submit_plan(plan, _local(plan.out_dir / JOBS_DIR), cwd=tmp_path, progress=False, poll_s=0.5)
    assert [r.status for r in results] == ["done", "done", "failed"]
    error = results[2].error
    assert error.startswith("the job ") and "before the notebook finished or failed" in error
    assert (results[2].run_dir / FAILED).is_file() and (results[2].run_dir / "job.err").is_file()
    assert [s for _, s, _ in plan_status(plan)] == ["done", "done", "failed"]
    capsys.readouterr()  # the plan's own report of the failure
    main(["runs", str(tmp_path / "dies.yaml"), "--status"])
    out = capsys.readouterr().out
    assert out.startswith(f"plan dies -> {plan.out_dir}/: 2 done, 1 failed")
    assert "[failed ] toy_b__seed=0  the job" in out
    assert _none_left(tagged) == []


def test_ctrl_c_cancels_a_running_plan_and_leaves_nothing_running(tmp_path, tagged):
    """Both runs' kernels are sleeping when Ctrl-C reaches `submit_plan`: every job is cancelled, each run is
    marked interrupted, and no controller, task or kernel process of the test is left."""
    entries = "  - path: toy_a.ipynb\n    parameters: {sleep_s: 600.0}\n"
    plan = load_plan(_plan(tmp_path, "cancel", entries=entries), root=tmp_path)
    sleeping = [plan.out_dir / r.run_id / "sleeping" for r in plan.runs]

    def interrupt_when_asleep() -> None:
        end = time.monotonic() + 240
        while time.monotonic() < end and not all(p.is_file() for p in sleeping):
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_when_asleep, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        submit_plan(plan, _local(plan.out_dir / JOBS_DIR), cwd=tmp_path, progress=False, poll_s=0.5)
    assert all(p.is_file() for p in sleeping), "the kernels never got to sleep"
    for run in plan.runs:
        assert (plan.out_dir / run.run_id / FAILED).read_text().splitlines()[0] == INTERRUPTED
    assert _none_left(tagged) == []
    assert [s for _, s, _ in plan_status(plan)] == ["failed", "failed"]


def test_a_deadline_cancels_what_is_queued_or_running(tmp_path, tagged):
    entries = "  - path: toy_a.ipynb\n    parameters: {sleep_s: 600.0}\n    seeds: [0]\n"
    plan = load_plan(_plan(tmp_path, "deadline", entries=entries), root=tmp_path)
    results = submit_plan(plan, _local(plan.out_dir / JOBS_DIR), cwd=tmp_path, progress=False, poll_s=0.5,
                          deadline_s=3)
    assert [r.status for r in results] == ["failed"]
    assert results[0].error.splitlines()[0] in (DEADLINE_STOP, NOT_STARTED)
    assert _none_left(tagged) == []


def test_the_sbatch_file_carries_the_plans_resources(tmp_path, monkeypatch):
    """The SLURM submission file submitit writes for the plan's jobs (no sbatch: the text is built, not sent)."""
    from submitit.slurm.slurm import SlurmExecutor

    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # no srun on this machine
    extra = ("cluster: {gpus: 2, cpus: 6, mem_gb: 48, timeout_min: 90, partition: learnlab, account: vision, "
             "array_parallelism: 8}\n")
    plan = load_plan(_plan(tmp_path, "sized", extra=extra), root=tmp_path)
    resources = plan_resources(plan, partition="devlab")  # a flag overrides the plan
    executor = make_executor("slurm", tmp_path / JOBS_DIR, resources, name="mdc-sized")
    text = executor._executor._make_submission_file_text("python -m submitit.core._submit X", "uid")
    for line in ("#SBATCH --gpus-per-node=2", "#SBATCH --cpus-per-task=6", "#SBATCH --mem=48GB", "#SBATCH --time=90",
                 "#SBATCH --partition=devlab", "#SBATCH --account=vision", "#SBATCH --job-name=mdc-sized",
                 "#SBATCH --signal=USR2@"):
        assert line in text, line
    executor._executor.parameters["map_count"] = 30  # what submitit's batch() sets for an array of 30 runs
    assert "#SBATCH --array=0-29%8" in executor._executor._make_submission_file_text("cmd", "uid")


@pytest.mark.parametrize("cluster, message", [
    ("{gpus: -1}", "gpus must be an integer >= 0"),
    ("{cpus: 0}", "cpus must be an integer >= 1"),
    ("{mem_gb: 0}", "mem_gb must be a positive number"),
    ("{partition: ''}", "partition must be a non-empty string"),
    ("{timeout_min: 1.5}", "timeout_min must be an integer"),
    ("{nodes: 2}", "unknown key(s) ['nodes']"),
    ("[1, 2]", "must be a mapping of resources"),
])
def test_bad_cluster_sections_are_refused_when_the_plan_loads(tmp_path, cluster, message):
    with pytest.raises(ValueError, match=r"cluster.*" + __import__("re").escape(message)):
        load_plan(_plan(tmp_path, "bad", extra=f"cluster: {cluster}\n"), root=tmp_path)


def test_cli_dry_run_lists_the_jobs_with_their_resources_and_status_reads_the_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    main(["runs", "plans/cpu_demo.yaml", "--executor", "slurm", "--dry-run", "--gpus", "1", "--cpus", "4",
          "--mem-gb", "16", "--timeout-min", "120", "--partition", "gpu", "--array-parallelism", "3"])
    out = capsys.readouterr().out
    assert "5 of 5 run(s) to submit as one SLURM array, at most 3 at once" in out
    assert "each job: gpus=1 cpus=4 mem=16GB time=120min partition=gpu (OMP_NUM_THREADS=4)" in out
    assert out.count("  job ") == 5 and "job 05_captioning  <- 05_captioning.ipynb" in out
    with pytest.raises(SystemExit, match="--gpus, --partition need --executor slurm"):
        main(["runs", "plans/cpu_demo.yaml", "--dry-run", "--gpus", "1", "--partition", "gpu"])
    with pytest.raises(SystemExit, match="--nodes needs --executor slurm"):
        main(["train", "--out", str(tmp_path / "run"), "--nodes", "2"])


def test_without_the_extra_slurm_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    plan = _plan(tmp_path, "extra")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "submitit", None)  # as if the [cluster] extra were not installed
    assert main(["runs", str(plan), "--executor", "slurm", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error: mdc runs needs submitit, which the [cluster] extra installs") and "\n" not in err
    assert not (tmp_path / "out").exists()  # nothing submitted, nothing written


# ----------------------------------------------------------------------------------------------------------
# training


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_micro_data(tmp_path_factory.mktemp("cluster_data"), 64)


def test_a_two_task_gloo_job_equals_a_two_process_run(data, tmp_path, tagged):
    """TrainJob through the local executor (2 tasks: ranks from submitit's environment) == the 2-process run
    torchrun would start: the same metrics at every step and the same weights."""
    cfg = micro_run(data, steps=5, batch_size=4, grad_accum=1, ckpt_every=5, seed=3)
    executor = make_executor("local", tmp_path / "jobs", Resources(timeout_min=20), name="t", tasks_per_node=2)
    job = executor.submit(TrainJob(cfg.to_dict(), str(tmp_path / "job")))
    results = job.results()
    assert results[0]["steps"] == 5 and results[1]["steps"] == 5

    port = free_port()
    procs = [start_training(cfg, tmp_path / "ddp", rank=r, world=2, port=port) for r in (0, 1)]
    assert join_all([p for p, _ in procs]) == [0, 0], [e.read_text() for _, e in procs if e.exists()]
    assert_same_metrics(read_metrics(tmp_path / "job"), read_metrics(tmp_path / "ddp"), rel=1e-6)
    a, b = (load_file(str(ck.latest_checkpoint(tmp_path / run) / "model.safetensors")) for run in ("job", "ddp"))
    assert all(bool((a[k] == b[k]).all()) for k in a)
    assert ck.load_train_state(ck.latest_checkpoint(tmp_path / "job"))["world"] == 2
    assert _none_left(tagged) == []


class SlowTrainJob(TrainJob):
    """A TrainJob whose steps are slowed (results unchanged), so that the test can pre-empt it mid-run."""

    def __call__(self):
        from mdc_core import loss_step
        real = loss_step.Objective.forward

        def slow(self, *args, **kwargs):
            time.sleep(0.1)
            return real(self, *args, **kwargs)

        loss_step.Objective.forward = slow
        return super().__call__()


def test_preemption_checkpoints_requeues_and_resumes_exactly(data, tmp_path, tagged):
    """submitit's pre-emption signal (USR2) reaches both ranks mid-run: the trainer finishes the step, writes a
    checkpoint, submitit requeues the job (TrainJob.checkpoint: resume=True), and the finished run equals an
    uninterrupted one (1 process with the same global batch), step for step."""
    steps = 24
    cfg = micro_run(data, steps=steps, batch_size=4, grad_accum=1, ckpt_every=1000, seed=5)
    executor = make_executor("local", tmp_path / "jobs", Resources(timeout_min=20), name="t", tasks_per_node=2)
    job = executor.submit(SlowTrainJob(cfg.to_dict(), str(tmp_path / "job")))
    end = time.monotonic() + 240
    while len(read_metrics(tmp_path / "job")) < 3 and time.monotonic() < end:
        time.sleep(0.1)
    tasks = psutil.Process(job._process.pid).children()
    assert len(tasks) == 2 and len(read_metrics(tmp_path / "job")) < steps
    for task in tasks:
        task.send_signal(signal.SIGUSR2)
    results = job.results()
    assert results[0]["steps"] == steps
    kept = [int(p.name.split("_")[1]) for p in ck.checkpoint_folders(tmp_path / "job")]
    assert len(kept) == 2 and kept[0] < steps == kept[1]  # the stop's own checkpoint (ckpt_every 1000), the last
    log = "".join(p.read_text() for p in (tmp_path / "jobs").glob("*_0_log.err"))
    assert "mdc: got SIGTERM; finishing this step" in log and "this job is preempted" in log  # relayed, requeued

    ref_cfg = micro_run(data, "data.num_workers=2", steps=steps, batch_size=4, grad_accum=2, ckpt_every=1000, seed=5)
    train(ref_cfg, tmp_path / "ref", progress=False)
    assert_same_metrics(read_metrics(tmp_path / "job"), read_metrics(tmp_path / "ref"), rel=1e-4)
    assert _none_left(tagged) == []


def test_mdc_train_executor_slurm_submits_one_job_of_nodes_x_ranks(data, tmp_path, tagged, monkeypatch, capsys):
    """The command line: the flags become the job's shape and resources (SLURM swapped for the local executor),
    and the submitted job trains the run the flags describe."""
    from mdc_workbench.runs import executor as executor_module

    asked = {}
    real = executor_module.make_executor

    def local_instead(kind, folder, resources, **shape):
        asked.update(kind=kind, resources=resources, **shape)
        return real("local", folder, resources, **{**shape, "nodes": 1})  # one machine here

    monkeypatch.setattr(executor_module, "make_executor", local_instead)
    cfg = micro_run(data, steps=2, batch_size=4, ckpt_every=2)
    sets = [arg for key in ("model", "data", "train") for k, v in cfg.to_dict()[key].items()
            for arg in ("--set", f"{key}.{k}={json.dumps(v)}")]
    out = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--out", str(out), "--quiet", *sets, "--executor", "slurm",
                 "--nodes", "3", "--tasks-per-node", "1", "--cpus-per-task", "2", "--timeout-min", "30",
                 "--partition", "p1"]) == 0
    assert asked["kind"] == "slurm" and asked["nodes"] == 3 and asked["tasks_per_node"] == 1
    assert (asked["resources"].cpus, asked["resources"].timeout_min, asked["resources"].partition) == (2, 30, "p1")
    assert capsys.readouterr().out.startswith("submitted job ")
    end = time.monotonic() + 240
    while ck.latest_checkpoint(out) is None and time.monotonic() < end:
        time.sleep(0.5)
    assert len(read_metrics(out)) == 2 and ck.load_train_state(ck.latest_checkpoint(out))["world"] == 1
    assert _none_left(tagged) == []
    with pytest.raises(SystemExit, match="--tasks-per-node must be positive and equal --gpus-per-node"):
        main(["train", "--out", str(tmp_path / "x"), "--executor", "slurm", "--gpus-per-node", "8",
              "--tasks-per-node", "4"])
