"""MC-Diffusion from the command line: ``mdc vqvae train`` -> ``mdc train --objective d3pm`` on its codes ->
``mdc sample`` (ancestral D3PM sampling, guidance for D3PM and MDC runs) and the errors a user sees."""

import json
import shlex

import pytest

from mdc_workbench.cli import main

DECODER = ["--set", "model.text_width=32", "--set", "model.text_layers=1", "--set", "model.text_heads=2",
           "--set", "train.batch_size=8", "--set", "train.warmup_steps=1", "--set", "train.log_every=1",
           "--set", "train.ckpt_every=2", "--set", "sampler.length=5"]
TIMM = ["--set", 'model.encoder_kwargs={"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2}',
        "--set", "model.image_size=32"]
VQ_ARGS = ["--image-size", "32", "--downsample", "2", "--codebook-size", "16", "--code-dim", "4", "--channels", "8",
           "--token-width", "16", "--batch-size", "8"]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    root = tmp_path_factory.mktemp("mc_cli")
    assert main(["data", "synth", "--out", str(root / "data"), "--n", "24", "--seed", "3", "--image-size", "32",
                 "--captions", "short"]) == 0
    import webdataset as wds

    record = next(iter(wds.WebDataset(str(root / "data" / "test" / "000000.tar"), shardshuffle=False)))
    (root / "img.jpg").write_bytes(record["jpg"])
    return root


@pytest.fixture(scope="module")
def vq_file(work):
    out = work / "vq.safetensors"
    assert main(["vqvae", "train", "--data", str(work / "data"), "--out", str(out), "--steps", "3", *VQ_ARGS]) == 0
    return out


def _train(work, name, *extra):
    run = work / name
    assert main(["train", "--preset", "tiny", "--data", str(work / "data"), "--out", str(run), "--steps", "2",
                 "--quiet", *DECODER, *extra]) == 0
    return run


