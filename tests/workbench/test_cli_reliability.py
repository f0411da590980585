"""One line where a traceback used to be, and ``--resume`` from the run folder alone: ``mdc --help`` imports no
torch, a CLIP run given to ``sample``, out-of-vocabulary words, pasted paragraphs,
a missing ``--root``, a caption table whose images are all missing; ``--resume`` without flags, a moved data
folder, ``--steps`` below, at and above a finished run's."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mdc_workbench.cli import main
from tests.conftest import MICRO_SETS
from tests.train_helpers import read_metrics
from tests.workbench.test_eval_compositionality import make_run

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error:") and "\n" not in err, err
    return err


def test_building_the_parser_imports_no_torch():
    code = ("import sys; from mdc_workbench.cli import build_parser; build_parser().format_help(); "
            "print(sorted(m for m in ('torch', 'torchvision', 'numpy', 'PIL', 'webdataset') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
    from mdc_workbench.cli.evaluate import PROBE_LABELS
    from mdc_workbench.data import LABEL_NAMES
    assert PROBE_LABELS == LABEL_NAMES


def test_sample_a_clip_run_is_one_line(trained_run, tmp_path, capsys):
    clip = make_run(tmp_path, "clip")  # a micro CLIP run folder (step 0): refusing it needs no trained weights
    assert main(["sample", "--run", str(clip), "--image", str(trained_run.image)]) == 2
    assert "is a CLIP run (objective clip): it has no caption decoder" in _one_line(capsys)


def test_score_names_the_out_of_vocabulary_word_and_long_prompts_are_cut(trained_run, capsys):
    _, run, image = trained_run
    assert main(["score", "--run", str(run), "--image", str(image), "--caption", "a zebra", "--method",
                 "heuristic"]) == 2
    err = _one_line(capsys)
    assert "'zebra'" in err and "not in this model's output vocabulary" in err and "token id" not in err
    paragraph = "red " * 2500
    for argv in (["sample", "--run", str(run), "--image", str(image), "--prompt", paragraph],
                 ["score", "--run", str(run), "--image", str(image), "--prompt", paragraph, "--caption", "red",
                  "--method", "heuristic"]):
        assert main(argv) == 2
        err = _one_line(capsys)
        assert len(err) < 300 and "(10000 characters)" in err, err[:400]


def test_app_with_a_missing_root_is_one_line(trained_run, capsys, monkeypatch):
    import mdc_app.launch
    _, run, _ = trained_run
    monkeypatch.setattr(mdc_app.launch, "serve", lambda *a, **k: None)  # never start a server here
    assert main(["app", "--run", str(run), "--root", "/nonexistent/runs"]) == 2
    assert "--root /nonexistent/runs is not a folder" in _one_line(capsys)


def test_app_on_a_port_in_use_says_so_before_importing_anything_heavy(capsys, monkeypatch):
    """`mdc app --port N` with N taken answers at once: the port is checked before the preloaded imports (torch,
    gradio: tens of seconds on a busy machine)."""
    import socket
    import sys

    cli_main = sys.modules["mdc_workbench.cli.main"]  # the module (the package exports its `main` function)
    imported = []
    monkeypatch.setattr(cli_main.importlib, "import_module", lambda name: imported.append(name))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["app", "--port", str(port)]) == 2
    assert f"port {port} on 127.0.0.1 is in use" in _one_line(capsys)
    assert imported == []


def test_a_caption_table_whose_images_are_all_missing_says_so(tmp_path, capsys):
    table = tmp_path / "pairs.csv"
    table.write_text("image,caption\nnope1.jpg,a cat\nnope2.jpg,a dog\n")
    assert main(["train", "--preset", "tiny", "--data", str(table), "--out", str(tmp_path / "run"), "--steps", "1",
                 "--quiet", *MICRO_SETS, "--set", "train.batch_size=1"]) == 2
    err = _one_line(capsys)
    assert f"none of the 2 images that {table} names exists (first: {tmp_path / 'nope1.jpg'})" in err
    assert not (tmp_path / "run").exists()


def test_resume_needs_no_flag_and_steps_below_at_and_above_the_run(trained_run, tmp_path, capsys):
    _, run, _ = trained_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    capsys.readouterr()
    assert main(["train", "--out", str(copy), "--resume", "--quiet"]) == 0  # the run's own config.json
    out = capsys.readouterr().out
    last = read_metrics(copy)[-1]
    assert out.startswith(f"nothing to train: {copy} has already taken its 4 steps (last logged loss "
                          f"{last['loss']:.4f}") and "nan" not in out
    assert main(["train", "--out", str(copy), "--resume", "--steps", "2", "--quiet"]) == 2
    assert "--steps 2 is below the 4 steps this run has taken" in _one_line(capsys)
    with pytest.warns(UserWarning, match="the cosine schedule now decays over 6 steps"):
        assert main(["train", "--out", str(copy), "--resume", "--steps", "6", "--quiet"]) == 0
    assert "trained 6 steps (resumed at step 4)" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(copy)] == [1, 2, 3, 4, 5, 6]
    assert json.loads((copy / "config.json").read_text())["train"]["steps"] == 6
    assert main(["train", "--out", str(tmp_path / "none"), "--resume"]) == 2
    assert "--resume: run folder" in _one_line(capsys)


def test_resume_accepts_the_moved_data_folder_by_content(trained_run, tmp_path, capsys):
    data, run, _ = trained_run
    moved, copy = tmp_path / "moved_data", tmp_path / "run"
    shutil.copytree(run, copy)
    shutil.copytree(data, moved)
    # the old location gone: --resume alone says what to do, --data NEW with the same content is accepted
    saved = json.loads((copy / "config.json").read_text())
    saved["data"]["path"] = str(tmp_path / "gone")
    for cfg_file in (copy / "config.json", *copy.glob("checkpoints/step_*/config.json")):
        cfg_file.write_text(json.dumps(saved))
    assert main(["train", "--out", str(copy), "--resume", "--steps", "6", "--quiet"]) == 2
    assert "If the run's data moved, pass --data NEW_PATH" in _one_line(capsys)
    with pytest.warns(UserWarning, match=f"data moved from {tmp_path / 'gone'} to {moved} \\(the same content\\)"):
        assert main(["train", "--out", str(copy), "--resume", "--data", str(moved), "--steps", "6", "--quiet"]) == 0
    assert json.loads((copy / "config.json").read_text())["data"]["path"] == str(moved)
    # other data under the new name is refused
    other = tmp_path / "other_data"
    assert main(["data", "synth", "--out", str(other), "--n", "16", "--seed", "4", "--image-size", "32",
                 "--captions", "short"]) == 0
    capsys.readouterr()
    shutil.rmtree(moved)
    assert main(["train", "--out", str(copy), "--resume", "--data", str(other), "--steps", "8", "--quiet"]) == 2
    assert "is not the data this run trained on" in _one_line(capsys)


def test_an_emoji_in_a_caption_or_prompt_is_named_whole(trained_run, capsys):
    """Its bytes used to be decoded one BPE token at a time, so the message showed '\\ufffd' fragments."""
    from mdc_core.tokenizer import CaptionTokenizer
    tok = CaptionTokenizer()
    ids = tok.encode_text("a red 🫠 cat")
    emoji = set(tok.encode_text("🫠"))
    assert len(emoji) > 1 and tok.words_with(ids, emoji) == ["🫠"] and tok.words_with(ids, set()) == []
    _, run, image = trained_run
    for argv in (["score", "--run", str(run), "--image", str(image), "--caption", "a red 🫠", "--method",
                  "heuristic"],
                 ["sample", "--run", str(run), "--image", str(image), "--prompt", "a 🫠 [MASK]"]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert "🫠" in err and "\ufffd" not in err and "\n" not in err, err
