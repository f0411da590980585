"""Issue 59 item 9: one line where a traceback was. A `state.pt` holding a disallowed pickle (its digest made to
match), JSON nested deeper than the stack in `metrics.jsonl`, `data_fingerprint.json` or a `--set` value, a file size
limit (`ulimit -f`), the truncation share after a resume, `from_pretrained` of a folder without `meta.json`."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import resource
import shutil
import subprocess
import sys

import pytest
import torch

from mdc_core import checkpoint as ckpt_io
from mdc_core.run_folder import FINGERPRINT_FILE, train_state_problem
from mdc_workbench.cli import main
from tests.core.test_hostile_paths import finished  # noqa: F401 - the module-scoped finished run
from tests.workbench.test_cli import MICRO_SETS

DEEP = "[" * 100_000 + "]" * 100_000


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("mdc: error")]
    assert len(err) == 1, err
    return err[0]


def test_a_state_pt_holding_a_disallowed_pickle_is_restated_and_resume_falls_back(
        finished, tmp_path, capsys):  # noqa: F811
    """Its digest matches, so only loading finds it: one line that never advises weights_only=False; `--resume`
    sets it aside and goes on from step 2."""
    run = tmp_path / "run"
    shutil.copytree(finished[1], run)
    ckpt = run / "checkpoints" / "step_00000004"
    torch.save({"when": dt.date(2026, 1, 1)}, ckpt / "state.pt")  # a class weights_only refuses
    meta = json.loads((ckpt / "meta.json").read_text())
    meta["bytes"]["state.pt"] = (ckpt / "state.pt").stat().st_size
    meta["sha256"]["state.pt"] = hashlib.sha256((ckpt / "state.pt").read_bytes()).hexdigest()
    (ckpt / "meta.json").write_text(json.dumps(meta))
    problem = train_state_problem(ckpt)
    assert "holds objects other than tensors" in problem and "weights_only" not in problem and "\n" not in problem
    with pytest.raises(ckpt_io.CheckpointError, match="holds objects other than tensors"):
        ckpt_io.load_train_state(ckpt)
    with pytest.warns(UserWarning, match="holds objects other than tensors"):
        assert main(["train", "--out", str(run), "--resume", "--steps", "6", "--quiet"]) == 0


@pytest.mark.parametrize("where", ["metrics.jsonl", FINGERPRINT_FILE])
def test_json_nested_deeper_than_the_stack_in_a_run_folder_is_not_a_recursion_error(
        finished, tmp_path, capsys, where):  # noqa: F811
    run = tmp_path / "run"
    shutil.copytree(finished[1], run)
    if where == "metrics.jsonl":
        with open(run / where, "a") as fh:
            fh.write(DEEP + "\n")
    else:
        (run / where).write_text(DEEP)
    assert main(["train", "--out", str(run), "--resume", "--steps", "6", "--quiet"]) == 0


def test_a_deeply_nested_set_value_is_one_line(finished, tmp_path, capsys):  # noqa: F811
    assert main(["train", "--preset", "tiny", "--data", str(finished[0]), "--out", str(tmp_path / "run"),
                 "--steps", "2", "--quiet", "--set", f"model.encoder_kwargs={DEEP}"]) == 2
    assert "nested too deeply" in _one_line(capsys)


def test_a_file_size_limit_is_the_full_disk_line(finished, tmp_path):  # noqa: F811
    """`ulimit -f` below a checkpoint's size: the one-line full-disk message naming the limit, exit 1, no partial
    checkpoint folder (before: 'unexpected pos' with a traceback)."""
    run = tmp_path / "run"
    limit = 96 << 10  # bytes: the logs fit, the weights (170 KB) do not

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    out = subprocess.run([sys.executable, "-m", "mdc_workbench", "train", "--preset", "tiny", "--data",
                          str(finished[0]), "--out", str(run), "--steps", "2", "--quiet", *MICRO_SETS],
                         capture_output=True, text=True, preexec_fn=small_files, timeout=600)
    err = out.stderr.strip().splitlines()
    assert out.returncode == 1 and err[-1].startswith("mdc: error: ") and "ulimit -f" in err[-1], out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert not list((run / "checkpoints").glob("*step_*"))


def test_the_truncation_share_after_a_resume_is_of_the_whole_run(finished, tmp_path, capsys):  # noqa: F811
    run = tmp_path / "run"
    base = ["train", "--preset", "tiny", "--data", str(finished[0]), "--out", str(run), "--quiet", *MICRO_SETS,
            "--set", "model.context_length=4", "--set", "sampler.length=2"]
    assert main([*base, "--steps", "2"]) == 0
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume", "--steps", "6", "--quiet"]) == 0
    share = re.search(r"truncated to the context of 4 tokens: (\d+) of about (\d+) \((\d+)%\)", capsys.readouterr().out)
    assert share is not None
    truncated, seen, percent = map(int, share.groups())
    assert truncated <= seen and percent <= 100 and seen == 6 * 8


def test_from_pretrained_of_a_folder_without_meta_json_says_so(finished, tmp_path):  # noqa: F811
    from mdc_workbench.export import MDCCaptioner
    model = MDCCaptioner.from_pretrained(str(finished[1] / "checkpoints" / "step_00000004"))
    folder = tmp_path / "export"
    model.save_pretrained(folder)
    (folder / "meta.json").unlink()
    with pytest.warns(UserWarning, match="no meta.json"):
        MDCCaptioner.from_pretrained(str(folder))
