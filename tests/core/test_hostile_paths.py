"""Issue 59 items 1, 3 and 8: a run folder is written only where it lies. A symbolic link inside it is never
written or deleted through (item 1); its data record is written at a fresh start only, and data changed in place is
refused on ``--resume`` (item 3); a run folder is never inside another run's ``checkpoints/`` (item 8)."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from mdc_core.run_folder import FINGERPRINT_FILE
from mdc_workbench.cli import main
from tests.workbench.test_cli import MICRO_SETS


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> tuple[Path, Path]:
    """A data folder and a finished 4-step micro run on it (checkpoints 2 and 4)."""
    root = tmp_path_factory.mktemp("hostile_paths")
    data, run = root / "data", root / "run"
    assert main(["data", "synth", "--out", str(data), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    assert main(["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--steps", "4", "--quiet",
                 *MICRO_SETS]) == 0
    return data, run


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (links as their target's name) with its SHA-256."""
    return {str(p.relative_to(folder)): ("-> " + str(p.readlink())) if p.is_symlink() else
            hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_symlink() or
            p.is_file()}


def one_line(capsys: pytest.CaptureFixture[str], *words: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mdc: error: "), err
    assert all(w in err[0] for w in words), err[0]
    return err[0]


@pytest.mark.parametrize("name", [".mdc.lock", "config.json", "metrics.jsonl", "epochs.jsonl", FINGERPRINT_FILE,
                                  "checkpoints/latest"])
def test_a_link_in_a_run_folder_is_never_written_through(
        finished: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """Issue 59 item 1: `ln -s /elsewhere/important.txt RUN/NAME`, then `mdc train --resume --out RUN --steps 6`:
    one line naming the link; the target keeps its bytes, the link stays, nothing in the run changes."""
    data, source = finished
    run = tmp_path / "run"
    shutil.copytree(source, run, symlinks=True)
    important = tmp_path / "elsewhere" / "important.txt"
    important.parent.mkdir()
    important.write_text("years of work\n")
    link = run / name
    link.unlink(missing_ok=True)
    link.symlink_to(important)
    before = snapshot(run)
    assert main(["train", "--out", str(run), "--resume", "--steps", "6", "--quiet"]) == 2
    one_line(capsys, str(link), "symbolic link")
    assert important.read_text() == "years of work\n"
    assert snapshot(run) == before


def test_a_link_in_a_new_run_folder_is_never_written_through(
        finished: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same on a fresh start: a folder holding only `config.json -> elsewhere` is not trained into."""
    data, _ = finished
    run, important = tmp_path / "run", tmp_path / "important.txt"
    important.write_text("years of work\n")
    run.mkdir()
    (run / "config.json").symlink_to(important)
    assert main(["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--steps", "2", "--quiet",
                 *MICRO_SETS]) == 2
    one_line(capsys, "config.json", "symbolic link")
    assert important.read_text() == "years of work\n"
    assert sorted(p.name for p in run.iterdir()) == ["config.json"]


@pytest.mark.parametrize("inside", ["checkpoints/step_00000004", "checkpoints/new_run", "checkpoints"])
def test_a_run_folder_inside_a_runs_checkpoints_is_refused(
        finished: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], inside: str) -> None:
    """Issue 59 item 8: `mdc train --resume --out RUN/checkpoints/step_N` (or a new run there) is one line; the
    checkpoint's files are untouched and nothing is added."""
    data, source = finished
    run = tmp_path / "run"
    shutil.copytree(source, run)
    before = snapshot(run)
    out = run / inside
    resume = ["--resume"] if inside.endswith("04") else ["--preset", "tiny", "--data", str(data), *MICRO_SETS]
    assert main(["train", "--out", str(out), *resume, "--steps", "6", "--quiet"]) == 2
    one_line(capsys, "checkpoints", "never inside another run")
    assert snapshot(run) == before
    assert not (run / "checkpoints" / "new_run").exists()


def _edit_captions_in_place(shard: Path, keep_mtime: bool) -> None:
    """Each caption of `shard` reversed in place: the same size (and, with `keep_mtime`, the same mtime)."""
    from tests.core.test_resume_data import _recaption
    stat = shard.stat()
    _recaption(shard)
    if keep_mtime:
        os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert shard.stat().st_size == stat.st_size


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_data_changed_in_place_is_refused_on_resume_and_the_record_kept(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], keep_mtime: bool) -> None:
    """Issue 59 item 3: the same data path, captions edited inside a shard with equal sizes (also with its mtime set
    back), then `--resume`: one line naming the shard; `data_fingerprint.json` and the whole run byte-identical."""
    data, run = tmp_path / "data", tmp_path / "run"
    assert main(["data", "synth", "--out", str(data), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    assert main(["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--steps", "2", "--quiet",
                 *MICRO_SETS]) == 0
    shard = sorted((data / "train").glob("*.tar"))[0]
    _edit_captions_in_place(shard, keep_mtime)
    before = snapshot(run)
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--steps", "4", "--quiet"]) == 2
    one_line(capsys, "not what this run recorded", shard.name)
    assert snapshot(run) == before


def test_synth_overwrite_refuses_the_data_a_run_is_reading(finished: tuple[Path, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 59 item 3: `mdc data synth --overwrite` of the folder a training run reads (here, from inside the run)
    is one line and changes no shard; once the run has finished it is allowed."""
    from mdc_core.train import train
    from tests.train_helpers import micro_run
    data = tmp_path / "data"
    shutil.copytree(finished[0], data)
    before = snapshot(data)
    answers: list[tuple[int, str]] = []

    class Overwrite:  # a run hook: made once the run has started, beside its first step
        def __init__(self, *_: object) -> None:
            for folder in (data, data / "train"):
                answers.append((main(["data", "synth", "--out", str(folder), "--n", "8", "--image-size", "32",
                                      "--overwrite"]), capsys.readouterr().err))

        def record(self, record: dict) -> None: ...
        def checkpoint(self, step: int, model: object) -> None: ...
        def close(self) -> None: ...

    train(micro_run(data, steps=2, batch_size=4), tmp_path / "run", progress=False, hooks=[Overwrite])
    for rc, err in answers:
        assert rc == 2 and err.startswith("mdc: error: ") and "being read by a training run" in err, err
        assert err.count("\n") == 1
    assert snapshot(data) == before
    assert main(["data", "synth", "--out", str(data), "--n", "8", "--image-size", "32", "--overwrite"]) == 0
