"""``mdc export``: a trained run's encoder for code outside the workbench, as a timm folder or a Hugging Face-style one.

:func:`export_run` writes one of two folders (the formats: :mod:`mdc_workbench.export.encoder_io`)::

    OUT/ (--format timm)            OUT/ (--format hf)
      model.safetensors  encoder,     model.safetensors  the whole captioner
                         timm keys    config.json        the run's config (rebuilds it: load_model)
      config.json        timm hub     meta.json          step, sizes, SHA-256 (load_model verifies them)
      README.md          model card   README.md          model card

Both hold the EMA weights when the run kept them (``ema=False``: the raw ones) of the latest checkpoint (or
``step``). The model card (:mod:`mdc_workbench.export.model_card`) says what trained the encoder and how to load it.

Nothing half-written: the folder is assembled in a hidden temporary folder beside `out` and renamed into place only
when complete and verified (the timm folder is loaded back by plain timm and its features compared with the run's,
the hf folder by :func:`~mdc_core.factory.load_model`); an existing non-empty `out` is replaced only with `force`
and only when it is an earlier export, and an `out` inside a run's checkpoints folder is refused: ``--force`` never
destroys a run or someone's files.
This is an extension (its card, :mod:`mdc_workbench.export.model_card`, reads the evaluation results runs wrote); the
loader downstream code needs is :func:`mdc_workbench.export.load_encoder`.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from mdc_core.checkpoint import (
    CKPT_DIR,
    file_sha256,
    list_checkpoints,
    load_weights,
    resolve_checkpoint,
    run_holding,
    verify_checkpoint,
)
from mdc_core.config import RunConfig
from mdc_core.factory import load_model
from mdc_core.model import ImageEncoder
from mdc_core.registry import objective_spec
from mdc_workbench.eval.probe_pool import probe_pool
from mdc_workbench.export.encoder_io import (
    EXPORT_FORMATS,
    WEIGHTS,
    TimmSpec,
    create_timm_encoder,
    pool_args,
    timm_hub_config,
    timm_spec,
    timm_state_dict,
)
from mdc_workbench.export.hub import MDCCaptioner, hub_captioner
from mdc_workbench.export.model_card import candidate_files, encoder_title, find_measurements, render_card

FORMATS = EXPORT_FORMATS
TOLERANCE = 1e-5  # max abs difference of fp32 features between the export loaded back and the run


@dataclass
class Source:
    """The checkpoint being exported, loaded."""

    checkpoint: Path
    run_dir: Path  # the run folder (the checkpoint folder itself when given one outside a run)
    step: int
    ema: bool  # the EMA weights are exported
    model: torch.nn.Module
    cfg: RunConfig


def export_run(run: str | Path, out: str | Path, *, fmt: str = "hf", step: int | None = None,
               ema: bool | None = None, force: bool = False, metrics: Sequence[str | Path] = ()) -> Path:
    """Export the encoder of `run` into the folder `out`; return `out`.

    Args:
        run: a run folder (its latest complete checkpoint, or `step`'s) or a checkpoint folder.
        out: the folder to write; an existing non-empty one is replaced only with `force`, if an earlier export.
        fmt: ``"timm"`` (encoder only, plain timm loads it; not for a plug-in's encoder) or ``"hf"``.
        step: the checkpoint step of a run folder (default: the latest).
        ema: export the EMA weights (None: when the checkpoint has them; False: the raw weights).
        metrics: evaluation result files (``mdc probe --out``, ``captioning.json``, ...) for the model card, besides
            the places :func:`mdc_workbench.export.model_card.find_measurements` looks by itself.

    Raises (one-line messages): ValueError for an unknown format, a run whose encoder timm cannot rebuild (timm) or
    a damaged checkpoint; FileNotFoundError for a missing run, step or metrics file; FileExistsError for `out`.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    out = Path(out)
    if Path(run).resolve().is_relative_to(out.resolve()):
        raise ValueError(f"--out {out} holds the run {run} itself; export into another folder")
    _check_out(out, force)
    source = load_source(run, step, ema)
    if fmt == "timm":  # fails before any writing for an encoder timm cannot rebuild
        timm_spec(source.cfg.model, probe_pool(source.cfg.objective.name), _trunk(source))
    measured = find_measurements(source.run_dir, metrics)
    searched = candidate_files(source.run_dir, metrics)
    with _staging(out, force) as tmp:
        usage = (_write_timm if fmt == "timm" else _write_hf)(source, tmp)
        params = sum(p.numel() for p in _trunk(source).parameters())
        render_card(cfg=source.cfg, run_dir=source.run_dir, step=source.step, ema=source.ema, fmt=fmt, usage=usage,
                    params=params, measurements=measured, searched=searched,
                    title=encoder_title(source.cfg, _trunk(source))).save(tmp / "README.md")
    return out


def load_source(run: str | Path, step: int | None = None, ema: bool | None = None) -> Source:
    """The checkpoint of `run` to export (`step`, else the latest), its weights verified and loaded."""
    path = Path(run)
    if not path.exists():
        raise FileNotFoundError(f"run folder not found: {path}")
    if step is None:
        ckpt = resolve_checkpoint(path)
    else:
        if (path / WEIGHTS).is_file():
            raise ValueError(f"--step picks a checkpoint of a run folder, but {path} is a checkpoint folder itself")
        ckpt = path / CKPT_DIR / f"step_{step:08d}"
        found = list_checkpoints(path)
        if ckpt not in found:
            have = ", ".join(str(int(p.name.removeprefix("step_"))) for p in found) or "none"
            raise FileNotFoundError(f"{path} has no checkpoint at step {step} (its checkpoints: {have})")
    has_ema = (ckpt / "ema.safetensors").is_file()
    ema = has_ema if ema is None else ema
    model, cfg = load_model(ckpt, ema=ema)  # verifies the weights file against meta.json
    if ema:
        _integer_tensors_from_raw(model, ckpt)
    meta = json.loads((ckpt / "meta.json").read_text())
    run_dir = ckpt.parent.parent if ckpt.parent.name == CKPT_DIR else ckpt
    return Source(ckpt, run_dir, int(meta.get("step", 0)), ema, model, cfg)


def _integer_tensors_from_raw(model: torch.nn.Module, ckpt: Path) -> None:
    """Give `model` (EMA weights loaded) the integer tensors of the raw weights: an EMA averages every buffer, so
    the corpus token table (``output_ids``) and BatchNorm's step counters of an EMA file are averages of ids and
    counts, off by one after rounding down; they are not weights and must be the model's own."""
    verify_checkpoint(ckpt, (WEIGHTS,))
    raw = load_weights(ckpt / WEIGHTS)
    state = model.state_dict()
    fixed = {k: raw[k] if not v.is_floating_point() and k in raw else v for k, v in state.items()}
    if any(not torch.equal(fixed[k], state[k].cpu()) for k in state):
        model.load_state_dict(fixed)


def _trunk(source: Source) -> torch.nn.Module:
    encoder = source.model.encoder
    return encoder.trunk if isinstance(encoder, ImageEncoder) else encoder


def _check_out(out: Path, force: bool) -> None:
    """`out` may be written: not inside a run's checkpoints folder, and (non-empty) replaced only with `force` and
    only when it is an earlier export (:func:`_earlier_export`), so ``--force`` can never destroy a run or a
    folder of someone else's files."""
    run = run_holding(out)
    if run is not None:
        raise ValueError(f"--out {out} is inside the run folder {run}'s {CKPT_DIR}/ (an export there would pass for "
                         "a checkpoint, and --force would replace one); export into a folder outside it (nothing "
                         "was written)")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} exists and is not a folder (nothing was written)")
    if not (out.is_dir() and any(out.iterdir())):
        return
    if not force:
        raise FileExistsError(f"--out {out} exists and is not empty; pass --force to replace it (nothing was written)")
    why = _earlier_export(out)
    if why:
        raise FileExistsError(f"--out {out} is not an earlier export ({why}); --force replaces only a folder "
                              "`mdc export` wrote: choose another --out (nothing was written)")


EXPORT_FILES = frozenset({"README.md", "config.json", "meta.json", WEIGHTS})  # what _write_hf/_write_timm + card write


def _earlier_export(folder: Path) -> str:
    """'' when `folder` holds only what `mdc export` writes (hf: a meta.json naming what it was exported from;
    timm: timm's hub config.json), else what shows it is something else."""
    other = sorted(p.name for p in folder.iterdir() if p.name not in EXPORT_FILES or not p.is_file())
    if other:
        return f"it holds {', '.join(other[:3])}{', ...' if len(other) > 3 else ''}"
    try:
        if (folder / "meta.json").is_file():
            known = "exported_from" in json.loads((folder / "meta.json").read_text())
        else:
            known = "pretrained_cfg" in json.loads((folder / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        known = False
    return "" if known else "its meta.json or config.json is not an export's"


@contextlib.contextmanager
def _staging(out: Path, force: bool) -> Iterator[Path]:
    """A hidden folder beside `out` to fill; renamed to `out` when the block completes, removed when it fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.export-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        for path in tmp.iterdir():
            with open(path, "rb") as fh:
                os.fsync(fh.fileno())
        _check_out(out, force)  # again: something may have appeared there meanwhile
        old = out.parent / f".{out.name}.replaced-{os.getpid()}"
        if out.exists():
            os.replace(out, old)  # kept until the new folder is in place
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _probe_image(cfg: RunConfig) -> torch.Tensor:
    """A fixed random batch (2, 3, S, S) for comparing features."""
    return torch.randn(2, 3, cfg.model.image_size, cfg.model.image_size, generator=torch.Generator().manual_seed(0))


def _write_hf(source: Source, tmp: Path) -> str:
    """The whole captioner as a checkpoint folder (config.json, model.safetensors, meta.json); returns the usage.
    A captioner is written by huggingface_hub's ``save_pretrained`` (:class:`~.hub.MDCCaptioner`), so the
    Hub's ``from_pretrained`` opens the folder; another architecture (CLIP) as a checkpoint folder."""
    state = {k: v.detach().to("cpu").contiguous() for k, v in source.model.state_dict().items()}
    hub = objective_spec(source.cfg.objective.name).model == "captioner"
    if hub:
        hub_captioner(source.cfg, state).save_pretrained(tmp)  # config.json (the run's config), model.safetensors
        (tmp / "README.md").unlink(missing_ok=True)  # the mixin's stub card; render_card writes the real one
    else:
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
        source.cfg.save(tmp / "config.json")
    shutil.copymode(tmp / "config.json", tmp / WEIGHTS)  # safetensors writes 0600; the folder is meant to be shared
    files = ["config.json", WEIGHTS]
    (tmp / "meta.json").write_text(json.dumps({
        "step": source.step, "complete": True, "files": files, "bytes": {f: (tmp / f).stat().st_size for f in files},
        "sha256": {f: file_sha256(tmp / f) for f in files}, "exported_from": source.checkpoint.name,
        "weights": "ema" if source.ema else "raw"}, indent=1) + "\n")
    reloaded, _ = load_model(tmp)  # what a user's load_model does: verifies, rebuilds, loads strictly
    images = _probe_image(source.cfg)
    with torch.no_grad():
        tokens = source.model.encode_image(images)
        gaps = [float((reloaded.encode_image(images) - tokens).abs().max())]
        if hub:  # and what the Hub's call does (huggingface_hub prints "Loading weights from local directory")
            with contextlib.redirect_stdout(io.StringIO()):
                hub_model = MDCCaptioner.from_pretrained(tmp)
            gaps.append(float((hub_model.encode_image(images) - tokens).abs().max()))
    if max(gaps) > TOLERANCE:
        raise RuntimeError(f"the exported folder reloads to different features (max abs difference {max(gaps):.3g})")
    return _usage_hf(source, tuple(tokens.shape[1:]), hub)


def _write_timm(source: Source, tmp: Path) -> str:
    """The encoder alone with timm's key names and timm's hub config.json; loaded back by plain timm and compared
    with the run's encoder (tokens and probe feature) before it may be renamed into place. Returns the usage."""
    trunk = _trunk(source)
    pool = probe_pool(source.cfg.objective.name)
    spec = timm_spec(source.cfg.model, pool, trunk)
    state = timm_state_dict(trunk.state_dict(), spec.conv_stem)
    save_file({k: v.detach().to("cpu").contiguous() for k, v in state.items()}, str(tmp / WEIGHTS),
              metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(timm_hub_config(
        spec, int(trunk.num_features), description=f"{source.cfg.objective.name} image encoder exported by the MDC "
        f"workbench from {source.checkpoint.name} of {source.run_dir.name}"), indent=2) + "\n")
    shutil.copymode(tmp / "config.json", tmp / WEIGHTS)  # safetensors writes 0600; the folder is meant to be shared
    loaded = create_timm_encoder(spec, tmp / WEIGHTS)
    images = _probe_image(source.cfg)
    with torch.no_grad():
        tokens = source.model.encode_image(images)
        theirs = loaded.forward_features(images)
        if theirs.ndim == 4:  # a convolutional trunk: (B, C, H, W) -> (B, H*W, C), as ImageEncoder does
            theirs = theirs.flatten(2).transpose(1, 2)
        gaps = [float((theirs - tokens).abs().max())]
        if spec.pooled:
            gaps.append(float((loaded(images) - source.model.encoder.pool(tokens, pool)).abs().max()))
    if max(gaps) > TOLERANCE:
        raise RuntimeError(f"plain timm rebuilds this encoder with different features (max abs difference "
                           f"{max(gaps):.3g} > {TOLERANCE}); use --format hf")
    return _usage_timm(spec, tuple(tokens.shape[1:]))


def _call(name: str, args: dict) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


def _usage_timm(spec: TimmSpec, token_shape: tuple[int, ...]) -> str:
    m, d = token_shape
    feature = (f"# (1, {d}): the probe feature ({'mean of the patch tokens' if spec.pool == 'gap' else 'class token'})"
               if spec.pooled else "# timm's own pooling; the run's probe feature is the mean of the patch tokens")
    explicit = """timm.create_model(
    config["pretrained_cfg"]["architecture"], pretrained=True,
    pretrained_cfg=dict(config["pretrained_cfg"], file=weights),  # these weights and the run's preprocessing
    num_classes=0,{stem}
    **config["model_args"],
).eval()"""
    if spec.conv_stem is None:
        head, imports, stem = "", "", ""
        build = ('model = timm.create_model("local-dir:" + folder, pretrained=True).eval()  # all from config.json\n'
                 "# the same without local-dir (config.json's architecture alone names no preprocessing: timm "
                 "refuses it):\n# model = " + explicit.format(stem="").replace("\n", "\n# ") + "\n")
    else:  # timm's ConvStem + HybridEmbed: the early-convolution stem, in timm's own layers
        norm = {"batch": "torch.nn.BatchNorm2d", "group": "GroupNorm1"}[spec.conv_stem["norm"]]
        keywords = "".join(f"    {k}={tuple(v)!r},\n" for k, v in spec.conv_stem.items() if k not in ("norm", "depth"))
        head = "from functools import partial\n"
        imports = "from timm.layers import GroupNorm1\n" if norm == "GroupNorm1" else ""
        imports += "from timm.models.vision_transformer_hybrid import ConvStem, HybridEmbed\n"
        stem = (f"# the early convolutions (conv_stem in config.json) as a timm ConvStem, whose last convolution is "
                f"the patch projection\nstem = ConvStem(\n    depth={spec.conv_stem['depth']},\n{keywords}"
                f"    norm_layer={norm},\n)\n")
        build = ("# no timm model name builds this stem, so timm.create_model(config[\"architecture\"], ...) and "
                 "local-dir refuse\n# the folder (\"Unknown model\"); with the stem as embed_layer:\nmodel = "
                 + explicit.format(stem="\n    embed_layer=partial(HybridEmbed, backbone=stem, proj=False),") + "\n")
    return f"""import json
import os
{head}
import timm
import torch
from PIL import Image
{imports}
{FOLDER_LINE}weights = os.path.join(folder, {WEIGHTS!r})
if not os.path.isfile(weights):
    raise FileNotFoundError(f"{{weights}} not found: set folder to the folder of this export")
with open(os.path.join(folder, "config.json")) as fh:
    config = json.load(fh)
{stem}{build}# the run's preprocessing, from config.json's pretrained_cfg
transform = timm.data.create_transform(**timm.data.resolve_model_data_config(model))
image = transform(Image.open("image.jpg").convert("RGB")).unsqueeze(0)
with torch.no_grad():
    feature = model(image)  {feature}
    tokens = model.forward_features(image)  # (1, {m}, {d}): the tokens the caption decoder attended to
"""


FOLDER_LINE = 'folder = "."  # this export\'s folder (the one holding this README.md): "." when run from inside it\n'


def _usage_hf(source: Source, token_shape: tuple[int, ...], hub: bool) -> str:
    whole = "model, cfg = load_model(folder)  # the whole captioner (sampling, scoring)"
    hub_lines = ("""
# the whole captioner with Hugging Face's own call (huggingface_hub's PyTorchModelHubMixin):
# from mdc_workbench.export import MDCCaptioner
# captioner = MDCCaptioner.from_pretrained(folder)
""" if hub else "")
    if not isinstance(source.model.encoder, ImageEncoder):  # a frozen VQ tokenizer: no timm encoder to hand out
        return f"from mdc_core.factory import load_model  # this project\n\n{FOLDER_LINE}{whole}\n{hub_lines}"
    pool = probe_pool(source.cfg.objective.name)
    m, d = token_shape
    feature = (f"# (1, {d}): the probe feature ({'mean of the patch tokens' if pool == 'gap' else 'class token'})"
               if pool_args(source.model.encoder.trunk, pool) else
               "# timm's own pooling; the run's probe feature is the mean of the tokens")
    return f"""import torch
from PIL import Image
from mdc_workbench.export import load_encoder  # this project (pip install -e . in its repository)

{FOLDER_LINE}encoder, preprocess = load_encoder(folder)  # a timm model and a torchvision transform
image = preprocess(Image.open("image.jpg").convert("RGB")).unsqueeze(0)
with torch.no_grad():
    feature = encoder(image)  {feature}
    tokens = encoder.forward_features(image)  # (1, {m}, {d}): the tokens the caption decoder attended to

# {whole.replace("load_model(", "mdc_core.factory.load_model(")}{hub_lines}"""
