"""Ctrl-C and SIGTERM at every moment of ``mdc train``, synchronised with the child (tests/signal_child.py holds it
at the moment and says so), so that neither a loaded machine nor an inherited ignored SIGINT (a background job of a
non-interactive shell, or pytest run in the background) changes the outcome."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from mdc_workbench.cli import main
from tests.workbench.test_cli import MICRO_SETS

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
CHILD = str(ROOT / "tests" / "signal_child.py")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("signals") / "data"
    assert main(["data", "synth", "--out", str(folder), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    return folder


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a non-interactive shell gives a background job


def start(moment: str, data: Path, run: Path, steps: int, ignored: bool = False,
          extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """`mdc train` held at `moment`; returns once it printed PAUSED (it is there now)."""
    cmd = [sys.executable, CHILD, moment, "train", "--preset", "tiny", "--data", str(data), "--steps", str(steps),
           "--out", str(run), "--quiet", *MICRO_SETS, *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_ignore_sigint if ignored else None)
    line = proc.stdout.readline()
    if line.strip() != "PAUSED":
        proc.kill()
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"the child did not reach {moment}: {line!r} {err[-2000:]}")
    return proc


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_cli_imports_is_one_line(data, tmp_path, sig):
    """SIGINT in the first ~0.2 s of `python -m mdc_workbench` (or `mdc`) used to print a KeyboardInterrupt
    traceback."""
    proc = start("import-cli", data, tmp_path / "run", 4)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    name = "" if sig == signal.SIGINT else " by SIGTERM"
    assert proc.returncode == 128 + sig and err.strip().splitlines() == [f"mdc: interrupted{name}"], err[-3000:]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("ignored", [False, True], ids=["sigint-default", "sigint-ignored"])
def test_a_signal_while_torch_loads_is_one_line_and_writes_nothing(data, tmp_path, sig, ignored):
    run = tmp_path / "run"
    proc = start("import-torch", data, run, 4, ignored)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    name = "" if sig == signal.SIGINT else " by SIGTERM"
    assert proc.returncode == 128 + sig and err.strip().splitlines() == [f"mdc: interrupted{name}"], err[-3000:]
    assert not run.exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("ignored", [False, True], ids=["sigint-default", "sigint-ignored"])
def test_a_signal_between_the_lock_and_the_loop_leaves_no_run_folder(data, tmp_path, sig, ignored, capsys):
    """SIGTERM there used to kill the process silently, leaving .mdc.lock and data_fingerprint.json (then --resume
    said "holds no run"); SIGINT inherited as ignored used to be lost, and the run trained to its end."""
    run = tmp_path / "run"
    proc = start("after-prepare", data, run, 40, ignored)
    assert sorted(p.name for p in run.iterdir()) == [".mdc.lock", "data_fingerprint.json"]
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    name = "" if sig == signal.SIGINT else " by SIGTERM"
    assert proc.returncode == 128 + sig and err.strip().splitlines() == [f"mdc: interrupted{name}"], err[-3000:]
    assert not run.exists()


@pytest.mark.parametrize("ignored", [False, True], ids=["sigint-default", "sigint-ignored"])
def test_ctrl_c_during_the_final_checkpoint_exits_130_with_the_checkpoint(data, tmp_path, ignored):
    """It used to say "got SIGINT; ... writing a checkpoint" and exit 0."""
    run = tmp_path / "run"
    proc = start("final-checkpoint", data, run, 2, ignored)
    proc.send_signal(signal.SIGINT)
    seen = ""
    while "got SIGINT" not in seen and proc.poll() is None:  # the handler's message: the signal has been taken
        seen += proc.stderr.readline()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    out, err = proc.communicate(timeout=120)
    err = seen + err
    assert "got SIGINT; finishing this step and writing a checkpoint" in err, err[-3000:]
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("mdc: interrupted by SIGINT at step 2; checkpoint "), err
    assert (run / "checkpoints" / "step_00000002" / "meta.json").is_file() and not (run / ".mdc.lock").exists()
