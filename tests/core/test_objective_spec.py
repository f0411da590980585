"""The objective spec is the one place that knows an objective: its family, noise schedule, loss terms, label and
decoder (mdc_core.registry.ObjectiveSpec). A new objective is one registered row; every other file asks the spec."""

import argparse

import pytest
import torch

from mdc_core import registry
from mdc_core.config import ObjectiveConfig, RunConfig
from mdc_core.loss_step import HostBatches
from mdc_core.objectives import draw_masks, loss_terms
from mdc_core.registry import OBJECTIVES, FixedRatio, LinearSchedule, ObjectiveSpec, TeacherForcing, objective_spec
from mdc_core.tokenizer import EOT_ID, PAD_ID, SOT_ID
from mdc_workbench.cli import trajectory
from mdc_workbench.eval import captioning as cap
from mdc_workbench.eval.compositionality import check_methods, row_label
from mdc_workbench.eval.parity import expected_supervised_tokens

# a new objective, written here and nowhere else: half the caption tokens masked, predicted in one pass
HALF = ObjectiveSpec(causal=False, schedule=FixedRatio(), label="Half",
                     description="half of the caption tokens ({mask_ratio}) masked and predicted")


@pytest.fixture
def half(monkeypatch: pytest.MonkeyPatch) -> str:
    registry.load_plugins()  # so that the row is not mistaken for a missing plug-in's
    monkeypatch.setitem(OBJECTIVES, "half", HALF)
    return "half"


def test_families_and_decoders_of_the_core_rows() -> None:
    fam = {name: objective_spec(name).family for name in registry.CORE_OBJECTIVES}
    assert fam == {"mdc": "masked", "mdc_no_t": "masked", "cmlm": "masked", "mdc_cosine": "masked",
                   "bert": "masked", "parallel": "masked", "arc": "causal",
                   "clip": "contrastive"}  # CLIP's text tower is causal, but it is no captioner
    assert objective_spec("arc").decoder == "left_to_right" and objective_spec("clip").decoder == "none"
    assert objective_spec("mdc").decoder == "unmask" and objective_spec("d3pm").decoder == "ancestral"
    assert objective_spec("d3pm").family == "masked" and objective_spec("d3pm").display("d3pm") == "d3pm"
    assert [objective_spec(n).display(n) for n in ("mdc_no_t", "cmlm", "arc")] == [
        "MDC (w/o 1/t), per caption token", "CMLM (w/o 1/t, per masked token)", "ARC"]


def test_a_decoder_outside_the_list_and_a_captioner_without_schedule_are_refused() -> None:
    with pytest.raises(ValueError, match="objective decoder 'beam'"):
        ObjectiveSpec(causal=False, schedule=LinearSchedule(), decoder="beam")
    with pytest.raises(ValueError, match="names its noise schedule"):
        ObjectiveSpec(causal=False, schedule=None)
    with pytest.raises(ValueError, match="a contrastive one has none"):
        ObjectiveSpec(causal=True, schedule=TeacherForcing(), model="clip")


def test_loss_terms_by_hand() -> None:
    tokens = torch.tensor([[SOT_ID, 101, 102, 103, EOT_ID, PAD_ID], [SOT_ID, 104, EOT_ID, PAD_ID, PAD_ID, PAD_ID]])
    assert loss_terms(objective_spec("mdc"), tokens, "per_token") == 3 + 1  # maskable caption tokens
    assert loss_terms(objective_spec("mdc"), tokens, "per_sequence") == 2
    assert loss_terms(objective_spec("arc"), tokens, "per_token") == 4 + 2  # next-token targets incl. <eot>
    assert loss_terms(objective_spec("clip"), tokens, "per_token") == 2  # the batch
    # a per-masked-token objective counts the masked tokens it is given, and refuses to guess them
    mask = torch.zeros(2, 6, dtype=torch.bool)
    mask[0, 2] = mask[1, 1] = mask[0, 3] = True
    assert loss_terms(objective_spec("cmlm"), tokens, "per_token", mask=mask) == 3
    assert loss_terms(objective_spec("mdc_no_t"), tokens, "per_token", mask=mask) == 3 + 1  # caption tokens
    assert loss_terms(objective_spec("cmlm"), tokens, "per_sequence", mask=mask & (torch.arange(2) == 0)[:, None]
                                                   ) == 1  # only caption 0 has a masked token
    with pytest.raises(ValueError, match="divides its loss by the masked tokens"):
        loss_terms(objective_spec("cmlm"), tokens, "per_token")
    cfg = ObjectiveConfig(t_low=0.2, t_high=0.6, mask_ratio=0.25)
    assert objective_spec("mdc").expected_loss_terms([3, 1], cfg) == pytest.approx(0.4 * 4)
    assert objective_spec("bert").expected_loss_terms([3, 1], cfg) == 1.0
    assert objective_spec("arc").expected_loss_terms([3, 1], cfg) == 6 and \
        objective_spec("clip").expected_loss_terms([3, 1], cfg) == 0


