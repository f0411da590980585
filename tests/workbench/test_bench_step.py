"""``mdc bench step``: the step's phases add up to the step, and the host never waits between logging steps.

The checks are of what the figures mean, never of how fast anything is (the machine is shared)."""

import json
import time

import pytest
import torch

from mdc_core import train as trainer
from mdc_workbench.bench.step_phases import OpsClock, PhaseClock, format_phases, measure_step_phases, summarize
from mdc_workbench.cli import main
from tests.conftest import MICRO
from tests.train_helpers import one_thread, write_micro_data  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("one_thread")

OVERRIDES = [f"model.{k}={json.dumps(v)}" for k, v in MICRO.items()] + [
    'model.output_vocab="corpus"', "train.batch_size=4", "train.log_every=3", "train.ema_decay=0.9",
    "train.warmup_steps=2"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_micro_data(tmp_path_factory.mktemp("bench_step_data"), 32)


def test_the_phases_add_up_to_the_step_and_the_host_never_waits_between_logging_steps(data):
    report = measure_step_phases("tiny", OVERRIDES, steps=8, warmup=1, data=data, sync_steps=4)
    assert set(report["phases_ms"]) == {"read", "prepare", "forward_backward", "clip_optimizer", "ema",
                                        "metrics_logging"}
    # the phases are the step, within 10%: in the training thread's CPU time, which other processes on a shared
    # machine cannot stretch (a wall-clock wait can land between two phases); the wall clock roughly agrees
    assert abs(report["cpu_coverage"] - 1.0) <= 0.1, report
    assert 0.3 < report["coverage"] <= 1.0 + 1e-9, report
    assert report["fixed_ms"] == pytest.approx(report["step_ms"] - report["model_ms"], rel=0.5, abs=5.0)
    assert report["syncs_per_step"]["between_log_steps"] == 0, report["sync_calls"]
    assert report["syncs_per_step"]["log_steps"] > 0  # a logging step reads the loss: the counter sees reads
    assert "sum of phases" in format_phases(report)


def test_a_read_of_the_loss_every_step_is_counted(data, monkeypatch):
    real = trainer.NonFiniteWatch.note

    def note(self, step, loss, grad_norm):  # what a careless trainer does: look at the loss every step
        if float(loss) > 1e9:
            pass
        return real(self, step, loss, grad_norm)

    monkeypatch.setattr(trainer.NonFiniteWatch, "note", note)
    report = measure_step_phases("tiny", OVERRIDES, steps=3, warmup=0, data=data, sync_steps=4)
    assert report["syncs_per_step"]["between_log_steps"] == 1
    assert any(c.startswith("float(tensor)") for c in report["sync_calls"]["between_log_steps"])


def test_the_counting_run_is_uncompiled_whatever_the_timed_run_does(data, monkeypatch):
    """The sync counter is a TorchFunctionMode: under it a compiled step recompiles and breaks up (an H200 showed
    the recompile limit and thousands of warnings per step), so the count must come from the eager step."""
    import dataclasses

    import mdc_core.train

    real, seen = mdc_core.train.train, []

    def recording(cfg, out, **kw):
        seen.append((cfg.train.compile, cfg.train.compile_step))
        eager = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, compile=False, compile_step=False))
        return real(eager, out, **kw)  # fast on the CPU

    monkeypatch.setattr(mdc_core.train, "train", recording)
    measure_step_phases("tiny", [*OVERRIDES, "train.compile=true", "train.compile_step=true"], steps=4, warmup=0,
                        data=data, sync_steps=3)
    assert seen == [(True, True), (False, False)]  # the whole step compiles too: off for the count


def test_work_outside_the_phases_shows_as_missing_coverage():
    clock = PhaseClock(torch.device("cpu"))
    for _ in range(3):
        with clock.phase("read"):
            time.sleep(0.01)
        with clock.phase("forward_backward"):
            time.sleep(0.01)
        time.sleep(0.2)  # unmarked work: part of the step, in no phase
    summary = summarize(clock, [0, 1])
    assert summary["coverage"] < 0.5 and summary["fixed_ms"] > summary["phases_ms"]["read"]
    clock = PhaseClock(torch.device("cpu"))
    for _ in range(3):
        with clock.phase("read"):
            sum(range(20_000))
        with clock.phase("prepare"):
            sum(range(20_000))
        sum(range(400_000))  # unmarked host work: CPU time in no phase
    assert summarize(clock, [0, 1])["cpu_coverage"] < 0.5
    with pytest.raises(ValueError, match="no step to summarise"):
        summarize(clock, [])


def test_the_trainer_marks_every_phase_with_a_clock_that_does_nothing():
    clock = trainer.StepClock()
    with clock.phase("read"):
        pass
    clock.watch([])
    assert clock.phase("prepare") is clock.phase("ema")  # one shared no-op: nothing is timed or counted


def test_the_command_line_runs_and_checks_its_flags(data, capsys):
    main(["bench", "step", "--preset", "tiny", "--steps", "2", "--warmup", "1", "--images", "32",
          *[x for o in OVERRIDES for x in ("--set", o)], "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["preset"] == "tiny" and report["steps"] >= 1
    assert main(["bench", "step", "--steps", "0"]) == 2
    assert "--steps must be >= 1, got 0" in capsys.readouterr().err


def test_the_ops_clock_counts_each_steps_operators_after_its_warm_up():
    clock, x = OpsClock(skip=1), torch.ones(3)
    for n in (5, 2, 3, 4):  # the first step (warm-up) is not counted, the last (it checkpoints) is dropped at close
        with clock.phase("read"):
            pass
        with clock.phase("forward_backward"):
            for _ in range(n):
                x = torch.add(x, 1)
    clock.close()
    a, b = (c["aten_ops"] for c in clock.counts)  # 2 and 3 adds, each the same few aten ops (the scalar's too)
    assert a > 0 and 3 * a == 2 * b
    assert all(c["events"] >= c["aten_ops"] for c in clock.counts)


def test_count_ops_adds_the_host_operations_per_step(data):
    report = measure_step_phases("tiny", OVERRIDES, steps=2, warmup=1, data=data, sync_steps=3, count_ops=True,
                                 ops_steps=2)
    ops = report["host_ops"]
    assert ops["steps"] == 2 and ops["aten_ops_per_step"] > 50 and ops["events_per_step"] >= ops["aten_ops_per_step"]
    assert ops["compile_step"] is False
    assert f"{ops['aten_ops_per_step']:g} aten ops" in format_phases(report)
