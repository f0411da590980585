"""The captioner: forward per preset, attention masks, corpus vocabulary, tokenizer."""

import pytest
import torch

from mdc_core.config import load_preset
from mdc_core.model import Captioner, build_image_encoder
from mdc_core.tokenizer import EOT_ID, MASK_ID, PAD_ID, SOT_ID, CaptionTokenizer, build_output_vocab, padding_mask


@pytest.mark.parametrize("preset", ["tiny", "tiny_lean", "tiny_fast", "tiny_vit", "vit_b32", "vit_b16", "vit_l14"])
def test_forward_every_preset_no_nan(preset):
    cfg = load_preset(preset)
    if cfg.model.output_vocab == "corpus":
        ids = build_output_vocab(["a red circle", "two blue squares"])
        cfg.model.output_vocab_size = len(ids)
    else:
        ids = None
    torch.manual_seed(0)
    model = Captioner(cfg.model, output_ids=ids).eval()
    tok = CaptionTokenizer(cfg.model.context_length)
    tokens = tok(["a red circle", "two blue squares"])
    tokens[0, 2] = MASK_ID
    with torch.no_grad():
        image_tokens = model.encode_image(torch.randn(2, 3, cfg.model.image_size, cfg.model.image_size))
        logits = model.decode(tokens[:, :8], image_tokens)
        pooled = model.encoder.pool(image_tokens)
    n_out = len(ids) if ids is not None else 49408
    assert logits.shape == (2, 8, n_out)
    assert pooled.shape == (2, model.encoder.width)
    assert torch.isfinite(logits).all() and torch.isfinite(pooled).all()


def test_padding_mask_uses_eot_not_pad_id():
    tokens = torch.tensor([[SOT_ID, 0, 5, EOT_ID, 0, 0]])  # the first 0 is the real token "!"
    assert padding_mask(tokens).tolist() == [[False, False, False, False, True, True]]


def test_pads_invisible_to_attention(tiny_model):
    model = tiny_model()
    image = model.encode_image(torch.randn(1, 3, 32, 32))
    a = torch.tensor([[SOT_ID, 10, MASK_ID, EOT_ID, PAD_ID, PAD_ID]])
    b = a.clone()
    b[0, 4:] = torch.tensor([77, MASK_ID])  # garbage after <eot> must not change anything before it
    assert torch.allclose(model.decode(a, image)[:, :4], model.decode(b, image)[:, :4], atol=1e-6)
    visible = tiny_model(attend_to_pads=True)
    assert not torch.allclose(visible.decode(a, image)[:, :4], visible.decode(b, image)[:, :4], atol=1e-6)


def test_causal_vs_bidirectional(tiny_model):
    tokens = torch.tensor([[SOT_ID, 10, 11, 12, EOT_ID]])
    changed = tokens.clone()
    changed[0, 3] = 99
    for causal in (False, True):
        model = tiny_model(causal=causal)
        image = model.encode_image(torch.randn(1, 3, 32, 32))
        before, after = model.decode(tokens, image), model.decode(changed, image)
        same_prefix = torch.allclose(before[:, :3], after[:, :3], atol=1e-6)
        assert same_prefix == causal  # a causal decoder cannot see the future; MDC's bidirectional one does


def test_select_returns_rows_of_full_logits(tiny_model):
    model = tiny_model()
    image = model.encode_image(torch.randn(2, 3, 32, 32))
    tokens = torch.tensor([[SOT_ID, MASK_ID, 11, EOT_ID], [SOT_ID, 10, MASK_ID, EOT_ID]])
    select = tokens == MASK_ID
    assert torch.allclose(model.decode(tokens, image, select=select), model.decode(tokens, image)[select], atol=1e-5)


def test_corpus_vocabulary_restricts_input_and_output(tiny_model):
    tok = CaptionTokenizer(24)
    ids = build_output_vocab(["a red circle", "a blue square"], tok)
    assert EOT_ID in ids.tolist() and MASK_ID not in ids.tolist() and SOT_ID not in ids.tolist()
    model = tiny_model(output_ids=ids)
    assert model.decoder.head.out_features == len(ids)
    assert model.decoder.tok_emb.num_embeddings == len(ids) + 3
    red = tok.encode_text("red")[0]
    assert model.output_ids[model.output_index[red]] == red
    image = model.encode_image(torch.randn(1, 3, 32, 32))
    assert model.decode(tok(["a red square"]), image).shape[-1] == len(ids)
    with pytest.raises(ValueError, match="not in this model's corpus vocabulary"):
        model.decode(tok(["a green triangle"]), image)


def test_other_architecture_checkpoint_is_refused(tiny_model):
    small, wide = tiny_model(), tiny_model(text_width=64)
    with pytest.raises(ValueError, match="does not match this architecture.*other shapes"):
        wide.load_state_dict(small.state_dict())


def test_tokenizer_round_trip_and_errors():
    tok = CaptionTokenizer(context_length=8)
    ids = tok(["A red circle!"])
    assert ids[0, 0] == SOT_ID and EOT_ID in ids[0].tolist()
    assert tok.decode(ids[0]) == "a red circle !"
    assert tok.token_strings(ids[0]) == ["a", "red", "circle", "!"]
    with pytest.raises(ValueError, match="empty"):
        tok(["   "])
    long = "one two three four five six seven eight"
    with pytest.raises(ValueError, match="has 8 tokens but the model's context holds 6"):
        tok([long], truncate=False)
    cut, n = tok.tokenize_batch([long, "a red circle"])
    assert n == 1 and cut[0, -1] == EOT_ID and tok.decode(cut[0]) == "one two three four five six"
    assert tok.decode([SOT_ID, MASK_ID, 320, EOT_ID, 0, 0]) == "[MASK] a"


