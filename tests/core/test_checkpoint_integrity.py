"""Corrupt checkpoints (files truncated as a full disk or a killed copy leaves them): a one-line error naming the
file in every verb that loads a run, and ``train --resume`` falling back to the newest intact checkpoint. Every test
damages a copy of the session's ``trained_run`` (a 4-step micro run with checkpoints at steps 2 and 4)."""

import json
import shutil
from pathlib import Path

import pytest

from mdc_core import checkpoint as ck
from mdc_core.run_state import TrainState
from mdc_workbench.cli import main
from tests.conftest import MICRO_SETS
from tests.train_helpers import read_metrics

pytestmark = pytest.mark.filterwarnings("ignore:.*intact checkpoint:UserWarning")


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


def test_meta_records_sizes_and_digests_that_verify(trained_run):
    _, run, _ = trained_run
    ckpt = ck.latest_checkpoint(run)
    meta = json.loads((ckpt / "meta.json").read_text())
    assert set(meta["sha256"]) == set(meta["files"]) >= {"model.safetensors", "state.pt", "config.json"}
    assert meta["bytes"]["model.safetensors"] == (ckpt / "model.safetensors").stat().st_size
    ck.verify_checkpoint(ckpt)  # raises if not


@pytest.mark.parametrize("keep_sha", [True, False], ids=["digests", "old-checkpoint"])
def test_every_verb_that_loads_a_run_names_the_corrupt_file_in_one_line(trained_run, tmp_path, capsys, keep_sha):
    data, run, image = trained_run
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
def test_resume_falls_back_to_the_newest_intact_checkpoint(trained_run, tmp_path, name):
    data, run, _ = trained_run
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


def test_resume_with_every_checkpoint_corrupt_is_a_one_line_error(trained_run, tmp_path, capsys):
    data, run, _ = trained_run
    broken = tmp_path / "run"
    _copy_truncated(run, broken, "model.safetensors")
    older = broken / "checkpoints" / "step_00000002" / "model.safetensors"
    older.write_bytes(older.read_bytes()[:100])
    argv = ["train", "--preset", "tiny", "--data", str(data), "--out", str(broken), "--steps", "4", "--quiet",
            "--resume", *MICRO_SETS]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error: checkpoint file") and "no intact checkpoint" in err and "\n" not in err


def _resume_argv(data: Path, run: Path, steps: int = 4) -> list[str]:
    return ["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--steps", str(steps), "--quiet",
            "--resume", *MICRO_SETS]


def _same_losses(a: Path, b: Path) -> None:
    for x, y in zip(read_metrics(a), read_metrics(b), strict=True):
        assert x["step"] == y["step"] and abs(x["loss"] - y["loss"]) < 1e-5 * max(1, abs(x["loss"]))


def test_a_damaged_meta_json_is_named_by_readers_and_set_aside_by_resume(trained_run, tmp_path, capsys):
    data, run, image = trained_run
    broken = tmp_path / "run"
    shutil.copytree(run, broken)
    meta = broken / "checkpoints" / "step_00000004" / "meta.json"
    meta.write_text('{"step": 4, "compl')  # cut off
    for argv in (["sample", "--run", str(broken), "--image", str(image)],
                 ["score", "--run", str(broken), "--image", str(image), "--caption", "a red circle", "--method",
                  "heuristic"]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert f"checkpoint file {meta} is damaged" in err and "step_00000002" in err and "\n" not in err, err
    with pytest.warns(UserWarning, match=r"meta.json is damaged.*set aside as corrupt_step_00000004.*step_00000002"):
        assert main(_resume_argv(data, broken)) == 0
    aside = broken / "checkpoints" / "corrupt_step_00000004"
    assert (aside / "meta.json").read_text() == '{"step": 4, "compl'  # kept as found, never overwritten
    _same_losses(broken, run)  # steps 3-4 retrained from step 2
    ck.verify_checkpoint(broken / "checkpoints" / "step_00000004")


def test_a_deleted_state_pt_leaves_the_weights_readable_and_resume_falls_back_with_a_warning(trained_run, tmp_path,
                                                                                               capsys):
    data, run, image = trained_run
    broken = tmp_path / "run"
    shutil.copytree(run, broken)
    ckpt = broken / "checkpoints" / "step_00000004"
    (ckpt / "state.pt").unlink()
    capsys.readouterr()
    assert main(["sample", "--run", str(run), "--image", str(image), "--json"]) == 0
    expected = json.loads(capsys.readouterr().out)["caption"]
    for where in (broken, ckpt):  # the run folder, and the checkpoint folder itself: its weights are intact
        assert main(["sample", "--run", str(where), "--image", str(image), "--json"]) == 0, capsys.readouterr().err
        assert json.loads(capsys.readouterr().out)["caption"] == expected
    with pytest.warns(UserWarning, match=r"state.pt is missing.*set aside as corrupt_step_00000004.*step_00000002"):
        assert main(_resume_argv(data, broken)) == 0
    assert sorted(p.name for p in (broken / "checkpoints" / "corrupt_step_00000004").iterdir()) == \
        ["config.json", "meta.json", "model.safetensors"]
    _same_losses(broken, run)  # an exact resume from the newest checkpoint with its train state


def test_train_state_missing_everywhere_resumes_weights_only_never_from_step_0(trained_run, tmp_path, capsys):
    from mdc_core.run_folder import weights_only_state
    data, run, _ = trained_run
    broken = tmp_path / "run"
    shutil.copytree(run, broken)
    for state in (broken / "checkpoints").glob("step_*/state.pt"):
        state.unlink()
    weights = broken / "checkpoints" / "step_00000004" / "model.safetensors"
    before = weights.read_bytes()
    # what the logs give back equals what state.pt held: data position (24 samples, 3 steps an epoch) and counters
    real = TrainState.from_state_dict(ck.load_train_state(run / "checkpoints" / "step_00000004"))
    rebuilt = weights_only_state(broken, 4, grad_accum=1)
    assert (rebuilt.epoch, rebuilt.batch_in_epoch) == (real.epoch, real.batch_in_epoch) == (1, 1)
    assert rebuilt.counters == real.counters
    assert (rebuilt.optimizer, rebuilt.scheduler, rebuilt.rng) == (None, None, None)
    with pytest.warns(UserWarning, match=r"resuming from step_00000004's weights.*Lost: the optimizer state"):
        assert main(_resume_argv(data, broken, steps=6)) == 0
    assert "trained 6 steps (resumed at step 4)" in capsys.readouterr().out
    logged = read_metrics(broken)
    assert [r["step"] for r in logged] == [1, 2, 3, 4, 5, 6]  # steps 1-4 kept, not started over
    assert [r["loss"] for r in logged[:4]] == [r["loss"] for r in read_metrics(run)]
    assert weights.read_bytes() == before  # the weights it resumed from are never overwritten
    ck.verify_checkpoint(broken / "checkpoints" / "step_00000006")
    assert ck.load_train_state(broken / "checkpoints" / "step_00000006")["step"] == 6


def test_set_aside_never_replaces_an_earlier_corrupt_copy(tmp_path):
    root = tmp_path / "checkpoints"
    for name in ("step_00000004", "corrupt_step_00000004"):
        (root / name).mkdir(parents=True)
        (root / name / "which").write_text(name)
    moved = ck.set_aside(root / "step_00000004")
    assert moved.name == "corrupt_step_00000004.1" and (moved / "which").read_text() == "step_00000004"
    assert (root / "corrupt_step_00000004" / "which").read_text() == "corrupt_step_00000004"