def test_scoring_ratios_by_hand() -> None:
    assert objective_spec("mdc").schedule.scoring_ratios(ObjectiveConfig(t_low=0.0, t_high=0.8)) == (0.4, 0.8)  # 0 out
    assert objective_spec("parallel").schedule.scoring_ratios(ObjectiveConfig(mask_ratio=0.3)) == (1.0,)
    assert objective_spec("bert").schedule.scoring_ratios(ObjectiveConfig(mask_ratio=0.3)) == (0.3,)
    assert objective_spec("arc").schedule.scoring_ratios(ObjectiveConfig()) == ()
    # the cosine schedule's rates at t = 0.5, 0.75, 1: 1 - cos(pi t / 2)
    assert objective_spec("mdc_cosine").schedule.scoring_ratios(ObjectiveConfig()) == (0.2929, 0.6173, 1.0)


def test_a_new_objective_is_one_row_that_every_file_asks(half: str, tiny_model) -> None:
    cfg = RunConfig(objective=ObjectiveConfig(name=half, mask_ratio=0.5))
    tokens = torch.tensor([[SOT_ID, 101, 102, EOT_ID, PAD_ID]])
    assert HostBatches(tiny_model(), cfg.objective, torch.device("cpu"))(tokens, 0).terms == 2  # train.py
    assert expected_supervised_tokens([4, 2], cfg.objective) == 3.0  # eval/parity.py
    assert draw_masks(tokens[:, :4], cfg.objective, torch.Generator())[0].tolist() == [0.5]  # eval/central_claim.py
    assert check_methods(half, None) == ("mc", "heuristic")  # eval/compositionality.py
    assert row_label(half, "mc", cfg) == "Half r=0.5 (Monte Carlo)"
    with pytest.raises(ValueError, match="do not apply to a Half run"):
        check_methods(half, ["cosine"])
    assert cap.decoders_for(half, [7]) == ["mdc-7"]  # eval/captioning.py
    assert cap.decoder_label(half, "mdc-7") == ("Half", "7")
    args = argparse.Namespace(prompt=None, remask_threshold=None, remask_steps=None, gif=None, attention=False,
                              length=None, run="r")
    trajectory.check_args(args, half)  # cli: a confidence-unmasking run takes MDC's sampler flags


def test_a_new_contrastive_or_left_to_right_objective_is_routed_by_its_spec(monkeypatch: pytest.MonkeyPatch
                                                                             ) -> None:
    registry.load_plugins()
    monkeypatch.setitem(OBJECTIVES, "siglip", ObjectiveSpec(causal=True, schedule=None, model="clip", label="SigLIP"))
    monkeypatch.setitem(OBJECTIVES, "ltr", ObjectiveSpec(causal=True, schedule=TeacherForcing()))
    with pytest.raises(ValueError, match="a SigLIP run cannot caption images"):
        cap.decoders_for("siglip")
    assert check_methods("siglip", None) == ("cosine",) and row_label("siglip", "cosine") == "SigLIP"
    assert cap.decoders_for("ltr", beam=3) == ["greedy", "beam-3"]
    assert cap.decoder_label("ltr", "beam-3") == ("ltr (beam 3)", "-") and check_methods("ltr", None) == ("ar",)
