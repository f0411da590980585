"""The CLIP baseline: towers, temperature, contrastive loss, vocabulary, checkpoint round trip, CLI training."""

import json
import math

import pytest
import torch

from mdc_core.checkpoint import save_checkpoint
from mdc_core.config import ObjectiveConfig, RunConfig
from mdc_core.factory import CLIPModel, create_model, load_model
from mdc_core.objectives import clip_loss, compute_loss
from mdc_core.tokenizer import EOT_ID, CaptionTokenizer, build_output_vocab
from mdc_workbench.cli import main
from mdc_workbench.data import write_synthetic_dataset
from mdc_workbench.eval.probe_pool import probe_pool
from tests.conftest import MICRO, micro_config

CAPTIONS = ["a red circle", "a blue square on the left", "two green stars", "a small yellow triangle"]


def make_clip(seed: int = 0, vocab=None, **overrides) -> CLIPModel:
    torch.manual_seed(seed)
    cfg = micro_config(**overrides)
    if vocab is not None:
        cfg.output_vocab, cfg.output_vocab_size = "corpus", len(vocab)
    return CLIPModel(cfg, vocab_ids=vocab).eval()


def batch(n: int = 4, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 32, 32, generator=gen)
    return images, CaptionTokenizer(24)(CAPTIONS[:n])


def test_shapes_unit_norm_and_cls_probe_feature():
    model = make_clip()
    images, tokens = batch()
    with torch.no_grad():
        img, txt, scale = model(images, tokens)
        assert img.shape == txt.shape == (4, 32)
        assert torch.allclose(img.norm(dim=-1), torch.ones(4), atol=1e-5)
        assert torch.allclose(txt.norm(dim=-1), torch.ones(4), atol=1e-5)
        assert math.isclose(float(scale), 1 / 0.07, rel_tol=1e-5)
        assert torch.allclose(model.similarity(images, tokens), img @ txt.T, atol=1e-6)
        feats = model.pooled_features(images)
        assert torch.equal(feats, model.encode_image(images)[:, 0])  # the CLS / pre-logits token
    assert probe_pool("clip") == "cls" and probe_pool("mdc") == "gap"


def test_text_embedding_is_the_causal_eot_feature():
    model = make_clip()
    tokens = CaptionTokenizer(24)(["a red circle"])
    with torch.no_grad():
        full = model.encode_text(tokens)
        eot = int((tokens[0] == EOT_ID).nonzero()[0])
        trimmed = model.encode_text(tokens[:, :eot + 1])  # no pads at all: the same embedding
        after = tokens.clone()
        after[0, eot + 1:] = 320  # change what follows <eot>: invisible under the causal mask
        changed = tokens.clone()
        changed[0, 2] = 1746  # another word before <eot>: must matter
        assert torch.allclose(full, trimmed, atol=1e-5)
        assert torch.allclose(full, model.encode_text(after), atol=1e-6)
        assert not torch.allclose(full, model.encode_text(changed), atol=1e-3)
    with pytest.raises(ValueError, match="<eot>"):
        model.encode_text(torch.full((1, 5), 320))
    with pytest.raises(ValueError, match="context_length"):
        model.encode_text(torch.full((1, 30), EOT_ID))


def test_logit_scale_clamped_at_100():
    model = make_clip()
    with torch.no_grad():
        model.logit_scale.fill_(10.0)  # exp(10) > 100
    assert math.isclose(float(model.scale().detach()), 100.0, rel_tol=1e-5)


