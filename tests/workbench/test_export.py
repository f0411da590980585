"""``mdc export`` and ``load_encoder``: the timm folder loads in plain timm (a fresh interpreter, no project
code) with the run's features, the hf folder reloads to the same captions, the model card says what it should, and
bad input gives one line and writes nothing."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from PIL import Image
from safetensors.torch import load_file, save_file

from mdc_core.checkpoint import CheckpointError, save_checkpoint
from mdc_core.config import load_preset
from mdc_core.factory import create_model, load_model
from mdc_core.sampler import sample
from mdc_core.tokenizer import CaptionTokenizer, build_output_vocab
from mdc_core.train import train
from mdc_core.transforms import load_image
from mdc_workbench import export
from mdc_workbench.cli import build_parser, main
from mdc_workbench.cli.train import _train_config
from mdc_workbench.export import MDCCaptioner, load_encoder
from mdc_workbench.export.encoder_export import export_run
from mdc_workbench.export.model_card import rebuild_command
from tests.train_helpers import micro_run, one_thread, write_micro_data  # noqa: F401 - one_thread is a fixture

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "mdc_core" / "pretrained" / "mdc_tiny_lean_easy"  # the shipped model's checkpoint folder
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}  # plain timm must not need the network
# the paper presets (their encoders, patch sizes and 224 px) with one narrow block and a small decoder
SMALL_VIT = ['model.encoder_kwargs={"depth": 1, "embed_dim": 64, "num_heads": 2}', "model.text_width=64",
             "model.text_layers=1", "model.text_heads=2"]


def _perturbed_run(tmp: Path, preset: str, overrides: list[str], objective: str = "mdc") -> Path:
    """A run folder with one checkpoint of `preset` whose weights (and a different EMA) are random, not the init
    (a key that failed to load would keep timm's init, which must not pass for equal)."""
    cfg = load_preset(preset, [*overrides, f"objective.name={objective}", 'model.output_vocab="corpus"'])
    ids = build_output_vocab(["a red circle left of a blue square"], CaptionTokenizer(cfg.model.context_length))
    cfg.model.output_vocab_size = len(ids)
    torch.manual_seed(0)
    model = create_model(cfg, objective, ids)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    ema = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    run = tmp / f"{preset}_{objective}"
    run.mkdir()
    cfg.save(run / "config.json")
    save_checkpoint(run, 7, cfg, model, ema_state=ema)
    return run


def _image(path: Path, size: int = 80) -> Path:
    """A non-square RGB image with structure, so that resize and crop matter."""
    g = torch.Generator().manual_seed(1)
    pixels = (torch.rand(size, size + 30, 3, generator=g) * 255).to(torch.uint8).numpy()
    Image.fromarray(pixels).save(path)
    return path


def _snippet(readme: Path) -> str:
    return re.search(r"```python\n(.*?)```", readme.read_text(), re.S).group(1)


FOLDER_LINE = 'folder = "."  # this export\'s folder'


def _run_snippet(readme: Path, cwd: Path, save: str, folder: Path | None = None) -> dict[str, torch.Tensor]:
    """Execute the README's Python block in a fresh interpreter (cwd holds image.jpg), plus `save`; its tensors.
    The snippet's `folder` is set to `folder` (default: the README's), as its comment tells a user to."""
    snippet = _snippet(readme)
    name = readme.parent.name  # path-independent: no string of the card names its folder
    assert not re.search(rf"""["'][^"'\n]*{re.escape(name)}""", snippet), name
    assert snippet.count(FOLDER_LINE) == 1
    snippet = snippet.replace(FOLDER_LINE, f"folder = {str(folder or readme.parent)!r}  #")
    code = snippet + save + "\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'mdc_core'))\n"
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code], cwd=cwd, env=ENV, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return {"stdout": out.stdout, **torch.load(cwd / "out.pt")}


