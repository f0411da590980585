"""Stopping `make gpu-check` (SIGTERM, or Ctrl-C) ends every phase's process group, children included, and writes a
summary of what finished, what was stopped and what never started. Fake phases stand in for the GPU's."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# a phase that ignores SIGTERM and starts a child (which inherits that), then records both PIDs and waits
STUCK = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open(sys.argv[1] + ".tmp", "w").write(f"{os.getpid()} {child.pid}")
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
time.sleep(600)
"""

DRIVER = """
import sys
from pathlib import Path
from mdc_workbench.runs import gpu_check as gc
out, stuck = Path(sys.argv[1]), sys.argv[2]
gc.machine = lambda: {"gpu": "none (test)"}

def bench(out, tiny, python):
    stuck_phase = gc.Phase("stuck", [python, "-c", stuck, str(out / "pids")], 600, out / "stuck.log", grace_s=2)
    return [gc.Phase("quick", [python, "-c", "print('ok')"], 60, out / "quick.log"), stuck_phase]

gc.bench_phases = bench
gc.side_phases = lambda out, tiny, python, plan, deadline_s: [gc.Phase("side", [python, "-c", "1"], 60,
                                                                       out / "side.log")]
gc.main(["--out", str(out), "--tiny", "--budget-s", "900"])
"""


def gone(pid: int) -> bool:
    """The process has ended (a zombie waiting for a reaper that is not this test counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_the_gpu_check_ends_its_phases_groups_and_writes_what_finished(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "gc"
    check = subprocess.Popen([sys.executable, "-c", DRIVER, str(out), STUCK], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    pids_file = out / "pids"
    try:
        for _ in range(1200):  # until the stuck phase and its child run (no timing is asserted)
            if pids_file.is_file() or check.poll() is not None:
                break
            time.sleep(0.1)
        assert pids_file.is_file(), check.communicate()
        leader, child = map(int, pids_file.read_text().split())
        check.send_signal(sig)
        stdout, stderr = check.communicate(timeout=300)
    finally:
        if check.poll() is None:
            check.kill()
    assert check.returncode == 128 + sig, stderr
    for _ in range(100):
        if gone(leader) and gone(child):
            break
        time.sleep(0.1)
    assert gone(leader) and gone(child)  # no orphan left running under PID 1
    name = signal.Signals(sig).name
    assert stderr.strip().splitlines()[-1].startswith(f"[gpu_check] stopped by {name}")
    record = json.loads((out / "summary.json").read_text())
    assert record["stopped_by"] == name and record["not_started"] == ["side"]
    phases = {p["phase"]: p for p in record["phases"]}
    assert phases["quick"]["returncode"] == 0 and phases["quick"]["stopped"] == ""
    assert phases["stuck"]["stopped"] == f"stopped by {name}" and phases["stuck"]["returncode"] == -signal.SIGKILL
    summary = (out / "summary.md").read_text()
    assert f"**Stopped by {name}.** Finished: quick; stopped: stuck; not started: side." in summary
    assert f"(stopped by {name})" in (out / "stuck.log").read_text()
