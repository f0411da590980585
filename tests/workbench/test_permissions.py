"""Paths a non-root user may not read or write: one line naming the path, exit 2, never a traceback. A user
``mdc-nonroot`` is made with ``useradd`` (skipped where the tests do not run as root or cannot make one); the
commands run as that user (a forked child that drops to it), on a copy of a run that root owns."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from mdc_workbench.cli import main
from tests.conftest import MICRO_SETS

USER = "mdc-nonroot"


@pytest.fixture(scope="module")
def user() -> str:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root with useradd to act as another user")
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", USER], capture_output=True)
        if subprocess.run(["id", USER], capture_output=True).returncode != 0:
            pytest.skip(f"cannot make the user {USER} here")
    return USER


@pytest.fixture(scope="module")
def shared(user, trained_run):
    """A root-owned folder others may enter (0755) holding copies of the session's data, its finished 4-step run
    and its image."""
    root = Path(tempfile.mkdtemp(prefix="mdc_perm_"))
    os.chmod(root, 0o755)
    for name in ("data", "run"):
        shutil.copytree(getattr(trained_run, name), root / name)
    shutil.copy(trained_run.image, root / "img.jpg")
    for path in [root, *root.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _as_user(user: str, argv: list[str], err_file: Path) -> tuple[int, str]:
    """``mdc ARGV`` in a child forked from this process that then drops to `user` (it keeps the modules already
    imported, so it needs no interpreter that user may run); its exit status and stderr."""
    import pwd
    entry = pwd.getpwnam(user)
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 70
        try:
            fd = os.open(err_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 2)
            sys.stderr = open(2, "w", closefd=False)
            os.setgroups([])
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
            os.chdir("/tmp")
            torch.set_num_threads(1)  # the parent's OpenMP pool does not survive a fork: using it would hang
            code = main(argv)
        except BaseException as err:  # anything that escapes main is a failure the parent reports
            import traceback
            traceback.print_exception(err)
        finally:
            sys.stderr.flush()
            os._exit(code)
    end = time.monotonic() + 240
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < end:
        time.sleep(0.1)
    if done[0] == 0:  # never hang the suite: a stuck child is a failure
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return -signal.SIGKILL, err_file.read_text()
    return os.waitstatus_to_exitcode(done[1]), err_file.read_text()


def test_paths_a_user_may_not_write_or_read_are_one_line(user, shared, tmp_path):
    run, data, image = shared / "run", shared / "data", shared / "img.jpg"
    private = shared / "private_run"
    shutil.copytree(run, private)
    os.chmod(private / "checkpoints", 0o700)  # a colleague's run this user may not read
    cases = {
        "train --resume": (["train", "--out", str(run), "--steps", "6", "--quiet", "--resume"], run / ".mdc.lock"),
        "train": (["train", "--preset", "tiny", "--data", str(data), "--out", str(shared / "new"), "--steps", "2",
                   "--quiet", *MICRO_SETS], shared / "new"),
        "sample": (["sample", "--run", str(private), "--image", str(image)], private / "checkpoints"),
        "export": (["export", str(run), "--out", str(shared / "exported")], shared),
        "data synth": (["data", "synth", "--out", str(shared / "data2"), "--n", "8", "--image-size", "32"],
                       shared / "data2"),
    }
    for verb, (argv, path) in cases.items():
        code, err = _as_user(user, argv, tmp_path / "stderr.txt")
        err = err.strip()
        assert code == 2 and err.startswith("mdc: error:") and "\n" not in err, (verb, code, err[-2000:])
        assert "permission denied" in err.lower() and str(path) in err and "[Errno" not in err, (verb, err)
    assert sorted(p.name for p in shared.iterdir()) == ["data", "img.jpg", "private_run", "run"]
