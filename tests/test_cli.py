"""The command-line contract of the core verbs: data synth, train, sample (--json), presets, and the errors a user
sees for bad input (one line ``mdc: error: ...`` and exit status 2, nothing overwritten)."""

import json

import pytest

from mdc_core.cli import main

MICRO_SETS = [
    "--set", 'model.encoder_kwargs={"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2}',
    "--set", "model.image_size=32", "--set", "model.text_width=32", "--set", "model.text_layers=1",
    "--set", "model.text_heads=2", "--set", "train.batch_size=8", "--set", "train.warmup_steps=1",
    "--set", "train.log_every=1", "--set", "train.ckpt_every=2", "--set", "sampler.length=5",
]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "data"
    assert main(["data", "synth", "--out", str(out), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    return out


@pytest.fixture(scope="module")
def run_dir(data_dir):
    run = data_dir.parent / "run"
    assert main(["train", "--preset", "tiny", "--data", str(data_dir), "--out", str(run), "--steps", "3",
                 "--quiet", *MICRO_SETS]) == 0
    return run


def test_data_synth_writes_shards_and_manifest(data_dir, capsys):
    manifest = json.loads((data_dir / "manifest.json").read_text())
    assert manifest["counts"]["train"] == 24 and manifest["params"]["captions"] == "short"
    assert sorted(p.name for p in (data_dir / "train").glob("*.tar")) == ["000000.tar"]


def test_train_writes_a_complete_run(run_dir):
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3]
    for key in ("loss", "lr", "grad_norm", "masked_frac", "samples_per_s"):
        assert all(isinstance(r[key], float) for r in lines), key
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))
    assert ckpts == ["step_00000002", "step_00000003"]
    cfg = json.loads((run_dir / "config.json").read_text())
    assert cfg["model"]["text_width"] == 32 and cfg["model"]["output_vocab_size"] > 0


def test_sample_json_contract(run_dir, data_dir, tmp_path, capsys):
    import webdataset as wds

    record = next(iter(wds.WebDataset(str(data_dir / "test" / "000000.tar"), shardshuffle=False)))
    image = tmp_path / "img.jpg"
    image.write_bytes(record["jpg"])
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


def test_sample_rejects_unreadable_image_and_train_refuses_to_overwrite(run_dir, data_dir, tmp_path, capsys):
    fake = tmp_path / "fake.png"
    fake.write_text("not an image")
    assert main(["sample", "--run", str(run_dir), "--image", str(fake)]) == 2
    assert "not a readable image" in capsys.readouterr().err
    before = (run_dir / "metrics.jsonl").read_text()
    assert main(["train", "--preset", "tiny", "--data", str(data_dir), "--out", str(run_dir), "--steps", "3",
                 "--quiet", *MICRO_SETS]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (run_dir / "metrics.jsonl").read_text() == before
