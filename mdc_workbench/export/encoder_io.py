"""The trained encoder outside the workbench: its description for plain timm, and :func:`load_encoder`.

Downstream code (a probe, a detector, a retrieval index) wants the encoder, not the captioner. Two folder formats
carry it out (``mdc export`` writes them):

* **timm** (``--format timm``): ``model.safetensors`` with timm's own key names and a ``config.json`` in timm's hub
  layout (``architecture``, ``num_classes``, ``num_features``, ``global_pool``, ``model_args`` without
  ``num_classes``, ``pretrained_cfg`` with the trained ``input_size``, ``mean``, ``std``, ``crop_pct``,
  ``interpolation``). ``timm.create_model("local-dir:FOLDER", pretrained=True)`` loads a plain ViT exactly, with
  the trained preprocessing in ``pretrained_cfg`` (``timm.data.resolve_model_data_config`` gives it), and so does
  ``timm.create_model(name, pretrained=True, pretrained_cfg=dict(config["pretrained_cfg"], file=...),
  num_classes=0, **config["model_args"])``. Without ``pretrained_cfg`` that call would take timm's registry
  entry of the name (224 px, another mean and crop: silently other preprocessing), and no entry of
  ``config.json`` can reach that call's ``pretrained_cfg`` without breaking ``local-dir:``; so ``architecture``
  carries a pretrained tag timm's registry does not know (:data:`OWN_TAG`), and the call without it stops with
  "Invalid pretrained tag (...)" naming the two that work. The early-convolution stem (``tiny``, ``tiny_fast``,
  ``tiny_lean``) is timm's own ``ConvStem`` + ``HybridEmbed`` (the stem's last convolution is the patch projection),
  which no timm model name builds and ``config.json`` cannot hold (a callable): its call adds
  ``embed_layer=partial(HybridEmbed, backbone=ConvStem(**conv_stem), proj=False)`` from the ``conv_stem`` entry,
  and its ``architecture`` is a sentence (:func:`stem_architecture`), so that ``local-dir:`` and a call built from
  ``config.json`` alone fail with "Unknown model (...)" saying what to do instead of loading a random patch
  projection with a warning. Every timm encoder but a plug-in's (:func:`timm_spec` says which).
* **hf** (``--format hf``): the whole captioner as a checkpoint folder (``config.json`` = the run's config,
  ``model.safetensors``, ``meta.json``) plus a model card, loadable by :func:`mdc_core.factory.load_model`; works
  for every encoder, the early-convolution stem included.

:func:`load_encoder` reads either, or a run / checkpoint folder, and returns the encoder as a timm model (``model(x)``
is the run's probe feature, ``model.forward_features(x)`` the tokens the decoder attended to) with its preprocessing.

It lives in the workbench beside ``mdc export`` (the core trains and samples; export formats are not its
business); torch and timm are imported inside its functions, so ``from mdc_workbench.export import load_encoder``
stays light until the first call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mdc_core.config import ModelConfig

EXPORT_FORMATS = ("timm", "hf")  # the folder formats above (mdc export --format)
TIMM_CONFIG = "config.json"  # timm's hub config in a timm export; the run's RunConfig in an hf export
WEIGHTS = "model.safetensors"
STEM_KEYS = ("conv_stem", "conv_stem_depth", "conv_stem_norm")  # encoder_kwargs that timm does not know
# timm's pooling that equals the probe feature of each pooling kind of mdc_workbench.eval.probe_pool.PROBE_POOL
TIMM_POOL = {"gap": "avg", "cls": "token"}
# the pretrained tag of a plain timm export's `architecture`: unknown to timm's registry, so a call that would take
# the registry's preprocessing for the name fails saying what to do (see the module docstring); no ':' or '/', which
# timm reads as a source or a path
OWN_TAG = ("mdc, trained with its own preprocessing, which config.json's pretrained_cfg holds and timm's registry "
           "does not; load the folder with the local-dir source, or pass pretrained_cfg=config['pretrained_cfg']")
DATA_KEYS = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")  # timm's preprocessing keys


@dataclass(frozen=True)
class TimmSpec:
    """What plain timm needs to rebuild a run's encoder: ``timm.create_model(architecture, num_classes=0,
    **model_args)``, and the preprocessing as timm ``pretrained_cfg`` keys."""

    architecture: str  # timm model name
    model_args: dict[str, Any]  # create_model keywords: the run's encoder_kwargs, img_size, the probe pooling
    data_config: dict[str, Any]  # input_size, interpolation, crop_pct, crop_mode, mean, std (timm pretrained_cfg)
    pool: str  # the probe feature: "gap" (mean of the patch tokens) or "cls" (the class token)
    pooled: bool  # model(x) returns the probe feature (a ViT; else pool the tokens of forward_features yourself)
    conv_stem: dict[str, Any] | None = None  # keywords of timm's ConvStem for the early-convolution stem (conv_stem)


def data_config(image_size: int) -> dict[str, Any]:
    """The run's evaluation preprocessing in timm's terms: shorter side to `image_size` (bicubic), centre crop,
    OpenAI CLIP mean/std (what :func:`mdc_core.transforms.eval_transform` does)."""
    from mdc_core.transforms import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
    return {"input_size": (3, image_size, image_size), "interpolation": "bicubic", "crop_pct": 1.0,
            "crop_mode": "center", "mean": tuple(OPENAI_DATASET_MEAN), "std": tuple(OPENAI_DATASET_STD)}


def timm_spec(cfg: ModelConfig, pool: str, trunk: Any) -> TimmSpec:
    """The plain-timm description of the encoder of `cfg` (probe pooling `pool`); `trunk` (the built timm model)
    tells whether it is a ViT, whose timm pooling can be set to the probe feature, and its width.

    Raises ValueError (one line, pointing to ``--format hf``) for a plug-in's encoder
    (:data:`mdc_core.registry.ENCODERS`), which is not a timm model.
    """
    from mdc_core.registry import encoder_builder
    if encoder_builder(cfg.encoder) is not None:
        raise ValueError(f"encoder {cfg.encoder!r} is not a timm model, so plain timm cannot load it; export with "
                         "--format hf instead (loads with mdc_workbench.export.load_encoder)")
    pooling = pool_args(trunk, pool)
    kwargs = {k: v for k, v in cfg.encoder_kwargs.items() if k not in STEM_KEYS}
    stem = None
    if "conv_stem" in cfg.encoder_kwargs:
        stem = timm_conv_stem(cfg.encoder_kwargs, int(trunk.embed_dim))
        kwargs["patch_size"] = 1  # the stem's last convolution is the patch projection, so tokens come out of it
    # num_classes=0 is config.json's num_classes (timm's hub layout), not a model argument: a timm user passes it
    args = {"img_size": cfg.image_size, **kwargs, **pooling}
    return TimmSpec(cfg.encoder, args, data_config(cfg.image_size), pool, bool(pooling), stem)


def timm_conv_stem(encoder_kwargs: dict[str, Any], embed_dim: int) -> dict[str, Any]:
    """Keywords of timm's ``ConvStem`` (``timm.models.vision_transformer_hybrid``) that build the same layers as
    :class:`mdc_core.model.ConvStem` followed by the ViT's patch projection: per stage of ``conv_stem`` one 3x3
    convolution of stride 2 and ``depth - 1`` of stride 1 (each + norm + ReLU), then the projection to `embed_dim`
    (kernel = stride = ``patch_size / 2 ** stages``, with bias, no norm: timm's last ConvStem layer). ``norm`` is
    ``"batch"`` or ``"group"`` (timm's ``GroupNorm1``); :func:`timm_norm_layer` turns it into the layer."""
    channels = list(encoder_kwargs["conv_stem"])
    depth = encoder_kwargs.get("conv_stem_depth", 1)
    depths = list(depth) if isinstance(depth, list | tuple) else [depth] * len(channels)
    widths, strides = [], []
    for c, d in zip(channels, depths, strict=True):
        widths += [c] * d
        strides += [2] + [1] * (d - 1)
    last = int(encoder_kwargs.get("patch_size", 16)) // 2 ** len(channels)
    n = len(widths)
    return {"depth": n + 1, "channels": [*widths, embed_dim], "stride": [*strides, last],
            "kernel_size": [3] * n + [last], "padding": [1] * n + [0],
            "norm": encoder_kwargs.get("conv_stem_norm", "batch")}


def timm_norm_layer(norm: str) -> Any:
    """timm's norm layer for a ConvStem ``norm``: BatchNorm2d, or GroupNorm1 (one group, as ``"group"``)."""
    from timm.layers import GroupNorm1
    from torch import nn
    layers = {"batch": nn.BatchNorm2d, "group": GroupNorm1}
    if norm not in layers:
        raise ValueError(f"conv stem norm must be one of {', '.join(layers)}, got {norm!r}")
    return layers[norm]


def timm_state_dict(state: dict[str, Any], conv_stem: dict[str, Any] | None) -> dict[str, Any]:
    """The encoder's state dict `state` under the key names of the timm model of its spec: unchanged for a plain
    ViT; with the stem, ``patch_embed.backbone.{i}`` (our flat conv, norm, ReLU sequence) becomes timm's
    ``patch_embed.backbone.{j}.conv`` / ``.bn`` and ``patch_embed.proj`` its last ``.conv``."""
    if conv_stem is None:
        return dict(state)
    prefix, n = "patch_embed.backbone.", conv_stem["depth"] - 1  # our stem: 3 modules (conv, norm, ReLU) per conv
    renamed = {}
    for key, value in state.items():
        if key.startswith(prefix):
            index, rest = key.removeprefix(prefix).split(".", 1)
            j, kind = divmod(int(index), 3)
            key = f"{prefix}{j}.{('conv', 'bn')[kind]}.{rest}"
        elif key.startswith("patch_embed.proj."):
            key = f"{prefix}{n}.conv.{key.removeprefix('patch_embed.proj.')}"
        renamed[key] = value
    return renamed


def pool_args(trunk: Any, pool: str) -> dict[str, Any]:
    """timm keywords that make ``trunk(x)`` the probe feature `pool` without changing a weight: for a ViT whose final
    norm acts on the tokens (no fc_norm, no attention pooling; timm's default for ``global_pool="token"``), pooling
    after that norm is the probe feature; ``fc_norm=False`` keeps the norm where it was trained. {} otherwise."""
    from timm.models.vision_transformer import VisionTransformer
    from torch import nn
    if (isinstance(trunk, VisionTransformer) and isinstance(trunk.fc_norm, nn.Identity) and trunk.attn_pool is None
            and (pool != "cls" or trunk.has_class_token)):
        return {"global_pool": TIMM_POOL[pool], "fc_norm": False}
    return {}


def timm_pretrained_cfg(spec: TimmSpec, **card: Any) -> dict[str, Any]:
    """The ``pretrained_cfg`` of `spec` in timm's terms (every key a ``timm.models.PretrainedCfg`` field): the timm
    name, no classifier, native timm keys, the fixed input size and the run's preprocessing; `card` adds entries
    such as ``description``. timm builds a model from it without consulting its registry, whose entry for the name
    describes other weights (their URL, licence, 224 px and preprocessing)."""
    return {"architecture": spec.architecture, "num_classes": 0, "custom_load": False, "fixed_input_size": True,
            **spec.data_config, **card}


def timm_hub_config(spec: TimmSpec, num_features: int, **card: Any) -> dict[str, Any]:
    """``config.json`` of a timm export in timm's hub layout (what ``hf-hub:``/``local-dir:`` model names read):
    ``architecture`` (with :data:`OWN_TAG`, or :func:`stem_architecture`'s sentence), ``num_classes``,
    ``num_features``, ``global_pool`` (timm writes it for information), ``model_args`` and ``pretrained_cfg``
    (:func:`timm_pretrained_cfg`; `card` adds entries such as ``description``); with the stem, ``conv_stem``."""
    config = {"architecture": (f"{spec.architecture}.{OWN_TAG}" if spec.conv_stem is None
                               else stem_architecture(spec.architecture)),
              "num_classes": 0, "num_features": num_features}
    if spec.model_args.get("global_pool"):
        config["global_pool"] = spec.model_args["global_pool"]
    config |= {"model_args": spec.model_args, "pretrained_cfg": timm_pretrained_cfg(spec, **card)}
    return config if spec.conv_stem is None else {**config, "conv_stem": spec.conv_stem}


def stem_architecture(name: str) -> str:
    """The ``architecture`` of a timm export with the early-convolution stem: no timm name builds that model (its
    embed layer is a callable, which config.json cannot hold), and the real name `name` would build a ViT with a
    random patch projection that loads with a mere warning; this text makes ``timm.create_model(architecture, ...)``
    and ``local-dir:`` fail with "Unknown model (...)" saying what to do. No '.', ':' or '/', which timm would read
    as a pretrained tag, a source or a path. The real name stays in ``pretrained_cfg["architecture"]``."""
    return (f"{name} with an early-convolution stem, which no timm model name builds; create {name} with the "
            "embed_layer that this folder's README shows")


def create_timm_encoder(spec: TimmSpec, weights: str | Path) -> Any:
    """Plain timm's model for `spec` filled from the safetensors file `weights`, as the README of a timm export
    builds it: ``timm.create_model(name, pretrained=True, pretrained_cfg=dict(pretrained_cfg, file=weights),
    **model_args)`` (plus the stem's ``embed_layer``), nothing of this project involved; the ``pretrained_cfg`` is
    what ``local-dir:`` reads from the folder, so the model and its preprocessing are the same."""
    import timm
    args = dict(spec.model_args)  # an export before num_classes left model_args holds it: as good as the default
    if spec.conv_stem is not None:
        from functools import partial

        from timm.models.vision_transformer_hybrid import ConvStem, HybridEmbed
        stem = {**spec.conv_stem, "norm_layer": timm_norm_layer(spec.conv_stem["norm"])}
        del stem["norm"]
        args["embed_layer"] = partial(HybridEmbed, backbone=ConvStem(**stem), proj=False)
    pretrained_cfg = {**timm_pretrained_cfg(spec), "file": str(weights)}  # its num_classes=0: timm's default here
    return timm.create_model(spec.architecture, pretrained=True, pretrained_cfg=pretrained_cfg, **args).eval()


def preprocess(image_size: int) -> Callable[[Any], Any]:
    """PIL RGB image -> normalised (3, S, S) tensor, as the run was evaluated (torchvision transforms)."""
    from mdc_core.transforms import eval_transform
    return eval_transform(image_size)


def load_encoder(path: str | Path, *, device: str = "cpu", ema: bool | None = None) -> tuple[Any, Callable]:
    """The trained image encoder of an export, run or checkpoint folder, and its preprocessing, in one line::

        encoder, preprocess = load_encoder("exported/")
        features = encoder(preprocess(image).unsqueeze(0))        # (1, D): the run's probe feature
        tokens = encoder.forward_features(preprocess(image)[None])  # (1, M, D): what the decoder attended to

    Args:
        path: a folder written by ``mdc export`` (``--format hf`` or ``timm``), a run folder (its latest checkpoint)
            or a checkpoint folder.
        device: where the encoder goes.
        ema: for a run or checkpoint folder, its EMA weights (True) or the raw ones (False); None: the EMA weights
            when the checkpoint has them (what ``mdc export`` exports). An export holds one set; ignored there.

    Returns:
        ``(encoder, preprocess)``: a timm model in eval mode whose ``pretrained_cfg`` carries the run's image size,
        mean and std (so ``timm.data.resolve_model_data_config(encoder)`` agrees), and a torchvision transform from a
        PIL RGB image to the normalised tensor. For a ViT, ``encoder(x)`` is the probe feature (mean of the patch
        tokens for captioners, the class token for CLIP); for other timm encoders pool ``forward_features`` yourself.
    """
    path = Path(path)
    config = path / TIMM_CONFIG
    if config.is_file() and (path / WEIGHTS).is_file():
        try:
            data = json.loads(config.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{config} is not valid JSON ({err})") from err
        if isinstance(data, dict) and "architecture" in data:  # a timm export
            cfg = data.get("pretrained_cfg", {})
            stem = data.get("conv_stem")
            name = cfg.get("architecture") or data["architecture"]  # the timm name (see OWN_TAG, stem_architecture)
            from mdc_core.checkpoint import HUB_PREFIXES
            from mdc_core.config import check_encoder_kwargs
            if not isinstance(name, str) or name.lower().startswith(HUB_PREFIXES):
                raise ValueError(f"{config}: architecture {name!r} is not a timm model name here (a Hugging Face Hub "
                                 "name would be resolved on the network; a local folder never is)")
            if not isinstance(data.get("model_args", {}), dict):
                raise ValueError(f"{config}: model_args must be a JSON object")
            check_encoder_kwargs(data.get("model_args", {}), f"{config}: model_args")  # before timm builds them
            spec = TimmSpec(name, data.get("model_args", {}), {k: tuple(v) if isinstance(v, list) else v
                            for k, v in cfg.items() if k in DATA_KEYS}, "", False, stem)
            return create_timm_encoder(spec, path / WEIGHTS).to(device), preprocess(spec.data_config["input_size"][-1])
    from mdc_core.checkpoint import resolve_checkpoint
    from mdc_core.factory import load_model
    from mdc_core.model import ImageEncoder
    from mdc_workbench.eval.probe_pool import probe_pool
    if ema is None:
        ema = (resolve_checkpoint(path) / "ema.safetensors").is_file()
    model, run = load_model(path, device=device, ema=ema)
    if not isinstance(model.encoder, ImageEncoder):
        raise ValueError(f"{path}: encoder {run.model.encoder!r} is not a timm image encoder (a plug-in's encoder); "
                         "load_encoder returns learned timm encoders only")
    trunk = model.encoder.trunk
    pooling = pool_args(trunk, probe_pool(run.objective.name))
    if pooling:
        trunk.reset_classifier(0, global_pool=pooling["global_pool"])
    trunk.pretrained_cfg = {"architecture": run.model.encoder, **data_config(run.model.image_size), "num_classes": 0,
                            "description": f"{run.objective.name} image encoder trained by the MDC workbench"}
    return trunk.eval(), preprocess(run.model.image_size)
