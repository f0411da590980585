"""MC-Diffusion pieces: guidance (CFG / masked condition strategy), the VQ-VAE encoder, the D3PM loss and sampler."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from mdc_core.config import ConfigError, ObjectiveConfig, RunConfig, SamplerConfig, load_preset
from mdc_core.objectives import compute_loss
from mdc_core.sampler import sample
from mdc_core.tokenizer import EOT_ID, MASK_ID, SOT_ID, CaptionTokenizer
from mdc_workbench.masked_conditional.diffusion import d3pm_loss, d3pm_sample, state_table
from mdc_workbench.masked_conditional.guidance import (
    GuidanceConfig,
    GuidedCaptioner,
    condition_mask_value,
    corrupt_condition,
    guided_log_probs,
)
from mdc_workbench.masked_conditional.vqvae import (
    VQVAE,
    VQImageEncoder,
    VQVAEConfig,
    load_vqvae,
    save_vqvae,
    vqvae_encoder_kwargs,
)
from tests.conftest import micro_config

VQ = dict(image_size=32, channels=8, downsample=2, codebook_size=16, code_dim=4, token_width=16)


# ---------------------------------------------------------------------------------------------------- guidance


def test_guided_log_probs_follow_the_paper_definitions():
    cond = torch.tensor([[2.0, 0.0, -1.0]])
    ref = torch.tensor([[0.0, 1.0, 0.0]])
    lc, lr = cond.log_softmax(-1), ref.log_softmax(-1)
    torch.testing.assert_close(guided_log_probs(cond, ref, "cfg", 3.0), 3 * lc - 2 * lr)  # (1-w) p(x) + w p(x|y)
    torch.testing.assert_close(guided_log_probs(cond, ref, "mcs", 3.0), 3 * lr - 2 * lc)  # w p(x|y_M) + (1-w) p(x|y)
    torch.testing.assert_close(guided_log_probs(cond, ref, "mcs_cfg", 3.0), 3 * lc - 2 * lr)
    torch.testing.assert_close(guided_log_probs(cond, ref, "cfg", 1.0), lc)  # w = 1: the conditional model
    torch.testing.assert_close(guided_log_probs(cond, ref, "mcs", 1.0), lr)  # w = 1: the partially masked model
    with pytest.raises(ValueError, match="unknown guidance mode"):
        guided_log_probs(cond, ref, "bogus", 1.0)


def test_condition_corruption_rates():
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(4000, 16, 3)
    mask_value = torch.full((3,), 7.0)
    assert corrupt_condition(y, "none", 1.0, 1.0, mask_value, gen) is y
    state = gen.get_state()
    corrupt_condition(y, "none", 1.0, 1.0, mask_value, gen)
    assert torch.equal(gen.get_state(), state)  # "none" draws no random numbers: old runs stay reproducible

    cfg = corrupt_condition(y, "cfg", 0.3, 0.0, mask_value, gen)
    masked = (cfg == 7.0).all(-1)  # (B, M)
    rows = masked.any(1)
    assert torch.equal(masked[rows], torch.ones_like(masked[rows]))  # cfg drops the whole condition
    assert abs(rows.float().mean().item() - 0.3) < 0.03
    torch.testing.assert_close(cfg[~rows], y[~rows])

    mcs = corrupt_condition(y, "mcs", 0.5, 0.25, mask_value, gen)
    masked = (mcs == 7.0).all(-1)
    assert abs(masked.float().mean().item() - 0.5 * 0.25) < 0.01  # p_cond * p_mask of all image tokens
    touched = masked.any(1)
    assert 0.4 < touched.float().mean().item() < 0.5  # 1 - (1 - p_mask)^M of the p_cond fraction
    assert abs(masked[touched].float().mean().item() - 0.25 / (1 - 0.75 ** 16)) < 0.02
    with pytest.raises(ValueError):
        corrupt_condition(y, "bogus", 0.5, 0.5, mask_value, gen)


def test_guidance_config_validation():
    with pytest.raises(ValueError):
        GuidanceConfig(mode="x").validate()
    with pytest.raises(ValueError):
        GuidanceConfig(mode="cfg", scale=-1).validate()
    with pytest.raises(ConfigError):
        RunConfig.from_dict({"objective": {"guidance": "sometimes"}})
    with pytest.raises(ConfigError):
        RunConfig.from_dict({"objective": {"p_mask": 1.5}})


def test_guided_captioner_equals_model_at_w1_and_combines_otherwise(tiny_model):
    model = tiny_model()
    y = torch.randn(2, 5, model.encoder.width)
    x = torch.randint(0, 1000, (2, 7))
    plain = model.decode(x, y)
    torch.testing.assert_close(GuidedCaptioner(model, GuidanceConfig("cfg", 1.0)).decode(x, y), plain)
    guided = GuidedCaptioner(model, GuidanceConfig("cfg", 2.5)).decode(x, y)
    null = model.decode(x, torch.zeros_like(y))  # the timm encoder has no mask token: the null condition is 0
    torch.testing.assert_close(guided, 2.5 * plain.log_softmax(-1) - 1.5 * null.log_softmax(-1), rtol=1e-4, atol=1e-4)
    # the cached path gives the same guided logits
    g = GuidedCaptioner(model, GuidanceConfig("cfg", 2.5))
    torch.testing.assert_close(g.decode(x, None, cache=g.image_cache(y)), guided, rtol=1e-4, atol=1e-4)
    # select keeps rows in order
    sel = torch.zeros(2, 7, dtype=torch.bool)
    sel[0, 2], sel[1, 5] = True, True
    torch.testing.assert_close(g.decode(x, y, select=sel), guided[sel], rtol=1e-4, atol=1e-4)


def test_mdc_sampler_runs_with_guidance(tiny_model):
    ids = torch.arange(300, 340)
    model = tiny_model(output_ids=torch.cat([ids, torch.tensor([EOT_ID])]))
    y = torch.randn(3, 4, model.encoder.width)
    for mode in ("cfg", "mcs"):
        out = sample(GuidedCaptioner(model, GuidanceConfig(mode, 3.0)), y, SamplerConfig(length=5))
        assert out.tokens.shape == (3, 5) and bool(torch.isin(out.tokens, ids).all())


# ---------------------------------------------------------------------------------------------------- VQ-VAE


def test_quantizer_picks_the_nearest_code_and_gradients_pass_straight_through():
    torch.manual_seed(0)
    vq = VQVAE(VQVAEConfig(**VQ))
    with torch.no_grad():
        vq.codebook.weight.copy_(torch.arange(16.0)[:, None].expand(16, 4))
    # (1, D=4, 2, 2): all channels of grid position p hold the value v_p; code c is the vector (c, c, c, c)
    z = torch.stack([torch.full((4,), v) for v in (0.2, 3.6, 15.4, 7.6)]).T.reshape(1, 4, 2, 2)
    zq, codes = vq.quantize(z)
    assert codes.tolist() == [[0, 4, 15, 8]]
    torch.testing.assert_close(zq, vq.codebook(codes).view(1, 2, 2, 4).permute(0, 3, 1, 2))

    out = vq(torch.randn(2, 3, 32, 32))
    assert out.codes.shape == (2, 64) and out.recon.shape == (2, 3, 32, 32)
    F.mse_loss(out.recon, torch.zeros_like(out.recon)).backward()  # reconstruction only
    assert vq.encoder[0].weight.grad.abs().sum() > 0  # straight-through: the decoder's gradient reaches the encoder
    assert vq.codebook.weight.grad is None or vq.codebook.weight.grad.abs().sum() == 0  # codes move by their loss
    vq.zero_grad()
    vq(torch.randn(2, 3, 32, 32)).loss.backward()
    assert vq.codebook.weight.grad.abs().sum() > 0


def test_vqvae_file_round_trip_and_encoder_adapter(tmp_path):
    torch.manual_seed(0)
    vq = VQVAE(VQVAEConfig(**VQ)).eval()
    path = save_vqvae(vq, tmp_path / "vq.safetensors")
    images = torch.randn(2, 3, 32, 32)
    assert torch.equal(load_vqvae(path).encode(images), vq.encode(images))
    kwargs = vqvae_encoder_kwargs(path)
    enc = VQImageEncoder(micro_config(encoder="vqvae", encoder_kwargs=kwargs, pretrained_path=str(path)))
    assert torch.equal(enc.codes(images), vq.encode(images))
    tokens = enc(images)
    assert tokens.shape == (2, 64, 16) and enc.width == 16
    assert not any(p.requires_grad for p in enc.vqvae.parameters())
    with pytest.raises(ValueError, match="image_size"):
        VQImageEncoder(micro_config(image_size=64, encoder="vqvae", encoder_kwargs=kwargs))
    with pytest.raises(ValueError, match="unknown vqvae key"):
        VQImageEncoder(micro_config(encoder="vqvae", encoder_kwargs={**kwargs, "depth": 3}))
    with pytest.raises(ValueError, match="asks for"):
        VQImageEncoder(micro_config(encoder="vqvae", encoder_kwargs={**kwargs, "codebook_size": 32},
                                    pretrained_path=str(path)))
    with pytest.raises(FileNotFoundError):
        VQImageEncoder(micro_config(encoder="vqvae", encoder_kwargs=kwargs, pretrained_path=str(tmp_path / "no")))


# ---------------------------------------------------------------------------------------------------- D3PM glue


def _vq_captioner(tiny_model, ids):
    return tiny_model(output_ids=ids, encoder="vqvae", encoder_kwargs=dict(VQ))


def test_state_table_excludes_specials_and_adds_mask(tiny_model):
    ids = torch.tensor([5, 9, 320, EOT_ID])
    table = state_table(tiny_model(output_ids=ids))
    assert table.rows.tolist() == [0, 1, 2] and table.token_ids.tolist() == [5, 9, 320, MASK_ID]
    assert table.state_of_token[320] == 2 and table.state_of_token[MASK_ID] == 3 and table.state_of_token[SOT_ID] == -1


def test_d3pm_loss_trains_through_compute_loss_with_mcs(tiny_model):
    tok = CaptionTokenizer(24)
    captions = ["a red circle", "a blue square on the left", "two green stars"]
    tokens = tok(captions)
    ids = torch.tensor(sorted({i for c in captions for i in tok.encode_text(c)} | {EOT_ID}))
    model = _vq_captioner(tiny_model, ids).train()
    cfg = ObjectiveConfig.from_dict({"name": "d3pm", "d3pm_steps": 10, "guidance": "mcs", "p_cond": 0.5,
                                     "p_mask": 0.5})
    out = compute_loss(model, torch.randn(3, 3, 32, 32), tokens, cfg, torch.Generator().manual_seed(0))
    assert torch.isfinite(out.loss) and out.loss > 0
    assert {"vb", "vlb", "ce_masked", "acc_masked"} <= set(out.metrics)
    out.loss.backward()
    assert model.encoder.code_emb.weight.grad.abs().sum() > 0
    assert model.decoder.head.weight.grad.abs().sum() > 0
    # a perfect x_0 predictor has zero VLB terms: only the prior remains
    y = torch.randn(3, 4, model.encoder.width)
    table = state_table(model)
    oracle = SimpleNamespace(output_ids=model.output_ids, decode=lambda noisy, img, select, causal: _oracle_logits(
        tokens, model.output_ids)[select])
    loss, metrics = d3pm_loss(oracle, y, tokens, cfg, torch.Generator().manual_seed(1))
    assert float(metrics["vb"]) < 1e-4 and float(metrics["ce_masked"]) < 1e-4
    assert table.num_classes == len(ids) - 1


def _oracle_logits(tokens, output_ids):
    index = torch.full((MASK_ID + 1,), 0, dtype=torch.long)
    index[output_ids] = torch.arange(len(output_ids))
    return F.one_hot(index[tokens], len(output_ids)).float() * 80.0  # (B, L, V_out)


def test_d3pm_sampler_with_an_oracle_writes_the_target_caption():
    target = torch.tensor([[11, 12, 13, 11], [13, 13, 12, 11]])
    output_ids = torch.tensor([11, 12, 13, EOT_ID])

    def decode(x, image_tokens, cache=None):
        body = _oracle_logits(target, output_ids)
        pad = torch.zeros(x.shape[0], 1, 4)
        return torch.cat([pad, body, pad], 1)

    fake = SimpleNamespace(output_ids=output_ids, causal=False, cfg=SimpleNamespace(context_length=16), decode=decode)
    out = d3pm_sample(fake, torch.zeros(2, 3, 8), 4, steps=20)
    assert torch.equal(out.tokens, target) and out.masked_per_step[-1] == 0.0
    assert out.masked_per_step[0] > 0.9  # the first step from x_T = all [MASK] unmasks almost nothing
    assert torch.equal(d3pm_sample(fake, torch.zeros(2, 3, 8), 4, steps=20, stride=7).tokens, target)


def test_d3pm_sampler_with_guidance_on_a_vq_captioner(tiny_model):
    ids = torch.cat([torch.arange(300, 330), torch.tensor([EOT_ID])])
    model = _vq_captioner(tiny_model, ids)
    y = model.encode_image(torch.randn(2, 3, 32, 32))
    assert condition_mask_value(model) is model.encoder.mask_token
    for mode in ("none", "cfg", "mcs"):
        out = d3pm_sample(GuidedCaptioner(model, GuidanceConfig(mode, 2.0)), y, 5, steps=8)
        assert out.tokens.shape == (2, 5) and bool(torch.isin(out.tokens, ids[:-1]).all())
    with pytest.raises(ValueError):
        d3pm_sample(model, y, 30, steps=8)


def test_d3pm_run_trains_saves_and_loads(tmp_path):
    """`mdc train` path: d3pm objective + MCS + VQ-VAE encoder, two steps, checkpoint reload."""
    from mdc_core.factory import load_model
    from mdc_core.train import train
    from mdc_workbench.data import write_synthetic_dataset

    write_synthetic_dataset(tmp_path / "data", n=16, image_size=32, captions="short")
    vq_path = save_vqvae(VQVAE(VQVAEConfig(**VQ)), tmp_path / "vq.safetensors")
    cfg = load_preset("tiny", [
        f"data.path={tmp_path / 'data'}", "objective.name=d3pm", "objective.d3pm_steps=20", "objective.guidance=mcs",
        "model.encoder=vqvae", f"model.pretrained_path={vq_path}", "model.image_size=32", "model.text_layers=1",
        "model.text_width=32", "model.text_heads=2", "train.steps=2", "train.batch_size=4", "train.log_every=1",
    ])
    cfg.model.encoder_kwargs = vqvae_encoder_kwargs(vq_path)
    result = train(cfg, tmp_path / "run", progress=False)
    assert result.steps == 2
    model, saved = load_model(tmp_path / "run")
    assert saved.objective.name == "d3pm" and model.encoder.vqvae.cfg == VQVAEConfig(**VQ)
    out = d3pm_sample(model, model.encode_image(torch.randn(1, 3, 32, 32)), 4, steps=5)
    assert out.tokens.shape == (1, 4)
