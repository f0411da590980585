"""``mdc score`` and ``mdc sample --length auto / --threshold`` on micro run folders (saved, never trained)."""

import json

import pytest
import torch
from PIL import Image

from mdc_core.checkpoint import save_checkpoint
from mdc_core.config import ObjectiveConfig, RunConfig, SamplerConfig
from mdc_core.factory import create_model
from mdc_core.tokenizer import build_output_vocab
from mdc_workbench.cli import main
from tests.conftest import micro_config

CAPTIONS = ["a red circle", "a blue square", "two green stars left of a red circle"]


def make_run(path, objective):
    ids = build_output_vocab(CAPTIONS)
    model_cfg = micro_config(output_vocab="corpus", output_vocab_size=len(ids))
    cfg = RunConfig(model=model_cfg, objective=ObjectiveConfig(name=objective), sampler=SamplerConfig(length=4))
    torch.manual_seed(0)
    model = create_model(cfg, objective, output_ids=ids)
    with torch.no_grad():
        model.decoder.head.weight.mul_(20.0)  # confident enough for --threshold to reveal several tokens at once
    save_checkpoint(path, 1, cfg, model)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("score_cli")
    image = root / "img.png"
    Image.fromarray((torch.rand(32, 32, 3) * 255).byte().numpy()).save(image)
    return {"mdc": make_run(root / "mdc", "mdc"), "arc": make_run(root / "arc", "arc"), "image": image}


def run_json(argv, capsys):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("objective,method", [("mdc", "heuristic"), ("mdc", "mc"), ("mdc", "ar"), ("arc", "ar")])
def test_score_json(runs, objective, method, capsys):
    argv = ["score", "--run", str(runs[objective]), "--image", str(runs["image"]), "--method", method,
            "--samples", "64", "--json"]
    for c in CAPTIONS:
        argv += ["--caption", c]
    rows = run_json(argv, capsys)
    assert [r["caption"] for r in rows] == CAPTIONS
    assert all(isinstance(r["score"], float) and r["score"] < 0 for r in rows)
    assert all(("stderr" in r) == (method == "mc") for r in rows)
    again = run_json(argv, capsys)  # seeded: the same numbers every time
    assert [r["score"] for r in again] == [r["score"] for r in rows]


def test_score_table_marks_the_best(runs, capsys):
    assert main(["score", "--run", str(runs["mdc"]), "--image", str(runs["image"]), "--method", "heuristic",
                 "--caption", CAPTIONS[0], "--caption", CAPTIONS[1]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("*") for line in lines) == 1 and "heuristic scores" in lines[-1]


@pytest.mark.parametrize("objective,argv,message", [
    ("arc", ["--method", "mc", "--caption", "a red circle"], "needs a MDC model"),
    ("mdc", ["--method", "heuristic", "--caption", " ".join(["circle"] * 40)], "context holds 22"),
    ("mdc", ["--method", "heuristic", "--caption", "a purple circle"], "output vocabulary"),
    ("mdc", ["--method", "heuristic", "--caption", "   "], "empty after tokenization"),
])
def test_score_user_errors(runs, objective, argv, message, capsys):
    assert main(["score", "--run", str(runs[objective]), "--image", str(runs["image"]), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mdc: error:") and message in err


def test_sample_auto_length_and_threshold(runs, capsys):
    base = ["sample", "--run", str(runs["mdc"]), "--image", str(runs["image"]), "--json"]
    rec = run_json(base + ["--length", "auto", "--auto-range", "2-5"], capsys)
    cands = rec["candidates"]
    assert [c["length"] for c in cands] == [2, 3, 4, 5]
    best = max(cands, key=lambda c: c["normalized_score"])
    assert rec["length"] == best["length"] and rec["caption"] == best["caption"]
    assert len(rec["tokens"]) == rec["length"]
    for c in cands:
        assert c["normalized_score"] == pytest.approx(c["score"] / c["length"], rel=1e-5)
    fixed = run_json(base + ["--length", "5"], capsys)
    fast = run_json(base + ["--length", "5", "--threshold", "0.3"], capsys)
    assert len(fixed["steps"]) == 5 and len(fast["steps"]) < 5  # confident tokens revealed together
    assert len(fast["tokens"]) == 5 and fast["settings"]["threshold"] == 0.3
    assert main(base + ["--length", "auto", "--auto-range", "3-40"]) == 2
    assert "1..22" in capsys.readouterr().err
