"""`mdc eval captioning --finetune-steps N` keys its fine-tune cache by what made it: the source run's weights, the
fine-tuning data and the settings. Evaluating r1 then r2 into one --out gives r2's numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mdc_core.checkpoint import latest_checkpoint, save_checkpoint
from mdc_core.config import ObjectiveConfig, RunConfig
from mdc_core.model import Captioner
from mdc_workbench.eval import captioning as cap

from .test_eval_captioning import karpathy  # noqa: F401  (a fixture)
from .test_eval_compositionality import micro_config

FT = ["train.batch_size=2", 'train.device="cpu"']


def seeded_run(folder: Path, seed: int) -> Path:
    """A micro MDC run folder (one checkpoint, no training) whose weights depend on `seed`."""
    torch.manual_seed(seed)
    cfg = RunConfig(model=micro_config(), objective=ObjectiveConfig(name="mdc"))
    save_checkpoint(folder, 0, cfg, Captioner(cfg.model))
    return folder


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(str(latest_checkpoint(run) / "model.safetensors"))


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def evaluate(run: Path, data: Path, out: Path) -> dict:
    return cap.captioning([run], data, lengths=[4], metrics=["BLEU"], finetune_steps=2, finetune_overrides=FT,
                          out=out, progress=False)


def test_evaluating_r1_then_r2_into_one_out_fine_tunes_r2(tmp_path: Path, karpathy: Path) -> None:  # noqa: F811
    r1, r2 = seeded_run(tmp_path / "r1" / "run", 1), seeded_run(tmp_path / "r2" / "run", 2)
    out = tmp_path / "eval"
    first = Path(evaluate(r1, karpathy, out)["results"][0]["finetuned_run"])
    second = Path(evaluate(r2, karpathy, out)["results"][0]["finetuned_run"])
    assert first != second and first.parent == second.parent == out / "finetune"
    assert distance(weights(second), weights(r2)) < 0.01 < distance(weights(second), weights(r1))
    made_from = json.loads((second / cap.FINETUNE_SOURCE).read_text())
    assert made_from["source_run"] == str(r2.resolve()) and second.name.endswith(made_from["key"])
    log = (first / "metrics.jsonl").read_text()
    assert Path(evaluate(r1, karpathy, out)["results"][0]["finetuned_run"]) == first  # the same source: reused
    assert (first / "metrics.jsonl").read_text() == log


def test_other_data_or_settings_get_another_fine_tune(tmp_path: Path, karpathy: Path) -> None:  # noqa: F811
    run = seeded_run(tmp_path / "run", 1)
    out = tmp_path / "ft"
    base = cap.finetune(run, karpathy, out, 2, overrides=FT, progress=False, key_in_name=True)
    lr = cap.finetune(run, karpathy, out, 2, overrides=[*FT, "train.lr=0.01"], progress=False, key_in_name=True)
    other = json.loads(karpathy.read_text())
    other["images"][0]["sentences"][0]["raw"] = "two green stars"  # one caption changed: other data
    changed = karpathy.with_name("changed.json")
    changed.write_text(json.dumps(other))
    data = cap.finetune(run, changed, out, 2, overrides=FT, progress=False, key_in_name=True)
    assert len({base, lr, data}) == 3


def test_a_folder_holding_another_fine_tune_is_refused_not_reused(tmp_path: Path, karpathy: Path) -> None:  # noqa: F811
    r1, r2 = seeded_run(tmp_path / "r1", 1), seeded_run(tmp_path / "r2", 2)
    out = cap.finetune(r1, karpathy, tmp_path / "ft", 2, overrides=FT, progress=False)
    log = (out / "metrics.jsonl").read_text()
    with pytest.raises(ValueError, match=r"holds a fine-tune of .*r1 .*not a fine-tune of .*r2"):
        cap.finetune(r2, karpathy, out, 2, overrides=FT, progress=False)
    (out / cap.FINETUNE_SOURCE).unlink()  # a folder of unknown origin (an older cache) is not trusted either
    with pytest.raises(ValueError, match="without a readable finetune_source.json"):
        cap.finetune(r1, karpathy, out, 2, overrides=FT, progress=False)
    assert (out / "metrics.jsonl").read_text() == log
