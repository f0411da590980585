"""``model.encoder = "vqgan"``: a local diffusers VQModel as the source of discrete image tokens."""

import json

import pytest
import torch

from mdc_core.model import Captioner, build_image_encoder
from mdc_workbench.cli import main
from mdc_workbench.masked_conditional.vqgan import DiffusersVQEncoder, vqgan_encoder_kwargs
from tests.conftest import micro_config

diffusers = pytest.importorskip("diffusers")
MEAN = torch.tensor([0.48145466, 0.4578275, 0.40821073]).view(1, 3, 1, 1)  # OpenAI CLIP normalisation
STD = torch.tensor([0.26862954, 0.26130258, 0.27577711]).view(1, 3, 1, 1)


@pytest.fixture(scope="module")
def vq_dir(tmp_path_factory):
    """A tiny random VQModel (2 blocks: downsampling 2, 16 codes) saved as diffusers writes a pretrained one."""
    torch.manual_seed(0)
    vq = diffusers.VQModel(block_out_channels=(8, 16), down_block_types=("DownEncoderBlock2D",) * 2,
                           up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, latent_channels=4,
                           num_vq_embeddings=16, norm_num_groups=4, sample_size=32).eval()
    path = tmp_path_factory.mktemp("vqgan") / "vq"
    vq.save_pretrained(path)
    return path


def _encoder_cfg(path, **overrides):
    return micro_config(encoder="vqgan", pretrained_path=str(path),
                        encoder_kwargs=vqgan_encoder_kwargs(path, token_width=16), **overrides)


def test_codes_are_the_vq_models_own_and_tokens_have_the_encoder_contract(vq_dir):
    enc = build_image_encoder(_encoder_cfg(vq_dir))
    assert isinstance(enc, DiffusersVQEncoder) and enc.width == 16 and enc.num_prefix_tokens == 0
    images = torch.randn(2, 3, 32, 32)
    vq = diffusers.VQModel.from_pretrained(vq_dir).eval()
    with torch.no_grad():
        latents = vq.encode((images * STD + MEAN) * 2 - 1).latents  # the VQ model sees [-1, 1] images
        expected = vq.quantize(latents)[2][2].view(2, -1)
    codes = enc.codes(images)
    assert codes.shape == (2, 16 * 16) and torch.equal(codes, expected)
    tokens = enc(images)
    assert tokens.shape == (2, 256, 16) and torch.isfinite(tokens).all()
    torch.testing.assert_close(tokens, enc.code_emb(expected) + enc.pos_emb)
    assert enc.pool(tokens).shape == (2, 16)
    assert not any(p.requires_grad for p in enc.vq.parameters())
    assert enc.code_emb.weight.requires_grad and enc.mask_token.requires_grad
    enc.train()
    assert not enc.vq.training  # the frozen VQ model stays in inference mode


def test_captioner_rebuilds_from_its_config_without_the_folder(vq_dir):
    cfg = _encoder_cfg(vq_dir)
    model = Captioner(cfg).eval()
    images = torch.randn(1, 3, 32, 32)
    # as load_model does: the architecture from the config alone, every weight (the VQ model's too) from the state
    assert json.loads(json.dumps(cfg.encoder_kwargs)) == cfg.encoder_kwargs  # plain JSON, as config.json keeps it
    arch = micro_config(encoder="vqgan", encoder_kwargs=cfg.encoder_kwargs)
    rebuilt = Captioner(arch).eval()
    rebuilt.load_state_dict(model.state_dict())
    assert torch.equal(rebuilt.encoder.codes(images), model.encoder.codes(images))
    torch.testing.assert_close(rebuilt.encode_image(images), model.encode_image(images))


def test_a_pipeline_folder_with_a_vqvae_subfolder_works(vq_dir, tmp_path):
    import shutil

    shutil.copytree(vq_dir, tmp_path / "pipeline" / "vqvae")
    assert vqgan_encoder_kwargs(tmp_path / "pipeline") == vqgan_encoder_kwargs(vq_dir)


