"""Parallel decoding curve: steps per setting, accuracies, the figure, the CLI and its errors."""

import json
import math

import pytest
import torch

from mdc_core.checkpoint import save_checkpoint
from mdc_core.config import DataConfig, ObjectiveConfig, RunConfig, SamplerConfig
from mdc_core.data import iter_captions
from mdc_core.factory import create_model
from mdc_core.tokenizer import build_output_vocab
from mdc_workbench.cli import main
from mdc_workbench.data import write_synthetic_dataset
from mdc_workbench.eval.parallel_decoding import decoding_curve, decoding_settings, plot_decoding_curve
from tests.conftest import micro_config

LENGTH = 5  # N'


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A random micro MDC run, a random micro ARC run (N' = 5) and 12 embedded test images."""
    root = tmp_path_factory.mktemp("parallel_decoding")
    data = root / "data"
    write_synthetic_dataset(data, 8, image_size=32, n_val=2, n_test=12, n_compgen=2, progress=False, workers=1)
    ids = build_output_vocab(iter_captions(DataConfig(path=str(data)), split="test"))
    paths = {}
    for objective in ("mdc", "arc"):
        torch.manual_seed(0)
        cfg = RunConfig(model=micro_config(output_vocab="corpus", output_vocab_size=len(ids)),
                        objective=ObjectiveConfig(name=objective), sampler=SamplerConfig(length=LENGTH))
        save_checkpoint(root / objective, 1, cfg, create_model(cfg, objective, ids))
        paths[objective] = str(root / objective)
    return {"data": str(data), "vocab": len(ids), **paths}


def test_settings_and_their_validation():
    assert decoding_settings(6, ks=(1, 2, 3), thresholds=(0.9, 0.5)) == [
        ("greedy", 1, 0.0), ("k=2", 2, 0.0), ("k=3", 3, 0.0), ("τ=0.9", 1, 0.9), ("τ=0.5", 1, 0.5)]
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        decoding_settings(6, thresholds=(0.0,))
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        decoding_settings(6, thresholds=(1.5,))
    with pytest.raises(ValueError, match=r"\[1, N'=6\]"):
        decoding_settings(6, ks=(7,))
    with pytest.raises(ValueError, match=r"\[1, N'=6\]"):
        decoding_settings(6, ks=(0,))


def test_steps_accuracies_and_figure(runs, tmp_path):
    # a threshold <= 1/V is met by every position's top token (max prob >= 1/V): one step per caption
    low = 0.5 / runs["vocab"]
    result = decoding_curve(runs["mdc"], runs["data"], ks=(1, 2), thresholds=(0.9, low), limit=10, batch_size=4,
                            progress=False)
    assert result["length"] == LENGTH and result["n_images"] == 10
    rows = {r["setting"]: r for r in result["results"]}
    assert list(rows) == ["greedy", "k=2", "τ=0.9", f"τ={low:g}"]
    assert rows["greedy"]["mean_steps"] == rows["greedy"]["max_steps"] == LENGTH
    assert rows["k=2"]["mean_steps"] == rows["k=2"]["max_steps"] == math.ceil(LENGTH / 2)
    assert 1 <= rows["τ=0.9"]["mean_steps"] <= rows["τ=0.9"]["max_steps"] <= LENGTH
    assert rows[f"τ={low:g}"]["mean_steps"] == 1
    assert rows["greedy"]["mean_batch_steps"] == LENGTH and rows[f"τ={low:g}"]["mean_batch_steps"] == 1
    assert rows["τ=0.9"]["mean_steps"] <= rows["τ=0.9"]["mean_batch_steps"] <= LENGTH  # a batch waits for its slowest
    for r in result["results"]:
        assert r["captions_per_s"] > 0 and r["CIDEr"] is not None and r["CIDEr"] >= 0
        if result["n_single_object"]:
            assert 0 <= r["colour_shape_accuracy"] <= r["colour_accuracy"] <= 1
    assert result["table"].count("\n") == 1 + len(rows)
    png = plot_decoding_curve(result, tmp_path / "curve.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_cli_writes_json_and_png_and_rejects_bad_input(runs, tmp_path, capsys):
    out = tmp_path / "eval"
    base = ["eval", "parallel-decoding", "--data", runs["data"], "--limit", "4", "--batch-size", "4",
            "--out", str(out), "--quiet"]
    assert main([*base, "--run", runs["mdc"], "--ks", "1,5", "--thresholds", "0.5", "--length", "5"]) == 0
    result = json.loads((out / "parallel_decoding.json").read_text())
    assert [r["setting"] for r in result["results"]] == ["greedy", "k=5", "τ=0.5"]
    assert result["results"][1]["mean_steps"] == 1
    assert (out / "parallel_decoding.png").read_bytes()[:4] == b"\x89PNG"
    assert "colour+shape acc" in capsys.readouterr().out

    for extra, message in ((["--thresholds", "0"], "(0, 1]"), (["--thresholds", "1.2"], "(0, 1]"),
                           (["--thresholds", "high"], "--thresholds"), (["--ks", "6"], "N'=5"),
                           (["--ks", "0"], "N'=5"), (["--length", "30"], "caption length"),  # over this run's 22
                           (["--length", "99"], "--length must be in [1, 75], got 99")):  # over sampler.length's range
        assert main([*base, "--run", runs["mdc"], *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (extra, err)
    assert main([*base, "--run", runs["arc"]]) == 2
    err = capsys.readouterr().err
    assert "arc run" in err and "masked-diffusion" in err and err.count("\n") == 1
