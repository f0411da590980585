"""Corrupt checkpoints (files truncated as a full disk or a killed copy leaves them): a one-line error naming the
file in every verb that loads a run, and ``train --resume`` falling back to the newest intact checkpoint."""

import json
import shutil
from pathlib import Path

import pytest
import webdataset as wds

from mdc_core import checkpoint as ck
from mdc_core.cli import main
from tests.test_cli import MICRO_SETS
from tests.train_helpers import read_metrics

pytestmark = pytest.mark.filterwarnings("ignore:.*intact checkpoint:UserWarning")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, Path]:
    """A synthetic data folder, a 4-step micro run with checkpoints at steps 2 and 4, and a test image."""
    root = tmp_path_factory.mktemp("integrity")
    data, run = root / "data", root / "run"
    assert main(["data", "synth", "--out", str(data), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    assert main(["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--steps", "4", "--quiet",
                 *MICRO_SETS]) == 0
    record = next(iter(wds.WebDataset(str(data / "test" / "000000.tar"), shardshuffle=False)))
    (root / "img.jpg").write_bytes(record["jpg"])
    return data, run, root / "img.jpg"


def _copy_truncated(run: Path, dest: Path, name: str, keep_sha: bool = True) -> Path:
    shutil.copytree(run, dest)
    target = dest / "checkpoints" / "step_00000004" / name
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])  # cut off mid-write
    if not keep_sha:  # a checkpoint written before digests were recorded
        meta_file = target.parent / "meta.json"
        meta = json.loads(meta_file.read_text())
        meta.pop("sha256"), meta.pop("bytes")
        meta_file.write_text(json.dumps(meta))
    return target


def test_meta_records_sizes_and_digests_that_verify(trained):
    _, run, _ = trained
    ckpt = ck.latest_checkpoint(run)
    meta = json.loads((ckpt / "meta.json").read_text())
    assert set(meta["sha256"]) == set(meta["files"]) >= {"model.safetensors", "state.pt", "config.json"}
    assert meta["bytes"]["model.safetensors"] == (ckpt / "model.safetensors").stat().st_size
    ck.verify_checkpoint(ckpt)  # raises if not


@pytest.mark.parametrize("keep_sha", [True, False], ids=["digests", "old-checkpoint"])
def test_every_verb_that_loads_a_run_names_the_corrupt_file_in_one_line(trained, tmp_path, capsys, keep_sha):
    data, run, image = trained
    broken = tmp_path / "run"
    target = _copy_truncated(run, broken, "model.safetensors", keep_sha)
    verbs = {"sample": ["sample", "--run", str(broken), "--image", str(image)],
             "score": ["score", "--run", str(broken), "--image", str(image), "--caption", "a red circle",
                       "--method", "heuristic"],
             "probe": ["probe", "--run", str(broken), "--data", str(data), "--limit", "8", "--quiet"],
             "app": ["app", "--run", str(broken), "--root", str(tmp_path)]}
    for verb, argv in verbs.items():
        capsys.readouterr()
        assert main(argv) == 2, verb
        err = capsys.readouterr().err.strip()
        assert err.startswith("mdc: error: checkpoint file") and str(target) in err and "\n" not in err, (verb, err)
        if keep_sha:
            assert "step_00000002" in err, err  # points at the newest intact checkpoint


@pytest.mark.parametrize("name", ["model.safetensors", "state.pt"])
def test_resume_falls_back_to_the_newest_intact_checkpoint(trained, tmp_path, name):
    data, run, _ = trained
    broken = tmp_path / "run"
    _copy_truncated(run, broken, name)
    argv = ["train", "--preset", "tiny", "--data", str(data), "--out", str(broken), "--steps", "4", "--quiet",
            "--resume", *MICRO_SETS]
    with pytest.warns(UserWarning, match=rf"{name} is corrupt.*newest intact checkpoint, step_00000002"):
        assert main(argv) == 0
    # steps 3-4 retrained from step 2 give the metrics and weights of the original run
    assert [r["step"] for r in read_metrics(broken)] == [1, 2, 3, 4]
    for a, b in zip(read_metrics(broken), read_metrics(run), strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-5 * max(1, abs(a["loss"]))
    ck.verify_checkpoint(ck.latest_checkpoint(broken))
    assert (broken / "checkpoints" / "corrupt_step_00000004").is_dir()  # set aside, not deleted


def test_resume_with_every_checkpoint_corrupt_is_a_one_line_error(trained, tmp_path, capsys):
    data, run, _ = trained
    broken = tmp_path / "run"
    _copy_truncated(run, broken, "state.pt")
    older = broken / "checkpoints" / "step_00000002" / "state.pt"
    older.write_bytes(older.read_bytes()[:100])
    argv = ["train", "--preset", "tiny", "--data", str(data), "--out", str(broken), "--steps", "4", "--quiet",
            "--resume", *MICRO_SETS]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error: checkpoint file") and "no intact checkpoint" in err and "\n" not in err