@pytest.fixture(scope="module")
def d3pm_run(work, vq_file):
    """A D3PM run on the VQ-VAE's codes, trained for CFG, built from the flags `mdc vqvae show` prints."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["vqvae", "show", "--path", str(vq_file)]) == 0
    flags = shlex.split(buf.getvalue())
    return _train(work, "d3pm", "--objective", "d3pm", *flags, "--set", "objective.d3pm_steps=8",
                  "--set", "objective.guidance=cfg", "--set", "objective.p_cond=0.5")


@pytest.fixture(scope="module")
def mdc_runs(work):
    return {"none": _train(work, "mdc_plain", *TIMM),
            "mcs": _train(work, "mdc_mcs", *TIMM, "--set", "objective.guidance=mcs", "--set", "objective.p_cond=0.5",
                          "--set", "objective.p_mask=0.3")}


def _sample_json(capsys, run, work, *extra):
    capsys.readouterr()
    assert main(["sample", "--run", str(run), "--image", str(work / "img.jpg"), "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_parser_tables_match_the_library_and_do_not_import_torch():
    import dataclasses
    import subprocess
    import sys

    from mdc_workbench.cli.masked_conditional import VQVAE_OPTIONS
    from mdc_workbench.masked_conditional.guidance import GUIDANCE_FORMS, TRAINING_MODES
    from mdc_workbench.masked_conditional.plugin import GUIDANCE_MODES, GUIDANCE_TRAINING_MODES
    from mdc_workbench.masked_conditional.vqvae import VQVAEConfig

    assert GUIDANCE_MODES == ("none", *GUIDANCE_FORMS) and GUIDANCE_TRAINING_MODES == TRAINING_MODES
    fields = {f.name: f for f in dataclasses.fields(VQVAEConfig)}
    assert list(VQVAE_OPTIONS) == list(fields)
    for name, (kind, text) in VQVAE_OPTIONS.items():
        assert kind is type(fields[name].default) and f"default {fields[name].default})" in text, name
    code = "import sys; import mdc_workbench.cli; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_vqvae_train_writes_the_file_and_prints_the_train_command(work, capsys):
    out = work / "vq_printed.safetensors"
    assert main(["vqvae", "train", "--data", str(work / "data"), "--out", str(out), "--steps", "2", *VQ_ARGS]) == 0
    text = capsys.readouterr().out
    assert out.is_file() and "64 tokens per 32 px image" in text
    command = shlex.split(text.splitlines()[-1])
    assert command[:2] == ["mdc", "train"] and "model.encoder=vqvae" in command
    kwargs = json.loads(next(a for a in command if a.startswith("model.encoder_kwargs=")).split("=", 1)[1])
    assert kwargs["codebook_size"] == 16 and kwargs["image_size"] == 32
    assert main(["vqvae", "train", "--data", str(work / "data"), "--out", str(out), "--steps", "2"]) == 2
    assert "exists" in capsys.readouterr().err  # never overwritten


def test_d3pm_run_samples_with_the_ancestral_sampler(d3pm_run, work, capsys):
    cfg = json.loads((d3pm_run / "config.json").read_text())
    assert cfg["objective"]["name"] == "d3pm" and cfg["model"]["encoder"] == "vqvae"
    out = _sample_json(capsys, d3pm_run, work, "--length", "4")
    assert out["sampler"] == "d3pm" and isinstance(out["caption"], str) and len(out["tokens"]) == 4
    assert [(s["t"], s["s"]) for s in out["steps"]] == [(t, t - 1) for t in range(8, 0, -1)]  # T = the run's 8
    assert out["steps"][-1]["masked_frac"] == 0.0  # the last step leaves no [MASK]
    assert out["settings"]["steps"] == 8 and out["settings"]["calls"] == 8
    assert out["settings"]["guidance"]["mode"] == "none"
    strided = _sample_json(capsys, d3pm_run, work, "--length", "4", "--diffusion-stride", "3")
    assert [(s["t"], s["s"]) for s in strided["steps"]] == [(8, 5), (5, 2), (2, 0)]
    # cfg at w = 1 is the conditional model itself: the same draw as unguided sampling
    same = _sample_json(capsys, d3pm_run, work, "--length", "4", "--guidance", "cfg", "--guidance-scale", "1")
    assert same["token_ids"] == out["token_ids"]
    guided = _sample_json(capsys, d3pm_run, work, "--length", "4", "--guidance", "cfg", "--guidance-scale", "3")
    assert guided["settings"]["guidance"] == {"mode": "cfg", "scale": 3.0, "p_mask": 0.1, "seed": 0}
    assert len(guided["tokens"]) == 4
    # the plain form prints the caption first
    assert main(["sample", "--run", str(d3pm_run), "--image", str(work / "img.jpg"), "--length", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == out["caption"] and "T = 8" in lines[-1]


def test_mdc_run_samples_with_guidance(mdc_runs, work, capsys):
    plain = _sample_json(capsys, mdc_runs["mcs"], work, "--length", "4")
    assert plain["sampler"] == "mdc" and plain["settings"]["guidance"]["mode"] == "none"
    guided = _sample_json(capsys, mdc_runs["mcs"], work, "--length", "4", "--guidance", "mcs", "--guidance-scale", "2")
    assert len(guided["steps"]) == 4 and sorted(s["position"] for s in guided["steps"]) == [0, 1, 2, 3]
    assert guided["settings"]["guidance"] == {"mode": "mcs", "scale": 2.0, "p_mask": 0.3, "seed": 0}  # run's p_mask
    other = _sample_json(capsys, mdc_runs["mcs"], work, "--length", "4", "--guidance", "cfg", "--guidance-scale", "2")
    assert other["settings"]["guidance"]["mode"] == "cfg"


@pytest.mark.parametrize("extra, message", [
    (["--guidance", "cfg", "--guidance-scale", "2"], "objective.guidance=none"),
    (["--guidance-scale", "2"], "needs --guidance"),
    (["--diffusion-stride", "2"], "--diffusion-stride is for runs trained with --objective d3pm"),
])
def test_mdc_sample_errors(mdc_runs, work, capsys, extra, message):
    assert main(["sample", "--run", str(mdc_runs["none"]), "--image", str(work / "img.jpg"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mdc: error:") and message in err


@pytest.mark.parametrize("extra, message", [
    (["--guidance", "cfg"], "needs --guidance-scale"),
    (["--guidance", "cfg", "--guidance-scale", "2", "--guidance-p-mask", "0.5"], "applies to mcs"),
    (["--tokens-per-step", "2"], "--tokens-per-step: options of MDC's confidence sampler"),
    (["--length", "auto"], "--length auto"),
    (["--temperature", "0"], "--temperature must be > 0"),
    (["--guidance", "mcs", "--guidance-scale", "-1"], "guidance scale must be >= 0"),
])
def test_d3pm_sample_errors(d3pm_run, work, capsys, extra, message):
    assert main(["sample", "--run", str(d3pm_run), "--image", str(work / "img.jpg"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mdc: error:") and message in err


def test_guidance_mode_other_than_trained_notes_it(d3pm_run, work, capsys):
    out = _sample_json(capsys, d3pm_run, work, "--length", "3", "--guidance", "mcs", "--guidance-scale", "2")
    assert out["settings"]["guidance"]["mode"] == "mcs"
    assert main(["sample", "--run", str(d3pm_run), "--image", str(work / "img.jpg"), "--length", "3",
                 "--guidance", "mcs", "--guidance-scale", "2"]) == 0
    assert "trained with objective.guidance=cfg" in capsys.readouterr().err
