"""A full disk while TensorBoard writes its events: the one-line error, and no traceback of tensorboard's writer
thread after it (run in a child process: pytest replaces the hook that prints a thread's traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mdc_workbench.cli import main
from tests.workbench.test_cli import MICRO_SETS

ROOT = Path(__file__).resolve().parents[2]

# the events file's writer thread meets a full disk after a few records
CHILD = """
import errno, sys
from tensorboard.summary.writer import record_writer
from mdc_workbench.cli import main
real, calls = record_writer.RecordWriter.write, {"n": 0}

def fills_up(self, data):
    calls["n"] += 1
    if calls["n"] > 3:
        raise OSError(errno.ENOSPC, "No space left on device")
    return real(self, data)

record_writer.RecordWriter.write = fills_up
code = main(sys.argv[1:])
print("writes", calls["n"])
sys.exit(code)
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tbfull") / "data"
    assert main(["data", "synth", "--out", str(out), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    return out


def test_a_full_disk_under_tensorboard_is_one_line_without_the_writer_threads_traceback(data: Path,
                                                                                        tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    argv = ["train", "--preset", "tiny", "--data", str(data), "--out", str(tmp_path / "run"), "--quiet",
            *MICRO_SETS, "--steps", "4", "--tensorboard"]
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    assert int(done.stdout.split("writes")[-1]) > 3
    err = done.stderr.strip()
    assert err.startswith("mdc: error: no space left on the device"), err
    assert "\n" not in err and "Traceback" not in err and "Exception in thread" not in err, err
