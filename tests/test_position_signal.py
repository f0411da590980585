"""Visual signal by caption position: hand-computed values, an image-blind model, shapes, the CLI."""

import json
import math

import pytest
import torch
from torch import nn

from mdc_core.checkpoint import save_checkpoint
from mdc_core.cli import main
from mdc_core.config import DataConfig, ObjectiveConfig, RunConfig
from mdc_core.data import iter_captions, write_synthetic_dataset
from mdc_core.eval.position_signal import caption_fades, position_signal, repeat_fades
from mdc_core.factory import create_model
from mdc_core.tokenizer import EMBED_SIZE, EOT_ID, PAD_ID, SOT_ID, CaptionTokenizer, build_output_vocab

from .conftest import micro_config


class ImageScoresTokenOne(nn.Module):
    """A 4-token 'captioner' whose logits ignore the text: logit[1] = the image's mean pixel, the rest 0."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal
        self.dummy = nn.Parameter(torch.zeros(()))
        self.register_buffer("output_index", torch.arange(EMBED_SIZE))

    def encode_image(self, images):
        return images.mean(dim=(1, 2, 3))[:, None, None]  # (B, 1, 1)

    def decode(self, tokens, image_tokens, select=None, causal=None):
        logits = torch.zeros(*tokens.shape, 4)
        logits[..., 1] = image_tokens[:, 0, 0][:, None]  # (B, L)
        return logits if select is None else logits[select]


def ce(a: float, target: int) -> float:
    """CE of `target` under logits (0, a, 0, 0)."""
    z = math.exp(a) + 3
    return -math.log((math.exp(a) if target == 1 else 1.0) / z)


def fixed_batch():
    images = torch.stack([torch.full((3, 4, 4), 2.0), torch.zeros(3, 4, 4)])  # mean pixels a0 = 2, a1 = 0
    tokens = torch.tensor([[SOT_ID, 1, 2, EOT_ID, PAD_ID],
                           [SOT_ID, 1, EOT_ID, PAD_ID, PAD_ID]])
    return images, tokens


@pytest.mark.parametrize("causal", [True, False])
def test_hand_computed_tiny_case(causal):
    model = ImageScoresTokenOne(causal)
    result = position_signal(model, [fixed_batch()], ratios=[1.0])
    assert result.mode == ("teacher_forcing" if causal else "masked") and result.n_captions == 2
    (curve,) = result.curves
    assert curve.count == [2, 1]
    # position 0: both captions say token 1; caption 0 sees a=2 (true) / a=0 (rolled), caption 1 the reverse
    assert curve.loss_true[0] == pytest.approx((ce(2, 1) + ce(0, 1)) / 2)
    assert curve.signal[0] == pytest.approx(0.0, abs=1e-9)
    # position 1: only caption 0, token 2, true image a=2, mismatched a=0
    assert curve.loss_true[1] == pytest.approx(ce(2, 2))
    assert curve.loss_mismatched[1] == pytest.approx(ce(0, 2))
    assert curve.signal[1] == pytest.approx(math.log(4) - math.log(math.exp(2) + 3))
    assert curve.mean_signal == pytest.approx(curve.signal[1] / 3)
    # per caption: caption 0 scores positions 0 and 1 (late minus early); caption 1 only position 0 -> 0.0
    sig0 = ce(0, 1) - ce(2, 1)
    sig1 = ce(0, 2) - ce(2, 2)
    assert result.caption_fades == pytest.approx([sig1 - sig0, 0.0])
    assert result.repeat_fades == [None, None]  # no caption names a token twice


def test_caption_fades_by_hand():
    # caption 0: positions 0, 1, 2 with signals 3, 1, (0 and 2 over two draws -> 1): late [1, 1] - early [3] = -2
    # caption 1: one position -> None; caption 2: nothing scored -> None
    caption = torch.tensor([0, 0, 0, 0, 1])
    pos = torch.tensor([0, 1, 2, 2, 4])
    signal = torch.tensor([3.0, 1.0, 0.0, 2.0, 5.0])
    assert caption_fades(caption, pos, signal, 3) == [pytest.approx(-2.0), None, None]
    assert caption_fades(caption[:0], pos[:0], signal[:0], 2) == [None, None]


def test_repeat_fades_by_hand():
    # caption 0: word 5 at positions 0, 2, 3 (signals 2, 0.5, 1.5) -> later mean 1.0 - first 2.0 = -1; word 7 once
    # caption 1: word 9 at position 1 (signal 1) and at position 4 twice (draws 3 and 5 -> 4): 4 - 1 = +3
    # caption 2: two different words -> None
    caption = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2])
    pos = torch.tensor([0, 1, 2, 3, 1, 4, 4, 0, 1])
    token = torch.tensor([5, 7, 5, 5, 9, 9, 9, 5, 7])
    signal = torch.tensor([2.0, 1.0, 0.5, 1.5, 1.0, 3.0, 5.0, 9.0, 9.0])
    assert repeat_fades(caption, pos, token, signal, 3) == [pytest.approx(-1.0), pytest.approx(3.0), None]
    # only word 5 followed: caption 1 has no repeat of it
    assert repeat_fades(caption, pos, token, signal, 3, torch.tensor([5])) == [pytest.approx(-1.0), None, None]
    # two repeated words in one caption: the mean of their differences
    two = repeat_fades(torch.zeros(4, dtype=torch.long), torch.tensor([0, 1, 2, 3]), torch.tensor([5, 7, 5, 7]),
                       torch.tensor([2.0, 1.0, 0.0, 3.0]), 1)
    assert two == [pytest.approx(((0.0 - 2.0) + (3.0 - 1.0)) / 2)]


def test_repeat_fade_separates_a_copying_causal_model_from_a_masked_one():
    """A model that needs the image for a word's first mention but copies later mentions from the text it sees
    (what ARC can do) has a negative repeat fade; with a bidirectional view (MDC) either mention can be copied
    from the other, so first and later mentions look alike. The image says which word (+3: word 1, -3: word 2)."""

    class Copier(ImageScoresTokenOne):
        def decode(self, tokens, image_tokens, select=None, causal=None):
            causal = self.causal if causal is None else causal
            a = image_tokens[:, 0, 0][:, None].expand(tokens.shape)  # (B, L)
            logits = torch.zeros(*tokens.shape, 4)
            logits[..., 1], logits[..., 2] = a, -a
            for j in range(tokens.shape[1]):  # a visible copy of a word elsewhere makes that word certain
                for word in (1, 2):
                    if causal:
                        seen = (tokens[:, : j + 1] == word).any(dim=1)  # input column j predicts target j + 1
                    else:
                        seen = ((tokens == word) & (torch.arange(tokens.shape[1]) != j)).any(dim=1)
                    logits[seen, j, word] += 20.0
            return logits if select is None else logits[select]

    images = torch.stack([torch.full((3, 4, 4), 3.0), torch.full((3, 4, 4), -3.0)])
    tokens = torch.tensor([[SOT_ID, 1, 3, 1, EOT_ID], [SOT_ID, 2, 3, 2, EOT_ID]])
    causal = position_signal(Copier(True), [(images, tokens)], ratios=[1.0])
    masked = position_signal(Copier(False), [(images, tokens)], ratios=[0.5], draws=200)
    assert all(f is not None and f < -5.0 for f in causal.repeat_fades)  # first mention ~6 nats, repeat ~0
    assert all(f is not None and abs(f) < 1.0 for f in masked.repeat_fades)


def captions_batch(n=6, seed=0):
    texts = ["a red circle", "a blue square on the left", "two green stars at the top", "a small triangle",
             "a large yellow hexagon in the center", "a purple cross"][:n]
    images = torch.randn(n, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    return images, CaptionTokenizer(24)(texts)


def test_shapes_and_counts_of_a_masked_model(tiny_model):
    model = tiny_model(causal=False)
    images, tokens = captions_batch()
    lengths = ((tokens != PAD_ID) & (tokens != SOT_ID) & (tokens != EOT_ID)).sum(dim=1)  # no "!" in these captions
    result = position_signal(model, [(images, tokens)], ratios=[0.5, 1.0], draws=3, seed=1)
    assert [c.label for c in result.curves] == ["r=0.50", "r=1.00"]
    full = result.curves[1]
    assert len(full.signal) == int(lengths.max())
    assert full.count == [int((lengths > i).sum()) for i in range(int(lengths.max()))]  # r=1: every token, one draw
    half = result.curves[0]
    assert all(h <= 3 * f for h, f in zip(half.count, full.count, strict=False)) and sum(half.count) > 0
    again = position_signal(model, [(images, tokens)], ratios=[0.5, 1.0], draws=3, seed=1)
    assert again.curves[0].count == half.count  # seeded mask draws
    assert torch.allclose(torch.tensor(again.curves[0].signal), torch.tensor(half.signal), equal_nan=True)


def test_teacher_forcing_counts(tiny_model):
    model = tiny_model(causal=True)
    images, tokens = captions_batch()
    lengths = ((tokens != PAD_ID) & (tokens != SOT_ID) & (tokens != EOT_ID)).sum(dim=1)
    (curve,) = position_signal(model, [(images, tokens)]).curves
    assert curve.label == "teacher forcing"
    assert curve.count == [int((lengths > i).sum()) for i in range(int(lengths.max()))]
    assert all(math.isfinite(v) for v in curve.signal)


@pytest.mark.parametrize("causal", [True, False])
def test_a_model_that_ignores_the_image_has_no_signal(tiny_model, causal):
    model = tiny_model(causal=causal)
    with torch.no_grad():
        for layer in model.decoder.layers:  # cut the only path from the image to the text
            layer.cross_attn.proj.weight.zero_()
            layer.cross_attn.proj.bias.zero_()
    images, tokens = captions_batch()
    result = position_signal(model, [(images, tokens)], ratios=[0.25, 1.0], draws=2)
    for curve in result.curves:
        assert max(abs(v) for v in curve.signal) < 1e-5
        assert min(curve.loss_true) > 0


def test_bad_input(tiny_model):
    model = tiny_model()
    images, tokens = captions_batch()
    with pytest.raises(ValueError, match=">= 2 images"):
        position_signal(model, [(images[:1], tokens[:1])])
    with pytest.raises(ValueError, match="ratios"):
        position_signal(model, [(images, tokens)], ratios=[0.0])
    with pytest.raises(ValueError, match="no caption"):
        position_signal(model, [])


def test_cli_writes_json_and_plot_for_arc_and_mdc(tmp_path, capsys):
    data = tmp_path / "data"
    write_synthetic_dataset(data, 8, image_size=32, n_val=2, n_test=9, n_compgen=2, progress=False, workers=1)
    runs = []
    ids = build_output_vocab(iter_captions(DataConfig(path=str(data)), split="test"))  # small head: fast on CPU
    for objective in ("arc", "mdc", "clip"):
        torch.manual_seed(0)
        model_cfg = micro_config(context_length=40, output_vocab="corpus", output_vocab_size=len(ids))
        cfg = RunConfig(model=model_cfg, objective=ObjectiveConfig(name=objective))
        save_checkpoint(tmp_path / objective, 1, cfg, create_model(cfg, objective, ids))
        runs.append(str(tmp_path / objective))
    out = tmp_path / "eval"
    argv = ["eval", "position-signal", "--run", runs[0], "--run", runs[1], "--data", str(data), "--limit", "8",
            "--batch-size", "4", "--ratios", "0.5,1", "--draws", "2", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads((out / "position_signal.json").read_text())
    assert [r["mode"] for r in result["runs"]] == ["teacher_forcing", "masked"]
    assert [c["label"] for c in result["runs"][1]["curves"]] == ["r=0.50", "r=1.00"]
    assert all(r["n_captions"] == 8 for r in result["runs"])
    assert all(len(r["repeat_fades"]) == 8 for r in result["runs"]) and result["content_words"] is None
    assert (out / "position_signal.png").read_bytes()[:4] == b"\x89PNG"
    assert "mean" in capsys.readouterr().out
    assert main(["eval", "position-signal", "--run", runs[2], "--data", str(data), "--out", str(out)]) == 2
    assert "captioner" in capsys.readouterr().err