def test_conv_stem_keeps_token_grid_and_checks_stride():
    from mdc_core.model import build_image_encoder
    kwargs = '{"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2, "conv_stem": [8, 16]}'
    cfg = load_preset("tiny", [f"model.encoder_kwargs={kwargs}"])
    enc = build_image_encoder(cfg.model)
    stem = enc.trunk.patch_embed.backbone
    assert stem.stride == 4 and enc.trunk.patch_embed.proj.kernel_size == (2, 2)  # 4 x 2 = patch 8
    tokens = enc(torch.randn(2, 3, 64, 64))
    assert tokens.shape == (2, 1 + (64 // 8) ** 2, 32)  # same grid as the plain ViT, plus the class token
    bad = load_preset("tiny", ['model.encoder_kwargs={"patch_size": 6, "embed_dim": 32, "depth": 1, '
                               '"num_heads": 2, "conv_stem": [8, 16]}'])
    with pytest.raises(ValueError, match="stride 4, which must divide the encoder's patch_size 6"):
        build_image_encoder(bad.model)
    with pytest.raises(ValueError, match="conv_stem must be a list of channel widths"):
        build_image_encoder(load_preset("tiny", ['model.encoder_kwargs={"conv_stem": 16}']).model)


def test_conv_stem_depth_and_norm():
    from mdc_core.model import build_image_encoder

    def stem(extra: str) -> torch.nn.Module:
        kwargs = '{"patch_size": 8, "embed_dim": 32, "depth": 1, "num_heads": 2, "conv_stem": [8, 16]' + extra + "}"
        cfg = load_preset("tiny", [f"model.encoder_kwargs={kwargs}"])
        return build_image_encoder(cfg.model).trunk.patch_embed.backbone

    convs = [m for m in stem(', "conv_stem_depth": 3') if isinstance(m, torch.nn.Conv2d)]
    assert [c.stride for c in convs] == [(2, 2), (1, 1), (1, 1)] * 2  # per stage: one stride-2 conv, then stride 1
    assert [c.out_channels for c in convs] == [8, 8, 8, 16, 16, 16]
    per_stage = [m for m in stem(', "conv_stem_depth": [1, 2]') if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.stride) for c in per_stage] == [(8, (2, 2)), (16, (2, 2)), (16, (1, 1))]
    assert any(isinstance(m, torch.nn.BatchNorm2d) for m in stem(""))  # BatchNorm by default, as Xiao et al.
    group = stem(', "conv_stem_norm": "group"')
    assert any(isinstance(m, torch.nn.GroupNorm) for m in group) and not any(
        isinstance(m, torch.nn.BatchNorm2d) for m in group)
    with pytest.raises(ValueError, match="conv_stem_depth must be an integer >= 1 or a list of 2 .*, got 0"):
        stem(', "conv_stem_depth": 0')
    with pytest.raises(ValueError, match=r"a list of 2 \(one per stage\), got \[1, 2, 2\]"):
        stem(', "conv_stem_depth": [1, 2, 2]')
    with pytest.raises(ValueError, match="conv stem norm must be one of batch, group, got 'layer'"):
        stem(', "conv_stem_norm": "layer"')
    with pytest.raises(ValueError, match="conv_stem_depth needs model.encoder_kwargs.conv_stem"):
        build_image_encoder(load_preset("tiny", ['model.encoder_kwargs={"conv_stem_depth": 2}']).model)


def test_tiny_fast_encodes_64_px_into_a_4x4_token_grid():
    cfg = load_preset("tiny_fast")
    assert cfg.model.image_size == 64 and cfg.data.in_memory
    encoder = build_image_encoder(cfg.model).eval()
    with torch.no_grad():
        tokens = encoder(torch.randn(2, 3, 64, 64))
    assert tokens.shape == (2, 1 + 16, 128)  # class token + (64 / 16) ** 2 patches
    convs = [m for m in encoder.trunk.patch_embed.backbone if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [32, 64, 128] and all(c.stride == (2, 2) for c in convs)


def test_tiny_lean_is_tiny_with_one_full_resolution_convolution_and_half_the_mlp():
    lean, tiny = load_preset("tiny_lean"), load_preset("tiny")
    assert (lean.train.steps, lean.train.min_lr_ratio, lean.data.in_memory) == (1500, 0.3, True)  # the CPU recipe
    encoders = {name: build_image_encoder(cfg.model).eval() for name, cfg in (("lean", lean), ("tiny", tiny))}
    with torch.no_grad():
        shapes = {name: enc(torch.randn(2, 3, 64, 64)).shape for name, enc in encoders.items()}
    assert shapes["lean"] == shapes["tiny"] == (2, 1 + 64, 128)  # the same 8 x 8 token grid as tiny
    convs = [(m.out_channels, m.stride) for m in encoders["lean"].trunk.patch_embed.backbone
             if isinstance(m, torch.nn.Conv2d)]
    assert convs == [(32, (2, 2)), (64, (2, 2)), (64, (1, 1)), (128, (2, 2)), (128, (1, 1))]
    assert [b.mlp.fc1.out_features for b in encoders["lean"].trunk.blocks] == [256] * 4
    assert [b.mlp.fc1.out_features for b in encoders["tiny"].trunk.blocks] == [512] * 4
