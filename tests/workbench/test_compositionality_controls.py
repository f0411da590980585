"""Controls of the compositionality table: blind rows (the mean image instead of the image), per-token
(length-normalised) rows, and a markdown table whose separator has as many cells as its header."""

import json

import pytest
import torch

from mdc_core.factory import load_model
from mdc_core.tokenizer import CaptionTokenizer
from mdc_workbench.cli import main
from mdc_workbench.eval import compositionality as comp
from mdc_workbench.eval.composition_sets import load_benchmark
from tests.workbench.test_eval_compositionality import make_run, sugarcrepe_dir  # noqa: F401 - a fixture


def _cells(line: str) -> int:
    return line.strip().strip("|").count("|") + 1


@pytest.mark.parametrize("columns", [{}, {"add": 1.0, "swap": 0.5}])
def test_table_separator_has_as_many_cells_as_the_header(columns):
    results = [{"run": "r", "method": "mc", "label": "MDC (Monte Carlo)", "columns": columns}]
    head, sep, row = comp.compositionality_table(results).splitlines()
    assert _cells(head) == _cells(sep) == _cells(row) == 2 + len(columns)


def test_blind_rows_score_the_mean_image_and_per_token_rows_divide_by_the_token_count(
        tmp_path, sugarcrepe_dir, monkeypatch):  # noqa: F811
    seen = []

    def scorer(model, image, captions, tokens, **kw):
        seen.append(image.clone())
        return [-float(len(c)) for c in captions], [0.5] * len(captions)  # shorter caption = higher score

    monkeypatch.setitem(comp.SCORERS, "heuristic", scorer)
    model, cfg = load_model(make_run(tmp_path))
    examples = load_benchmark("sugarcrepe", sugarcrepe_dir)
    raw, per = comp.evaluate_model(model, cfg, examples, ["heuristic"], progress=False, length_norm=True)
    assert all(float(im.abs().sum()) > 0 for im in seen)
    assert raw["label"] == "MDC (Heuristic)" and per["label"] == "MDC (Heuristic, per token)" and per["per_token"]
    tok = CaptionTokenizer(cfg.model.context_length)
    first = per["examples"][0]  # "a dog on a sofa" (15 chars, 5 tokens) vs "a dog and a cat on a sofa" (25, 8)
    assert [len(tok.encode_text(c)) for c in first["captions"]] == [5, 8]
    assert first["scores"] == pytest.approx([-15 / 5, -25 / 8]) and first["stderr"] == pytest.approx([0.1, 0.0625])
    assert raw["columns"]["add"] == 1.0 and per["columns"]["add"] == 1.0  # -3.0 > -3.125

    seen.clear()
    (blind,) = comp.evaluate_model(model, cfg, examples, ["heuristic"], progress=False, blind=True)
    assert len(seen) == 3 and all(float(im.abs().max()) == 0 for im in seen)  # the mean image normalises to 0
    assert blind["label"] == "MDC (Heuristic), blind" and blind["blind"]


def test_an_untrained_model_passes_sugarcrepe_add_blind(tmp_path, sugarcrepe_dir):  # noqa: F811
    """The finding the blind row exposes: "add" negatives are longer, and a likelihood prefers short text."""
    torch.manual_seed(0)
    result = comp.compositionality([make_run(tmp_path)], "sugarcrepe", sugarcrepe_dir, methods=["mc"], samples=64,
                                   progress=False)
    (blind,) = result["blind"]
    assert blind["columns"]["add"] == 1.0 and blind["label"] == "MDC (Monte Carlo), blind"
    assert "| MDC (Monte Carlo), blind |" in result["table"]


def test_cli_prints_blind_and_per_token_rows(tmp_path, sugarcrepe_dir, capsys):  # noqa: F811
    run = make_run(tmp_path)
    argv = ["eval", "compositionality", "--run", str(run), "--data", str(sugarcrepe_dir), "--benchmark",
            "sugarcrepe", "--methods", "heuristic", "--length-norm", "--out", str(tmp_path / "eval"), "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    for label in ("MDC (Heuristic)", "MDC (Heuristic, per token)", "MDC (Heuristic), blind",
                  "MDC (Heuristic, per token), blind"):
        assert f"| {label} |" in printed, label
    saved = json.loads((tmp_path / "eval" / "compositionality_sugarcrepe.json").read_text())
    assert [r["label"] for r in saved["blind"]] == ["MDC (Heuristic), blind", "MDC (Heuristic, per token), blind"]
    assert main([*argv, "--no-blind"]) == 0
    assert ", blind |" not in capsys.readouterr().out