def test_clip_loss_matches_hand_computation_and_trains_every_part():
    model = make_clip().train()
    images, tokens = batch()
    out = clip_loss(model, images, tokens, ObjectiveConfig(name="clip"))
    loss, metrics = out.loss, out.metrics
    with torch.no_grad():
        img, txt, s = model(images, tokens)
        logits = s * img @ txt.T  # (B, B)
        n = len(logits)
        log_p_img = logits - logits.logsumexp(dim=1, keepdim=True)  # image -> its caption
        log_p_txt = logits - logits.logsumexp(dim=0, keepdim=True)  # caption -> its image
        expected = -(sum(log_p_img[i, i] for i in range(n)) + sum(log_p_txt[i, i] for i in range(n))) / (2 * n)
    assert math.isclose(float(loss.detach()), float(expected), rel_tol=1e-5)
    assert 0.0 <= float(metrics["acc_retrieval"]) <= 1.0 and "acc_masked" not in metrics
    loss.backward()
    for name in ("logit_scale", "image_proj.weight", "text.text_projection", "text.token_embedding.weight"):
        assert model.get_parameter(name).grad is not None and model.get_parameter(name).grad.abs().sum() > 0, name
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.encoder.parameters())


def test_compute_loss_dispatches_clip_and_a_few_steps_lower_the_loss():
    model = make_clip().train()
    images, tokens = batch()
    cfg = ObjectiveConfig(name="clip")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = compute_loss(model, images, tokens, cfg).loss.detach()
    for _ in range(15):
        out = compute_loss(model, images, tokens, cfg)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    assert float(compute_loss(model, images, tokens, cfg).loss.detach()) < float(first) - 0.1


def test_corpus_vocabulary_rows_and_unknown_words():
    tok = CaptionTokenizer(24)
    vocab = build_output_vocab(CAPTIONS, tok)
    model = make_clip(vocab=vocab)
    assert model.text.token_embedding.num_embeddings == len(vocab) + 3  # corpus ids, <sot>, [MASK], pad
    with torch.no_grad():
        assert model.encode_text(tok(CAPTIONS)).shape == (4, 32)
    with pytest.raises(ValueError, match="corpus vocabulary"):
        model.encode_text(tok(["a purple elephant"]))


def test_factory_and_checkpoint_round_trip(tmp_path):
    vocab = build_output_vocab(CAPTIONS, CaptionTokenizer(24))
    cfg = RunConfig(model=micro_config(output_vocab="corpus", output_vocab_size=len(vocab)),
                    objective=ObjectiveConfig(name="clip"))
    torch.manual_seed(0)
    model = create_model(cfg, "clip", vocab).eval()
    assert isinstance(model, CLIPModel)
    save_checkpoint(tmp_path, 3, cfg, model)
    loaded, loaded_cfg = load_model(tmp_path)
    assert isinstance(loaded, CLIPModel) and loaded_cfg.objective.name == "clip"
    assert torch.equal(loaded.vocab_ids, vocab)
    images, tokens = batch()
    with torch.no_grad():
        assert torch.equal(model.similarity(images, tokens), loaded.similarity(images, tokens))
        assert torch.equal(model.pooled_features(images), loaded.pooled_features(images))


def test_dropout_is_refused_not_ignored():
    with pytest.raises(ValueError, match="dropout"):
        make_clip(dropout=0.1)


def test_cli_trains_a_micro_clip_run(tmp_path, capsys):
    data = tmp_path / "data"
    write_synthetic_dataset(data, 32, image_size=32, n_val=4, n_test=4, n_compgen=4, progress=False, workers=1)
    sets = [f"model.{k}={json.dumps(v)}" for k, v in MICRO.items()]
    sets += ["model.output_vocab=corpus", "train.batch_size=8", "train.warmup_steps=1", "train.log_every=1"]
    argv = ["train", "--objective", "clip", "--data", str(data), "--out", str(tmp_path / "run"), "--steps", "3",
            "--quiet"]
    for item in sets:
        argv += ["--set", item]
    assert main(argv) == 0
    assert "trained 3 steps" in capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3 and all(math.isfinite(r["loss"]) for r in records)
    model, cfg = load_model(tmp_path / "run")
    assert isinstance(model, CLIPModel) and cfg.objective.name == "clip"
    assert cfg.model.output_vocab_size == len(model.vocab_ids) > 0


def test_captioner_only_tools_get_a_clear_error():
    model = make_clip()
    images, tokens = batch()
    with pytest.raises(ValueError, match="no caption decoder"):
        model.decode(tokens, model.encode_image(images))