def test_timm_export_loads_in_plain_timm_in_a_fresh_interpreter_with_the_runs_features(tmp_path):
    run = _perturbed_run(tmp_path, "tiny_vit", [])
    out = export_run(run, tmp_path / "timm_tiny_vit", fmt="timm")
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    image = _image(tmp_path / "image.jpg")
    got = _run_snippet(out / "README.md", tmp_path, "torch.save({'feature': feature, 'tokens': tokens, 'image': image},"
                       " 'out.pt')")
    assert got["stdout"].strip() == "[]"  # no module of this project was imported
    model, cfg = load_model(run, ema=True)  # the export holds the EMA weights
    x = load_image(image, cfg.model.image_size).unsqueeze(0)
    assert torch.allclose(got["image"], x, atol=1e-6)  # timm's transform from the card = the run's preprocessing
    with torch.no_grad():
        tokens = model.encode_image(x)
        feature = model.pooled_features(x, "gap")
    assert got["tokens"].shape == tokens.shape == (1, 65, 128)
    assert float((got["tokens"] - tokens).abs().max()) <= 1e-5
    assert float((got["feature"] - feature).abs().max()) <= 1e-5
    with torch.no_grad():  # and the raw weights differ: the EMA was the one exported
        raw = load_model(run, ema=False)[0].encode_image(x)
    assert float((raw - tokens).abs().max()) > 1e-3


@pytest.mark.parametrize("preset, objective, pool", [("vit_b32", "mdc", "gap"), ("vit_b32", "clip", "cls"),
                                                     ("vit_b16", "mdc", "gap"), ("vit_l14", "arc", "gap")])
def test_timm_export_of_the_paper_presets_at_reduced_size(preset, objective, pool, tmp_path):
    import timm

    run = _perturbed_run(tmp_path, preset, SMALL_VIT, objective)
    out = export_run(run, tmp_path / "timm", fmt="timm", ema=False)
    hub = json.loads((out / "config.json").read_text())
    assert hub["pretrained_cfg"]["architecture"] == load_preset(preset).model.encoder and hub["num_features"] == 64
    assert hub["architecture"].startswith(load_preset(preset).model.encoder + ".")  # OWN_TAG: local-dir: or the cfg
    model = timm.create_model("local-dir:" + str(out), pretrained=True).eval()  # timm's own reading of config.json
    ours, _ = load_model(run)
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        tokens = ours.encode_image(x)
        assert float((model.forward_features(x) - tokens).abs().max()) <= 1e-5
        assert float((model(x) - ours.pooled_features(x, pool)).abs().max()) <= 1e-5
    encoder, preprocess = load_encoder(out)  # load_encoder reads a timm export as well
    with torch.no_grad():
        assert float((encoder.forward_features(x) - tokens).abs().max()) <= 1e-5


