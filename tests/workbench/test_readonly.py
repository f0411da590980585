"""Paths that cannot be written: a read-only file system (a real tmpfs remounted read-only, where the test may
mount one), a missing folder for ``--gif``, a folder where the lock file goes, a file where ``--out`` goes: one
line naming the path, never a traceback or a bare ``[Errno N]``."""

import errno
import shutil
import subprocess

import pytest

from mdc_workbench.cli import main
from mdc_workbench.cli.main import describe_os_error
from tests.conftest import MICRO_SETS


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error:") and "\n" not in err and "[Errno" not in err, err
    return err


@pytest.fixture
def read_only(tmp_path, trained_run):
    """A tmpfs holding a copy of the run, remounted read-only (skips where mounting is not allowed)."""
    where = tmp_path / "ro"
    where.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        done = None
    if done is None or done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root, or no CAP_SYS_ADMIN); "
                    "test_an_os_error_is_described_by_its_path covers the message")
    try:
        shutil.copytree(trained_run.run, where / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True, capture_output=True, timeout=30)
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True, timeout=30)


def test_a_read_only_file_system_is_one_line_naming_the_path(trained_run, read_only, capsys):
    """Each of these used to end in a traceback (OSError: [Errno 30] Read-only file system)."""
    data, run, image = trained_run
    ro = read_only
    verbs = {
        "train": ["train", "--preset", "tiny", "--data", str(data), "--out", str(ro / "new"), "--steps", "2",
                  "--quiet", *MICRO_SETS],
        "train --resume": ["train", "--out", str(ro / "run"), "--steps", "6", "--quiet", "--resume"],
        "sample --gif": ["sample", "--run", str(run), "--image", str(image), "--gif", str(ro / "out.gif")],
        "export": ["export", str(run), "--out", str(ro / "exported")],
        "data synth": ["data", "synth", "--out", str(ro / "data"), "--n", "8", "--image-size", "32"],
    }
    for verb, argv in verbs.items():
        capsys.readouterr()
        assert main(argv) == 2, verb
        err = _one_line(capsys)
        assert "read-only file system" in err and str(ro) in err, (verb, err)


def test_an_os_error_is_described_by_its_path():
    assert describe_os_error(OSError(errno.EROFS, "Read-only file system", "/mnt/x")) == \
        "/mnt/x is on a read-only file system: write somewhere else"
    assert describe_os_error(PermissionError(errno.EACCES, "Permission denied", "/srv/run")) == \
        "/srv/run: permission denied (this user may not read or write it)"
    assert describe_os_error(FileExistsError(errno.EEXIST, "File exists", "/a")) == \
        "/a is in the way: a file is there where a folder is needed"
    mine = FileNotFoundError("--resume: run folder /x does not exist")  # a message of ours is kept as it is
    assert describe_os_error(mine) == str(mine)


def test_gif_into_a_missing_folder_is_refused_and_creates_nothing(trained_run, tmp_path, capsys):
    _, run, image = trained_run
    gif = tmp_path / "nonexist" / "dir" / "out.gif"
    assert main(["sample", "--run", str(run), "--image", str(image), "--gif", str(gif)]) == 2
    assert f"--gif {gif}: the folder {gif.parent} does not exist" in _one_line(capsys)
    assert not (tmp_path / "nonexist").exists()


def test_a_folder_where_the_lock_goes_and_a_file_as_out_are_one_line(trained_run, tmp_path, capsys):
    data = trained_run.data
    run = tmp_path / "run"
    (run / ".mdc.lock").mkdir(parents=True)
    argv = ["train", "--preset", "tiny", "--data", str(data), "--steps", "2", "--quiet", *MICRO_SETS]
    assert main([*argv, "--out", str(run)]) == 2
    assert f"{run / '.mdc.lock'} is a folder" in _one_line(capsys)
    assert [p.name for p in run.iterdir()] == [".mdc.lock"]
    afile = tmp_path / "afile"
    afile.write_text("mine")
    assert main([*argv, "--out", str(afile)]) == 2
    assert f"{afile} is a file, not a folder" in _one_line(capsys)
    assert afile.read_text() == "mine"