def test_clear_errors(vq_dir, tmp_path):
    kwargs = vqgan_encoder_kwargs(vq_dir, token_width=16)
    with pytest.raises(FileNotFoundError, match="VQ model folder not found"):
        DiffusersVQEncoder(micro_config(encoder="vqgan", pretrained_path=str(tmp_path / "nope"), encoder_kwargs=kwargs))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        DiffusersVQEncoder(micro_config(encoder="vqgan", pretrained_path=str(tmp_path / "empty"),
                                        encoder_kwargs=kwargs))
    unet = tmp_path / "unet"
    unet.mkdir()
    (unet / "config.json").write_text(json.dumps({"_class_name": "UNet2DModel"}))
    with pytest.raises(ValueError, match="not a 'VQModel'"):
        DiffusersVQEncoder(micro_config(encoder="vqgan", pretrained_path=str(unet), encoder_kwargs=kwargs))
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((vq_dir / "config.json").read_text())
    with pytest.raises(ValueError, match="could not load a VQModel"):
        DiffusersVQEncoder(micro_config(encoder="vqgan", pretrained_path=str(no_weights), encoder_kwargs=kwargs))
    with pytest.raises(ValueError, match="is a file"):
        DiffusersVQEncoder(micro_config(encoder="vqgan", pretrained_path=str(vq_dir / "config.json"),
                                        encoder_kwargs=kwargs))
    with pytest.raises(ValueError, match="needs the VQ model's config"):
        DiffusersVQEncoder(micro_config(encoder="vqgan", pretrained_path=str(vq_dir), encoder_kwargs={}))
    with pytest.raises(ValueError, match="needs model.pretrained_path"):
        DiffusersVQEncoder(micro_config(encoder="vqgan", encoder_kwargs={}))
    other = {**kwargs, "vq_config": {**kwargs["vq_config"], "num_vq_embeddings": 32}}
    with pytest.raises(ValueError, match="num_vq_embeddings"):
        DiffusersVQEncoder(micro_config(encoder="vqgan", pretrained_path=str(vq_dir), encoder_kwargs=other))
    with pytest.raises(ValueError, match="unknown vqgan key"):
        DiffusersVQEncoder(micro_config(encoder="vqgan", pretrained_path=str(vq_dir),
                                        encoder_kwargs={**kwargs, "x": 1}))
    with pytest.raises(ValueError, match="divisible"):
        DiffusersVQEncoder(_encoder_cfg(vq_dir, image_size=33))


def test_cli_trains_and_samples_a_d3pm_run_on_the_vq_model(vq_dir, tmp_path, capsys):
    data = tmp_path / "data"
    assert main(["data", "synth", "--out", str(data), "--n", "16", "--image-size", "32", "--captions", "short"]) == 0
    capsys.readouterr()
    assert main(["vqvae", "show", "--path", str(vq_dir), "--token-width", "16"]) == 0
    import shlex

    flags = shlex.split(capsys.readouterr().out)
    assert "model.encoder=vqgan" in flags
    run = tmp_path / "run"
    assert main(["train", "--preset", "tiny", "--data", str(data), "--out", str(run), "--objective", "d3pm",
                 "--steps", "1", "--quiet", *flags, "--set", "model.image_size=32", "--set", "model.text_layers=1",
                 "--set", "model.text_width=32", "--set", "model.text_heads=2", "--set", "train.batch_size=4",
                 "--set", "objective.d3pm_steps=4", "--set", "objective.guidance=mcs"]) == 0
    import webdataset as wds

    record = next(iter(wds.WebDataset(str(data / "test" / "000000.tar"), shardshuffle=False)))
    (tmp_path / "img.jpg").write_bytes(record["jpg"])
    capsys.readouterr()
    assert main(["sample", "--run", str(run), "--image", str(tmp_path / "img.jpg"), "--length", "3", "--json",
                 "--guidance", "mcs", "--guidance-scale", "2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sampler"] == "d3pm" and len(out["tokens"]) == 3 and len(out["steps"]) == 4