def _close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal features up to float32 rounding, the tolerance scaled to their magnitude."""
    return got.shape == want.shape and float((got - want).abs().max()) <= 1e-5 * max(1.0, float(want.abs().max()))


def _data_config(config: dict) -> dict:
    """timm's resolved data config with JSON's lists as tuples (local-dir: keeps config.json's lists)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}


SAVE_ALL = "torch.save({'feature': feature, 'tokens': tokens, 'image': image, 'data': \
timm.data.resolve_model_data_config(model)}, 'out.pt')"


def _card_matches_load_encoder(out: Path, cwd: Path, image: Path) -> None:
    """The card's snippet (a fresh interpreter, no project code) gives load_encoder's features, tokens and resolved
    data config, and its transform is load_encoder's preprocessing."""
    import timm

    got = _run_snippet(out / "README.md", cwd, SAVE_ALL)
    assert got["stdout"].strip() == "[]"  # no module of this project was imported
    encoder, preprocess = load_encoder(out)
    x = preprocess(Image.open(image).convert("RGB")).unsqueeze(0)
    assert _close(got["image"], x)
    with torch.no_grad():
        assert _close(got["tokens"], encoder.forward_features(x)) and _close(got["feature"], encoder(x))
    assert _data_config(got["data"]) == _data_config(timm.data.resolve_model_data_config(encoder))


def _refused_saying_what_to_do(out: Path) -> None:
    """What a timm user writes from config.json stops in one line naming what works (the card's call)."""
    for name, got in _timm_user_calls(out).items():
        assert isinstance(got, RuntimeError), (name, got)
        assert "\n" not in str(got) and "early-convolution stem" in str(got), (name, got)
        assert "embed_layer that this folder's README shows" in str(got), (name, got)


@pytest.mark.parametrize("preset, stem", [
    ("tiny", ""),  # conv_stem [32, 64, 128], two convolutions per stage, BatchNorm, patch 8
    ("tiny_fast", ""),  # one convolution per stage, patch 16 (notebooks 02-05 of make demo)
    ("tiny_lean", ""),  # depths [1, 2, 2], mlp_ratio 2 (notebook 01 of make demo, the shipped model)
    ("tiny_lean", ', "conv_stem_norm": "group"'),  # GroupNorm1 instead of BatchNorm
])
def test_conv_stem_runs_export_to_plain_timm_with_the_runs_features(preset, stem, tmp_path):
    """The presets `make demo` trains: their early-convolution stem is timm's ConvStem + HybridEmbed, which no timm
    name builds: the natural call, local-dir: and the call with config.json's pretrained_cfg stop in one line saying
    what to do, and the card's snippet (a fresh interpreter, no project code) gives the run's tokens, probe feature
    and preprocessing, equal to load_encoder's."""
    kwargs = load_preset(preset).model.encoder_kwargs
    small = {**kwargs, "embed_dim": 32, "depth": 1, "num_heads": 2}
    run = _perturbed_run(tmp_path, preset, ["model.encoder_kwargs=" + json.dumps(small)[:-1] + stem + "}"])
    ours, cfg = load_model(run, ema=True)
    norms = [m for m in ours.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert (not norms) == bool(stem)  # BatchNorm's running statistics must travel too: the EMA's, not the init
    assert all(not torch.allclose(m.running_var, torch.ones_like(m.running_var)) for m in norms)
    out = export_run(run, tmp_path / "timm", fmt="timm")
    hub = json.loads((out / "config.json").read_text())
    assert hub["conv_stem"]["norm"] == ("group" if stem else "batch")
    assert hub["conv_stem"]["channels"][-1] == 32 and hub["model_args"]["patch_size"] == 1
    assert hub["pretrained_cfg"]["architecture"] == "vit_base_patch32_224"  # the timm name, for the card's call
    _refused_saying_what_to_do(out)
    image = _image(tmp_path / "image.jpg")
    _card_matches_load_encoder(out, tmp_path, image)
    got = _run_snippet(out / "README.md", tmp_path, "torch.save({'feature': feature, 'tokens': tokens}, 'out.pt')")
    x = load_image(image, cfg.model.image_size).unsqueeze(0)
    with torch.no_grad():  # and load_encoder's are the run's
        assert _close(got["tokens"], ours.encode_image(x)) and _close(got["feature"], ours.pooled_features(x, "gap"))


def test_the_shipped_model_exports_to_plain_timm_with_its_features_and_preprocessing(tmp_path):
    """The shipped model (tiny_lean, trained by make demo's recipe): the same as a demo run's export, with trained
    weights and BatchNorm statistics."""
    out = export_run(SHIPPED, tmp_path / "timm", fmt="timm")
    _refused_saying_what_to_do(out)
    image = _image(tmp_path / "image.jpg")
    _card_matches_load_encoder(out, tmp_path, image)
    shipped, preprocess = load_encoder(SHIPPED)  # the checkpoint itself, not the export
    exported, _ = load_encoder(out)
    x = preprocess(Image.open(image).convert("RGB")).unsqueeze(0)
    with torch.no_grad():
        assert _close(exported.forward_features(x), shipped.forward_features(x))
    assert exported.pretrained_cfg["input_size"] == shipped.pretrained_cfg["input_size"] == (3, 64, 64)


def test_the_stem_key_map_moves_every_tensor_and_a_wrong_stem_does_not_load(tmp_path):
    from timm.models.vision_transformer_hybrid import ConvStem

    from mdc_workbench.export.encoder_io import timm_conv_stem, timm_state_dict
    spec = timm_conv_stem({"patch_size": 16, "conv_stem": [8, 16], "conv_stem_depth": [1, 2]}, 32)
    assert spec == {"depth": 4, "channels": [8, 16, 16, 32], "stride": [2, 2, 1, 4], "kernel_size": [3, 3, 3, 4],
                    "padding": [1, 1, 1, 0], "norm": "batch"}
    ours = {"patch_embed.backbone.0.weight": 0, "patch_embed.backbone.1.running_mean": 1,
            "patch_embed.backbone.6.weight": 2, "patch_embed.backbone.7.bias": 3, "patch_embed.proj.bias": 4,
            "blocks.0.norm1.weight": 5}
    assert timm_state_dict(ours, spec) == {
        "patch_embed.backbone.0.conv.weight": 0, "patch_embed.backbone.0.bn.running_mean": 1,
        "patch_embed.backbone.2.conv.weight": 2, "patch_embed.backbone.2.bn.bias": 3,
        "patch_embed.backbone.3.conv.bias": 4, "blocks.0.norm1.weight": 5}
    assert timm_state_dict(ours, None) == ours
    stem = ConvStem(**{k: v for k, v in spec.items() if k != "norm"})
    assert [int(m.conv.stride[0]) for m in stem] == [2, 2, 1, 4]  # the stem's stride is the patch size, 16
    wrong = _perturbed_run(tmp_path, "tiny", ['model.encoder_kwargs={"patch_size": 8, "embed_dim": 32, "depth": 1, '
                                              '"num_heads": 2, "conv_stem": [8, 16, 32]}'])
    out = export_run(wrong, tmp_path / "timm", fmt="timm")
    hub = json.loads((out / "config.json").read_text())
    hub["conv_stem"]["channels"][0] = 16  # a stem of other widths cannot take these weights
    (out / "config.json").write_text(json.dumps(hub))
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_encoder(out)
    del hub["conv_stem"]  # nor can a patch-1 ViT without the stem (what timm's local-dir: reading builds)
    hub["architecture"] = hub["pretrained_cfg"]["architecture"]  # the timm name, not stem_architecture's sentence
    (out / "config.json").write_text(json.dumps(hub))
    with pytest.raises(RuntimeError):
        load_encoder(out)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A micro MDC run trained 4 steps with an EMA, a probe result beside it, and its data."""
    root = tmp_path_factory.mktemp("export")
    data = write_micro_data(root / "data", 24)
    cfg = micro_run(data, steps=4, batch_size=8, ckpt_every=2, ema_decay=0.9, seed=3)
    run = root / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(cfg, run, progress=False)
    finally:
        torch.set_num_threads(threads)
    probe = {"data": str(data), "runs": [
        {"run": str(run), "checkpoint": str(run / "checkpoints" / "step_00000004"), "step": 4, "objective": "mdc",
         "pool": "gap", "init": "trained", "protocol": "lbfgs", "data": str(data), "ema": True,
         "tasks": {"shape": {"top1": 0.625}, "colour": {"top1": 0.5}}},
        {"run": str(run), "step": 4, "init": "random", "protocol": "lbfgs", "tasks": {"shape": {"top1": 0.25}}}]}
    (run / "probe.json").write_text(json.dumps(probe))
    return run, data


def _captions(model, images, cfg) -> torch.Tensor:
    with torch.no_grad():
        return sample(model, model.encode_image(images), cfg.sampler).tokens


def test_the_hf_export_prints_only_its_own_two_lines(trained, tmp_path, capsys):
    """huggingface_hub's from_pretrained, with which the export checks its folder, printed "Loading weights from
    local directory" between them (issue 64)."""
    run, _ = trained
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("exported ") and lines[1].startswith("load it: see ")


def test_hf_export_reloads_to_identical_captions_and_one_line_loader(trained, tmp_path):
    run, data = trained
    raw = export_run(run, tmp_path / "raw", ema=False)
    exported, cfg = load_model(raw)  # the project's own loader reads the folder
    images = torch.stack([load_image(p, cfg.model.image_size) for p in _test_images(data, tmp_path)])
    assert torch.equal(_captions(exported, images, cfg), _captions(load_model(run)[0], images, cfg))

    out = export_run(run, tmp_path / "hf")  # default: the EMA weights
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "meta.json", "model.safetensors"]
    exported = load_model(out)[0]
    weights = {name: load_file(str(run / "checkpoints" / "step_00000004" / name))
               for name in ("model.safetensors", "ema.safetensors")}
    saved = load_file(str(out / "model.safetensors"))
    for key, value in saved.items():  # EMA weights, the model's own integer tables (an EMA of token ids is no id)
        assert torch.equal(value, weights["ema.safetensors" if value.is_floating_point() else "model.safetensors"][key])
    reference = load_model(run)[0]
    reference.load_state_dict({k: v if not v.is_floating_point() else weights["ema.safetensors"][k]
                               for k, v in weights["model.safetensors"].items()})
    assert torch.equal(_captions(exported, images, cfg), _captions(reference, images, cfg))
    hub = MDCCaptioner.from_pretrained(out)  # Hugging Face's own call (PyTorchModelHubMixin), a local folder
    assert type(hub) is MDCCaptioner and not hub.training and hub.run_config.to_dict() == cfg.to_dict()
    assert torch.equal(_captions(hub, images, cfg), _captions(reference, images, cfg))
    hub.save_pretrained(tmp_path / "again")  # and the mixin writes the same layout back
    with torch.no_grad():
        again = MDCCaptioner.from_pretrained(tmp_path / "again").encode_image(images)
        assert torch.equal(again, hub.encode_image(images))
    original = reference
    # a fresh interpreter that imports only load_encoder, running the card's snippet
    (tmp_path / "image.jpg").write_bytes(_test_images(data, tmp_path)[0].read_bytes())
    got = _run_snippet(out / "README.md", tmp_path, "torch.save({'feature': feature, 'tokens': tokens}, 'out.pt')")
    with torch.no_grad():
        x = load_image(tmp_path / "image.jpg", cfg.model.image_size).unsqueeze(0)
        assert float((got["tokens"] - original.encode_image(x)).abs().max()) <= 1e-5
        assert float((got["feature"] - original.pooled_features(x, "gap")).abs().max()) <= 1e-5
    encoder, preprocess = load_encoder(run)  # a run folder: the EMA weights, as exported
    with torch.no_grad():
        assert torch.equal(encoder(x), original.pooled_features(x, "gap"))
    for loaded in (encoder, load_encoder(out)[0]):  # timm's ImageNet entries are not these weights'
        assert not {"hf_hub_id", "license", "url", "tag"} & set(loaded.pretrained_cfg)
        assert loaded.pretrained_cfg["input_size"] == (3, 32, 32)  # the run's image size


def test_the_hub_class_loads_strictly_and_only_captioners(trained, tmp_path):
    run, _ = trained
    out = export_run(run, tmp_path / "hf")
    state = load_file(str(out / "model.safetensors"))
    del state["decoder.ln_f.bias"]
    save_file(state, str(out / "model.safetensors"))
    with pytest.raises(ValueError, match="model.safetensors is corrupt") as err:
        MDCCaptioner.from_pretrained(out)  # the mixin's own default (strict=False) would have loaded it half
    assert "\n" not in str(err.value)
    (out / "meta.json").unlink()  # a folder without digests: the weights' header against the config
    with pytest.raises(ValueError, match="missing from the file") as err:
        MDCCaptioner.from_pretrained(out)
    assert "\n" not in str(err.value)
    clip = load_model(run)[1].to_dict()
    clip["objective"]["name"] = "clip"
    with pytest.raises(ValueError, match="not a captioner"):
        MDCCaptioner(clip)


def _test_images(data: Path, tmp_path: Path) -> list[Path]:
    import webdataset as wds

    paths = []
    for i, record in enumerate(wds.WebDataset(str(next((data / "test").glob("*.tar"))), shardshuffle=False)):
        if i == 4:
            break
        paths.append(tmp_path / f"test{i}.jpg")
        paths[-1].write_bytes(record["jpg"])
    return paths


def test_model_card_fields_command_and_measurements(trained, tmp_path):
    run, data = trained
    captioning = {"data": str(data), "n_images": 8, "finetune_steps": 0, "results": [
        {"run": str(run), "label": "MDC", "length": 10, "metrics": {"CIDEr": 0.42, "BLEU-4": 0.1}}]}
    (tmp_path / "captioning.json").write_text(json.dumps(captioning))
    out = export_run(run, tmp_path / "hf", metrics=[tmp_path / "captioning.json"])
    card = (out / "README.md").read_text()
    meta = ModelCard.load(out / "README.md").data  # huggingface_hub reads the card it wrote
    assert meta.license is None and meta.library_name == "mdc-workbench"  # the licence is left to the user
    assert {(r.metric_name, r.metric_value) for r in meta.eval_results} >= {
        ("CIDEr, MDC", 0.42), ("linear probe top-1 %, shape", 62.5)}  # the measurements as model-index metadata
    assert str(tmp_path) not in card and str(run.parent) not in card  # no path of the machine that wrote it
    assert "# run: a `mdc` image encoder (ViT, depth 1, width 32, patch 8, 32 px)" in card
    for text in ("`mdc`: masked diffusion captioning", "t ~ U[0.5, 1.0]", "| preset | `tiny` |", data.name,
                 "| steps | 4 ", "| seed | 3 |", "EMA of the weights (decay 0.9)", "| CIDEr, MDC | 0.42 |",
                 "| linear probe top-1 %, shape | 62.5 | 4 |",
                 "| linear probe top-1 %, shape, baseline: this architecture untrained | 25 | 4 |"):
        assert text in card, text
    command = re.search(r"```bash\n(.*?)\n```", card, re.S).group(1)
    args = build_parser().parse_args(shlex.split(command)[1:])  # the command parses and rebuilds the config
    rebuilt, saved = _train_config(args).to_dict(), load_model(run)[1].to_dict()
    assert saved["data"]["path"].endswith(args.data)  # the data folder as shown: its last two parts, not the root
    for cfg in (rebuilt, saved):
        cfg["model"]["output_vocab_size"] = 0
        cfg["data"]["path_as_given"] = cfg["preset"] = cfg["data"]["path"] = ""
    assert rebuilt == saved
    assert command == rebuild_command(load_model(run)[1], run)


def test_a_plan_notebook_metrics_json_names_the_run(trained, tmp_path):
    import shutil

    run, _ = trained
    plan_run = tmp_path / "plan" / "_models" / "abc123"
    shutil.copytree(run, plan_run, ignore=shutil.ignore_patterns("probe.json"))
    notebook = tmp_path / "plan" / "03_linear_probing"
    notebook.mkdir()
    (notebook / "metrics.json").write_text(json.dumps({
        "notebook": "03_linear_probing", "runs": {"MDC": str(plan_run), "ARC": str(tmp_path / "other")},
        "metrics": {"probe/MDC": 71.5, "probe/MDC/shape": 80.0, "probe/ARC": 60.0}, "mean_tasks": ["shape"]}))
    card = (export_run(plan_run, tmp_path / "hf") / "README.md").read_text()
    assert "| linear probe top-1 %, mean of shape | 71.5 |" in card and "| linear probe top-1 %, shape | 80 |" in card
    assert "60" not in card.split("## Measured")[1].split("## Reproduce")[0]


@pytest.mark.parametrize("argv, message", [
    (["export", "{tmp}/missing", "--out", "{tmp}/o"], "run folder not found"),
    (["export", "{run}", "--format", "onnx", "--out", "{tmp}/o"], "unknown export format 'onnx'"),
    (["export", "{run}", "--step", "3", "--out", "{tmp}/o"], "no checkpoint at step 3 (its checkpoints: 2, 4)"),
    (["export", "{run}", "--out", "{tmp}/o", "--metrics", "{tmp}/nope.json"], "--metrics file not found"),
    (["export", "{run}", "--out", "{run}/..", "--force"], "holds the run"),
])
def test_bad_input_is_one_line_and_writes_nothing(argv, message, trained, tmp_path, capsys):
    run, _ = trained
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{run}", str(run)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mdc: error:") and message in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_existing_out_needs_force_and_a_corrupt_run_is_refused(trained, tmp_path, capsys):
    import shutil

    run, _ = trained
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    assert main(["export", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "exists and is not empty; pass --force" in err and "\n" not in err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    (out / "mine.txt").unlink()
    assert main(["export", str(run), "--out", str(out)]) == 0  # an empty folder takes an export
    assert main(["export", str(run), "--out", str(out), "--force", "--step", "2", "--no-ema"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "meta.json", "model.safetensors"]
    assert json.loads((out / "meta.json").read_text())["step"] == 2 and "the trained weights" in (
        out / "README.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary or replaced folder left beside it
    broken = tmp_path / "broken"
    shutil.copytree(run, broken)
    ema = broken / "checkpoints" / "step_00000004" / "ema.safetensors"
    ema.write_bytes(ema.read_bytes()[:100])  # truncated, as by a full disk
    assert main(["export", str(broken), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "corrupt" in err and "\n" not in err and not (tmp_path / "o").exists()
    with pytest.raises(CheckpointError):
        export_run(broken, tmp_path / "o")


def test_load_encoder_is_lazy_and_importing_the_export_package_stays_light():
    code = ("import sys\nfrom mdc_workbench import export\nassert 'torch' not in sys.modules\n"
            "f = export.load_encoder\nassert callable(f) and 'torch' not in sys.modules\n"
            "from mdc_workbench.export import load_encoder\n"
            "assert set(export.__all__) <= set(dir(export)) and 'load_encoder' in dir(export)\n"
            "assert 'torch' not in sys.modules\n"
            "from mdc_workbench.export import *\nassert all(callable(globals()[n]) for n in export.__all__)\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ok"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        export.nope  # noqa: B018


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["checkpoints", "checkpoints/step_00000004", "checkpoints/step_00000002", ".",
                                   "checkpoints/step_00000009", "checkpoints/new/deeper"])
def test_force_never_removes_or_replaces_anything_inside_a_run(where, trained, tmp_path, capsys):
    """--out RUN/checkpoints --force used to delete every checkpoint, and --out RUN/checkpoints/step_N --force to
    replace that checkpoint with an export that passes the integrity check but has no state.pt."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained[0], run)
    before = _tree(run)
    assert main(["export", str(run), "--out", str(run / where), "--force"]) == 2
    err = capsys.readouterr().err.strip()
    message = "holds the run" if where == "." else "inside the run folder"
    assert err.startswith("mdc: error: --out") and "\n" not in err and message in err, err
    assert _tree(run) == before and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_force_replaces_an_earlier_export_only(trained, tmp_path, capsys):
    run, _ = trained
    out = tmp_path / "out"
    for fmt in ("hf", "timm", "hf"):  # an export of either format is replaced by one of either
        assert main(["export", str(run), "--format", fmt, "--out", str(out), "--force"]) == 0
    capsys.readouterr()
    (out / "notes.txt").write_text("mine")  # no longer only what an export writes
    assert main(["export", str(run), "--out", str(out), "--force"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not an earlier export" in err and "notes.txt" in err and "\n" not in err, err
    assert (out / "notes.txt").read_text() == "mine"
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")  # a folder that merely has an export's file names
    assert main(["export", str(run), "--out", str(other), "--force"]) == 2
    assert "not an earlier export" in capsys.readouterr().err and (other / "config.json").read_text() == "{}"


def _timm_user_calls(out: Path) -> dict[str, object]:
    """What a timm user writes from config.json alone (issue 64): each call's model, or the exception. "natural" is
    the issue's call, "pretrained_cfg" the same with config.json's pretrained_cfg (what the refusal of "natural"
    names)."""
    import timm

    cfg = json.loads((out / "config.json").read_text())
    weights = str(out / "model.safetensors")
    calls = {"natural": lambda: timm.create_model(cfg["architecture"], pretrained=True, pretrained_cfg_overlay=dict(
                 file=weights), num_classes=0, **cfg["model_args"]),
             "local-dir": lambda: timm.create_model("local-dir:" + str(out), pretrained=True),
             "pretrained_cfg": lambda: timm.create_model(cfg["architecture"], pretrained=True, pretrained_cfg=cfg[
                 "pretrained_cfg"], pretrained_cfg_overlay=dict(file=weights), num_classes=0, **cfg["model_args"])}
    got = {}
    for name, call in calls.items():
        try:
            got[name] = call().eval()
        except Exception as err:  # noqa: BLE001 - the test inspects what each call raised
            got[name] = err
    return got


def test_timm_users_calls_give_load_encoders_features_and_preprocessing_or_say_what_to_do(trained, tmp_path):
    """A plain ViT: local-dir: and the call with config.json's pretrained_cfg build load_encoder's model with the
    run's preprocessing; the call without it would take timm's registry entry for the name (224 px, mean 0.5, crop
    0.9: issue 64) and stops in one line naming those two. No num_classes among model_args (the natural call passes
    its own: "got multiple values for keyword argument 'num_classes'" before)."""
    import timm

    run, data = trained
    out = export_run(run, tmp_path / "D1", fmt="timm")
    hub = json.loads((out / "config.json").read_text())
    assert "num_classes" not in hub["model_args"] and hub["num_classes"] == 0
    assert set(hub) >= {"architecture", "num_classes", "num_features", "model_args", "pretrained_cfg"}
    encoder, _ = load_encoder(out)
    want = _data_config(timm.data.resolve_model_data_config(encoder))
    ours, cfg = load_model(run, ema=True)
    size = cfg.model.image_size
    assert want["input_size"] == (3, size, size) and want["crop_pct"] == 1.0 and want["mean"][0] != 0.5
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(5))
    calls = _timm_user_calls(out)
    natural = calls.pop("natural")
    assert isinstance(natural, RuntimeError) and "\n" not in str(natural), natural
    assert "local-dir" in str(natural) and "pass pretrained_cfg=config['pretrained_cfg']" in str(natural)
    with torch.no_grad():
        tokens = ours.encode_image(x)
        assert _close(encoder.forward_features(x), tokens) and _close(encoder(x), ours.pooled_features(x, "gap"))
        for name, model in calls.items():
            assert isinstance(model, torch.nn.Module), (name, model)
            assert _close(model.forward_features(x), tokens) and _close(model(x), encoder(x)), name
            assert _data_config(timm.data.resolve_model_data_config(model)) == want, name
    # the card's snippet as written runs from inside the folder ("." is its folder) and from elsewhere once set
    (out / "image.jpg").write_bytes(_image(tmp_path / "image.jpg").read_bytes())
    _card_matches_load_encoder(out, tmp_path, tmp_path / "image.jpg")
    save = "torch.save({'tokens': tokens}, 'out.pt')"
    inside = _run_snippet(out / "README.md", out, save, folder=Path("."))
    elsewhere = _run_snippet(out / "README.md", tmp_path, save)
    assert torch.equal(inside["tokens"], elsewhere["tokens"])
    unset = subprocess.run([sys.executable, "-c", _snippet(out / "README.md")], cwd=tmp_path, env=ENV,
                           capture_output=True, text=True, timeout=300)
    assert unset.returncode == 1 and "set folder to the folder of this export" in unset.stderr.splitlines()[-1]


def test_an_export_written_before_issue_64_still_loads(trained, tmp_path):
    """Exports whose model_args held num_classes=0 and whose architecture was the plain timm name."""
    run, _ = trained
    out = export_run(run, tmp_path / "old", fmt="timm")
    hub = json.loads((out / "config.json").read_text())
    hub["architecture"] = hub["pretrained_cfg"]["architecture"]
    hub["model_args"]["num_classes"] = 0
    (out / "config.json").write_text(json.dumps(hub))
    encoder, _ = load_encoder(out)
    fresh, _ = load_encoder(export_run(run, tmp_path / "new", fmt="timm"))
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert _close(encoder(x), fresh(x))


def test_save_pretrained_folder_loads_everywhere_an_export_does_and_keeps_its_card(trained, tmp_path, capsys):
    """Issue 54 item 10: the mixin's folder had no meta.json (``mdc sample --run`` refused it) and its README.md
    was huggingface_hub's "[More Information Needed]" template in place of the export's card."""
    run, data = trained
    out = export_run(run, tmp_path / "hf")
    hub = MDCCaptioner.from_pretrained(out)
    copy = tmp_path / "copy"
    hub.save_pretrained(copy)
    assert sorted(p.name for p in copy.iterdir()) == ["README.md", "config.json", "meta.json", "model.safetensors"]
    assert (copy / "README.md").read_bytes() == (out / "README.md").read_bytes()
    assert json.loads((copy / "meta.json").read_text())["step"] == 4  # the step of the folder it came from
    image = _test_images(data, tmp_path)[0]
    for folder in (out, copy):  # the CLI, load_model, load_encoder and the Hub's call read both alike
        assert main(["sample", "--run", str(folder), "--image", str(image), "--json"]) == 0, capsys.readouterr().err
    samples = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(samples) == 2 and samples[0]["caption"] == samples[1]["caption"]
    x = load_image(image, 32).unsqueeze(0)
    with torch.no_grad():
        tokens = hub.encode_image(x)
        assert torch.equal(load_model(copy)[0].encode_image(x), tokens)
        assert torch.equal(load_encoder(copy)[0].forward_features(x), tokens)
        assert torch.equal(MDCCaptioner.from_pretrained(copy).encode_image(x), tokens)
    weights = copy / "model.safetensors"  # the digests it recorded are checked: a damaged copy is refused
    damaged = bytearray(weights.read_bytes())
    damaged[-5] ^= 0xFF
    weights.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_model(copy)
    with pytest.raises(CheckpointError, match="corrupt"):
        MDCCaptioner.from_pretrained(copy)
    fresh = tmp_path / "fresh"  # a model built in code (no card to keep): the mixin's card, a loadable folder
    MDCCaptioner(load_model(run)[1].to_dict()).save_pretrained(fresh)
    assert json.loads((fresh / "meta.json").read_text())["step"] == 0 and load_model(fresh)[0] is not None
