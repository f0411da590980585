"""`mdc eval objects`: object-naming accuracy at every checkpoint of a run, its table, figure, CLI and errors."""

import csv
import json

import pytest
import torch
from PIL import Image

from mdc_core.checkpoint import save_checkpoint
from mdc_core.config import DataConfig, ObjectiveConfig, RunConfig, SamplerConfig
from mdc_core.data import build_loader, iter_captions
from mdc_core.factory import create_model, load_model
from mdc_core.tokenizer import build_output_vocab
from mdc_workbench.cli import main
from mdc_workbench.data import write_synthetic_dataset
from mdc_workbench.eval.object_curve import curve_table, object_accuracy_curve, plot_object_curves
from mdc_workbench.eval.report import caption_report
from tests.conftest import micro_config

STEPS = (2, 5)  # checkpoint steps of the MDC run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An MDC run with checkpoints at steps 2 and 5 (different random weights), an ARC run, 16 test images."""
    root = tmp_path_factory.mktemp("object_curve")
    data = root / "data"
    write_synthetic_dataset(data, 8, image_size=32, n_val=2, n_test=16, n_compgen=2, progress=False, workers=1)
    ids = build_output_vocab(iter_captions(DataConfig(path=str(data)), split="test"))
    out = {"data": str(data)}
    for objective, steps in (("mdc", STEPS), ("arc", (1,))):
        cfg = RunConfig(model=micro_config(output_vocab="corpus", output_vocab_size=len(ids)),
                        objective=ObjectiveConfig(name=objective), sampler=SamplerConfig(length=4))
        cfg.data.path = str(data)
        for step in steps:
            torch.manual_seed(step)
            save_checkpoint(root / objective, step, cfg, create_model(cfg, objective, ids), keep_last=5)
        out[objective] = str(root / objective)
    return out


def _single_objects(data: str, limit: int) -> int:
    """Single-object scenes among the first `limit` test images, counted from the labels by hand."""
    loader = build_loader(DataConfig(path=data), split="test", image_size=32, batch_size=64, shuffle=False,
                          drop_last=False)
    metas = [m for batch in loader for m in batch["meta"]][:limit]
    return sum(m["labels"]["count"] == 1 for m in metas)


def test_every_checkpoint_and_length_matches_caption_report(runs):
    result = object_accuracy_curve(runs["mdc"], lengths=(3, 5), limit=12, batch_size=5, progress=False)
    assert [(p["step"], p["length"]) for p in result["points"]] == [(2, 3), (2, 5), (5, 3), (5, 5)]
    assert result["data"] == runs["data"]  # the run's own data.path by default
    n_single = _single_objects(runs["data"], 12)
    assert n_single > 0
    for point in result["points"]:
        assert point["n_single_object"] == n_single
        model, cfg = load_model(f"{runs['mdc']}/checkpoints/step_{point['step']:08d}")
        direct = caption_report(model, cfg.data, SamplerConfig(length=point["length"]), limit=12, progress=False)
        assert point["accuracy"] == direct["single_object_accuracy"]
    assert len(result["examples"]) == 12 and all(len(r["caption"].split()) <= 5 for r in result["examples"])
    default = object_accuracy_curve(runs["mdc"], data=runs["data"], limit=12, progress=False)
    assert [p["length"] for p in default["points"]] == [4, 4]  # the run's sampler.length


def test_table_and_figure(runs, tmp_path):
    fake = {"run": "r", "points": [{"step": 500, "length": 10, "accuracy": 0.25, "n_single_object": 136},
                                   {"step": 1000, "length": 10, "accuracy": 0.5, "n_single_object": 136},
                                   {"step": 1000, "length": 4, "accuracy": 1.0, "n_single_object": 136}]}
    assert curve_table(fake).splitlines() == [
        "| step | N'=4 | N'=10 |", "|---|---|---|", "| 500 | - | 25.0% of 136 |",
        "| 1000 | 100.0% of 136 | 50.0% of 136 |"]
    png = plot_object_curves([fake, {**fake, "label": "another run"}], tmp_path / "f" / "curve.png")
    assert png.stat().st_size > 5000 and Image.open(png).size[0] > 500


def test_cli_writes_json_and_png(runs, tmp_path, capsys):
    out = tmp_path / "eval"
    assert main(["eval", "objects", "--run", runs["mdc"], "--lengths", "4", "--limit", "8", "--out", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "| step | N'=4 |" in printed and "objects.png" in printed
    saved = json.loads((out / "objects.json").read_text())
    assert [p["step"] for p in saved["runs"][0]["points"]] == list(STEPS)
    assert (out / "objects.png").stat().st_size > 5000


def test_errors_name_the_problem(runs, tmp_path, capsys):
    with pytest.raises(ValueError, match="arc run.*MDC-family"):
        object_accuracy_curve(runs["arc"], progress=False)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        object_accuracy_curve(tmp_path, progress=False)
    with pytest.raises(ValueError, match=">= 1"):
        object_accuracy_curve(runs["mdc"], lengths=(0,), progress=False)
    # captions without the embedded labels: nothing to check colour and shape against
    Image.new("RGB", (32, 32), (200, 0, 0)).save(tmp_path / "red.png")
    with open(tmp_path / "pairs.csv", "w", newline="") as f:
        csv.writer(f).writerows([["image", "caption"], ["red.png", "a red square"]])
    with pytest.raises(ValueError, match="no single-object scenes"):
        object_accuracy_curve(runs["mdc"], data=tmp_path / "pairs.csv", split="train", progress=False)
    assert main(["eval", "objects", "--run", str(tmp_path / "nothing"), "--quiet"]) != 0
    assert "no complete checkpoint" in capsys.readouterr().err
