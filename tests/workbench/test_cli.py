"""The command-line contract of the core verbs: data synth, train, sample (--json), presets, and the errors a user
sees for bad input (one line ``mdc: error: ...`` and exit status 2, nothing overwritten)."""

import json

import pytest

from mdc_workbench.cli import build_parser, main
from tests.conftest import MICRO_SETS  # other test files import it from here too


def test_data_synth_writes_shards_and_manifest(trained_run, capsys):
    manifest = json.loads((trained_run.data / "manifest.json").read_text())
    assert manifest["counts"]["train"] == 24 and manifest["params"]["captions"] == "short"
    assert sorted(p.name for p in (trained_run.data / "train").glob("*.tar")) == ["000000.tar"]


def test_train_writes_a_complete_run(trained_run):
    """The session's run (--steps 4, ckpt_every 2). That the last step is saved when it is off the checkpoint grid
    is tests/core/test_interrupt.py's (a 3-step run with ckpt_every 1000 keeps step_00000003)."""
    lines = [json.loads(x) for x in (trained_run.run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4]
    for key in ("loss", "lr", "grad_norm", "masked_frac", "samples_per_s"):
        assert all(isinstance(r[key], float) for r in lines), key
    ckpts = sorted(p.name for p in (trained_run.run / "checkpoints").glob("step_*"))
    assert ckpts == ["step_00000002", "step_00000004"]
    cfg = json.loads((trained_run.run / "config.json").read_text())
    assert cfg["model"]["text_width"] == 32 and cfg["model"]["output_vocab_size"] > 0


def test_sample_json_contract(trained_run, capsys):
    run_dir, image = trained_run.run, trained_run.image
    capsys.readouterr()
    assert main(["sample", "--run", str(run_dir), "--image", str(image), "--length", "4", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert isinstance(out["caption"], str) and len(out["tokens"]) == 4
    assert len(out["steps"]) == 4 and out["settings"]["length"] == 4
    assert sorted(s["position"] for s in out["steps"]) == [0, 1, 2, 3]  # one reveal per step, each once
    for step in out["steps"]:
        assert {"position", "token", "confidence"} <= set(step) and 0.0 < step["confidence"] <= 1.0
    assert [out["tokens"][s["position"]] for s in out["steps"]] == [s["token"] for s in out["steps"]]
    # the plain form prints the caption first
    assert main(["sample", "--run", str(run_dir), "--image", str(image), "--length", "4"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == out["caption"]


def test_presets_lists_all(capsys):
    assert main(["presets"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert {"tiny", "vit_b32", "vit_b16", "vit_l14"} <= set(names)


@pytest.mark.parametrize("argv, message", [
    (["train", "--preset", "tiny", "--data", "/nonexistent/shards", "--out", "{tmp}/r"], "/nonexistent/shards"),
    (["train", "--preset", "tiny", "--out", "{tmp}/r"], "data.path is empty"),
    (["train", "--preset", "tiny", "--data", "{tmp}", "--out", "{tmp}/r", "--set", "train.lrr=1"], "train.lr"),
    (["train", "--preset", "tiny", "--data", "{tmp}", "--out", "{tmp}/r", "--set", "train.steps=-1"],
     "train.steps must be > 0"),
    (["train", "--preset", "nope", "--data", "{tmp}", "--out", "{tmp}/r"], "unknown preset 'nope'"),
    (["sample", "--run", "{tmp}/missing", "--image", "{tmp}/x.png"], "not found"),
])
def test_user_errors_are_one_line_and_exit_2(argv, message, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error:") and message in err and "\n" not in err


def test_sample_rejects_unreadable_image_and_train_refuses_to_overwrite(trained_run, tmp_path, capsys):
    run_dir, data_dir = trained_run.run, trained_run.data
    fake = tmp_path / "fake.png"
    fake.write_text("not an image")
    assert main(["sample", "--run", str(run_dir), "--image", str(fake)]) == 2
    assert "not a readable image" in capsys.readouterr().err
    before = (run_dir / "metrics.jsonl").read_text()
    assert main(["train", "--preset", "tiny", "--data", str(data_dir), "--out", str(run_dir), "--steps", "4",
                 "--quiet", *MICRO_SETS]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (run_dir / "metrics.jsonl").read_text() == before


def test_presets_lines_say_what_sets_each_preset_apart(capsys):
    """Issue 54 item 11: tiny, tiny_fast, tiny_lean and tiny_vit printed four identical lines."""
    from mdc_core.config import load_preset
    assert main(["presets"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    shown = [line.split(None, 1)[1] for line in lines.values()]
    assert len(set(shown)) == len(shown)  # no two presets read alike
    for name, line in lines.items():  # each setting in which the tiny presets differ is on its line
        cfg = load_preset(name)
        for text in (json.dumps(cfg.model.encoder_kwargs) if cfg.model.encoder_kwargs else "(timm's defaults)",
                     f"{cfg.train.steps} steps", f"cosine to {cfg.train.min_lr_ratio} x lr",
                     f"checkpoint every {cfg.train.ckpt_every}", f"sampler N'={cfg.sampler.length}",
                     "data in memory" if cfg.data.in_memory else "data streamed"):
            assert text in line, (name, text)


def _help(*verbs: str) -> str:
    """The help of `verbs` (e.g. "data", "synth") on one line, from its options on."""
    import argparse

    from mdc_workbench.cli import build_parser
    parser = build_parser()
    for verb in verbs:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[verb]
    return " ".join(parser.format_help().split()).split("options:", 1)[1]


def test_help_names_defaults_objectives_the_version_and_no_main_job(capsys):
    from mdc_core import __version__
    from mdc_core.registry import objective_names
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"mdc {__version__} (mdc-workbench)"
    top = " ".join(build_parser().format_help().split())
    assert "main job" not in top and "the full demo is make demo" in top  # README gives that name to make demo
    objective = _help("train").split("--objective OBJECTIVE", 1)[1].split("--steps", 1)[0]
    assert "default: the preset's, mdc" in objective and all(f"{n} = " in objective for n in objective_names())
    demo = _help("demo")
    assert "(default: 256)" in demo and "(default: 20000)" in demo  # argparse defaults shown
    assert "--quiet no progress bar --n" in demo  # a flag that is off shows no "(default: False)"
    assert "(default: 64)" in _help("data", "synth")  # sub-verbs too


_BAR = ("import sys, time\nfrom mdc_workbench.cli.main import _progress_throttled_when_logged\n"
        "with _progress_throttled_when_logged():\n    from tqdm import tqdm\n"
        "    bar = tqdm(total=3, file=sys.stderr)\nprint(bar.mininterval, bar.maxinterval)\n")


def test_progress_bars_are_throttled_in_a_log_and_not_on_a_terminal(tmp_path):
    """`make demo > log` grew to megabytes of carriage-return redraws: with stderr no terminal a bar redraws at most
    every 30 s; on a terminal tqdm keeps its own pace (0.1 s); a value the user set is kept."""
    import os
    import pty
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if not k.startswith("TQDM_")}
    logged = subprocess.run([sys.executable, "-c", _BAR], env=env, capture_output=True, text=True, check=True)
    assert logged.stdout.split() == ["30.0", "30.0"]
    chosen = subprocess.run([sys.executable, "-c", _BAR], env={**env, "TQDM_MININTERVAL": "5"}, capture_output=True,
                            text=True, check=True)
    assert chosen.stdout.split() == ["5.0", "30.0"]
    parent, child = pty.openpty()  # a terminal for the child's stderr
    try:
        terminal = subprocess.run([sys.executable, "-c", _BAR], env=env, stdout=subprocess.PIPE, stderr=child,
                                  text=True, check=True)
    finally:
        os.close(child)
        os.close(parent)
    assert terminal.stdout.split() == ["0.1", "10.0"]
    assert "TQDM_MININTERVAL" not in os.environ  # main() in this process left the environment as it was
