"""Typed run configuration: one dataclass per concern, JSON presets, strict loading.

A :class:`RunConfig` holds a :class:`ModelConfig`, :class:`ObjectiveConfig`, :class:`DataConfig`,
:class:`TrainConfig` and :class:`SamplerConfig`. Presets are JSON files in ``mdc_core/presets/`` named by file
(``tiny.json`` -> ``"tiny"``); keys a preset leaves out take the dataclass defaults, the paper's ViT-B/32 settings
(appendix A, Table 6). Loading is strict: an unknown key, a value of the wrong type or a cross-field contradiction
raises :class:`ConfigError` (a ``ValueError``) naming the key; nothing is silently ignored. Plug-ins add keys to the
objective section (:func:`mdc_core.registry.register_settings`), read and written among the section's own keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import registry

PRESET_DIR = Path(__file__).parent / "presets"

# Name tables (torch-free, so the command line imports them instead of copying them)
SCORE_METHODS = ("heuristic", "mc", "ar")  # caption likelihood scores: the rows of scoring.METHODS
COMPILE_MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # train.compile
STATIC_SHAPES = ("auto", "off", "padded", "dense")  # train.static_shapes
PRECISIONS = ("auto", "fp32", "bf16")  # train.precision and inference --precision (mdc_core.sampler)


class ConfigError(ValueError):
    """A configuration key is unknown, mistyped, or contradicts another key."""


# Upper bounds of the sizes a config builds: far above every preset, so only a damaged or hostile config.json meets them
MODEL_LIMITS = {"image_size": 4096, "text_width": 16384, "text_layers": 256, "text_heads": 256,
                "context_length": 4096, "output_vocab_size": 49408}  # 49408: the CLIP vocabulary (tokenizer)
MAX_MLP_RATIO = 64.0
ENCODER_KWARG_MAX = 65536  # any number in model.encoder_kwargs (widths, sizes, rates)
ENCODER_DEPTH_MAX = 256  # an encoder_kwargs entry named depth / *_depth / *layers (each number of it)


@dataclass
class ModelConfig:
    """Architecture of the captioner (image encoder + text decoder). Nothing here depends on the objective."""

    encoder: str = "vit_base_patch32_224"  # any timm model name with a token-sequence `forward_features`
    encoder_kwargs: dict[str, Any] = field(default_factory=dict)  # overrides passed to timm.create_model
    pretrained: bool = False  # ask timm for pretrained weights (needs the network or a local HF cache)
    pretrained_path: str = ""  # local encoder weights file (.safetensors/.pth) loaded into the encoder
    image_size: int = 224  # input resolution in pixels (square)
    text_width: int = 512  # decoder hidden size
    text_layers: int = 12  # decoder depth
    text_heads: int = 8  # decoder attention heads
    mlp_ratio: float = 4.0  # decoder MLP hidden size / width
    context_length: int = 77  # max caption tokens including <sot> and <eot>
    dropout: float = 0.0  # decoder dropout
    output_vocab: str = "full"  # "full": 49408-way head; "corpus": only token ids seen in the training corpus
    output_vocab_size: int = 0  # size of the corpus head; filled in by the trainer when output_vocab="corpus"
    attend_to_pads: bool = False  # let attention see pad tokens (default: key-padding mask hides them)

    def validate(self) -> None:
        _positive(self, "image_size", "text_width", "text_layers", "text_heads", "context_length")
        for name, most in MODEL_LIMITS.items():
            if getattr(self, name) > most:
                raise ConfigError(f"model.{name} must be <= {most}, got {getattr(self, name)} (a larger model than "
                                  "any this workbench builds: a damaged or hostile config)")
        if not 0.0 < self.mlp_ratio <= MAX_MLP_RATIO or self.text_width * self.mlp_ratio < 1:
            raise ConfigError(f"model.mlp_ratio must be in (0, {MAX_MLP_RATIO}] (an MLP of at least one unit), got "
                              f"{self.mlp_ratio}")
        check_encoder_kwargs(self.encoder_kwargs)
        if self.text_width % self.text_heads:
            raise ConfigError(f"model.text_width ({self.text_width}) must be divisible by model.text_heads "
                              f"({self.text_heads})")
        if self.context_length < 3:
            raise ConfigError("model.context_length must be >= 3 (<sot>, one token, <eot>)")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"model.dropout must be in [0, 1), got {self.dropout}")
        _choice(self, "output_vocab", ("full", "corpus"))
        if self.output_vocab_size < 0:
            raise ConfigError("model.output_vocab_size must be >= 0")


@dataclass
class ObjectiveConfig:
    """Training objective. `name` picks a row of the objective table in `mdc_core.objectives`."""

    name: str = "mdc"  # a row of the objective table: mdc | mdc_no_t | bert | parallel | arc | clip | a plug-in's
    t_low: float = 0.5  # MDC: lower end w_l of t ~ U[w_l, w_u] (paper default 0.5)
    t_high: float = 1.0  # MDC: upper end w_u
    mask_ratio: float = 0.15  # bert: fixed masking ratio r (parallel forces r = 1)
    normalization: str = "per_token"  # per_token (MDLM NELBO / all valid tokens) | per_sequence (CapPa-style)
    antithetic_t: bool = False  # stratified (low-discrepancy) t across the batch, as MDLM's _sample_t
    min_one_masked: bool = False  # force >= 1 masked token per caption (biased; default keeps the estimator unbiased)
    # the keys plug-ins add (registry.register_settings), read as cfg.objective.<key>; one object per plug-in, no key
    plugins: dict[str, Any] = field(default_factory=lambda: _plugin_settings("objective"), repr=False,
                                    metadata={"plugin_settings": "objective"})

    def __getattr__(self, name: str) -> Any:  # only called for names that are not fields: a plug-in's keys
        if not name.startswith("_"):
            for settings in self.__dict__.get("plugins", {}).values():
                if name in settings.__dataclass_fields__:
                    return getattr(settings, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ObjectiveConfig:
        """The validated section from its keys (plug-ins' keys included), as a config file spells them."""
        section: ObjectiveConfig = _build(cls, data, "objective.")
        section.validate()
        return section

    def validate(self) -> None:
        if self.name not in registry.OBJECTIVES:  # a name the core lacks: maybe a plug-in's (loaded only then)
            registry.load_plugins()
        _choice(self, "name", tuple(registry.OBJECTIVES))
        _choice(self, "normalization", ("per_token", "per_sequence"))
        if not 0.0 <= self.t_low < self.t_high <= 1.0:
            raise ConfigError(f"objective.t_low/t_high must satisfy 0 <= t_low < t_high <= 1, "
                              f"got [{self.t_low}, {self.t_high}]")
        if not 0.0 < self.mask_ratio <= 1.0:
            raise ConfigError(f"objective.mask_ratio must be in (0, 1], got {self.mask_ratio}")
        for settings in self.plugins.values():
            if hasattr(settings, "validate"):
                settings.validate(self)


@dataclass
class DataConfig:
    """Where the image-caption pairs come from and how they are read."""

    path: str = ""  # shard dir / brace pattern / .csv / .tsv / COCO .json (required for training)
    images: str = ""  # folder a caption table's/json's image paths are relative to ("": found, see mdc_core.sources)
    path_as_given: str = ""  # data.path as the user typed it (display; training stores `path` resolved)
    format: str = "auto"  # auto | wds | csv | tsv | coco
    shuffle_buffer: int = 1000  # samples held for shuffling streamed shards (0 = no shuffle)
    augment: str = "none"  # none | rrc (random resized crop; breaks position words, so off for synthetic data)
    num_workers: int = 0  # DataLoader worker processes
    in_memory: bool = False  # decode each split once and hold it in memory (small sets; mdc_core.data.MemoryBatches)

    def validate(self) -> None:
        _choice(self, "format", ("auto", "wds", "csv", "tsv", "coco"))
        _choice(self, "augment", ("none", "rrc"))
        if self.in_memory and self.augment != "none":
            raise ConfigError("data.in_memory holds the images after the evaluation crop; it needs data.augment='none'")
        if self.shuffle_buffer < 0 or self.num_workers < 0:
            raise ConfigError("data.shuffle_buffer and data.num_workers must be >= 0")


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping (paper appendix A defaults for ViT-B/32)."""

    steps: int = 100_000  # optimizer steps
    batch_size: int = 128  # per-device micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 5e-4  # peak learning rate
    betas: tuple[float, float] = (0.9, 0.98)  # AdamW betas
    weight_decay: float = 0.1  # AdamW decoupled weight decay
    warmup_steps: int = 10_000  # linear warm-up steps, then cosine decay to min_lr_ratio * lr
    min_lr_ratio: float = 0.0  # floor of the cosine schedule as a fraction of lr
    grad_clip: float = 0.0  # max global grad norm (0 = off; the paper clips at 1.0 for ARC ViT-L only)
    ema_decay: float = 0.0  # EMA of weights (0 = off; MDLM uses 0.9999)
    precision: str = "auto"  # auto (bf16 autocast on GPUs with bf16 in hardware, else fp32) | fp32 | bf16
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    seed: int = 0  # seeds model init, masking and data order
    log_every: int = 10  # steps between metrics lines
    ckpt_every: int = 500  # steps between checkpoints (the last step is always saved)
    ckpt_every_minutes: float = 0.0  # also checkpoint when this much wall time passed since the last (0 = off)
    keep_last: int = 2  # checkpoints kept on disk
    nonfinite: str = "stop"  # NaN/inf loss or grad norm: stop (keep the last good checkpoint) | skip the update
    max_skipped_steps: int = 20  # with nonfinite=skip: stop after this many consecutive skipped updates
    dist_timeout_s: int = 600  # torchrun: a collective waiting longer than this (a rank died or hangs) fails
    # torch.compile of forward + loss + backward: "auto" (loss_step.compile_mode: reduce-overhead on one CUDA device
    # with grad_accum 1, else off) | false | true (= "default") | "reduce-overhead" (CUDA graphs) | "max-autotune"
    compile: bool | str = "auto"
    # shapes a compiled step never recompiles for: "auto" (padded when compiling, else off) | off | padded (captions
    # trimmed to a multiple of length_bucket, loss terms padded to one of 8 counts) | dense (logits everywhere)
    static_shapes: str = "auto"
    compile_step: bool = False  # forward to AdamW and EMA as one compiled region (loss_step.WholeStep; compile's mode)
    length_bucket: int = 8  # with static shapes: caption lengths are rounded up to a multiple of this
    tensorboard: bool = False  # also write TensorBoard events into the run folder (rank 0; the run hook "tensorboard")

    def validate(self) -> None:
        _positive(self, "steps", "batch_size", "grad_accum", "lr", "log_every", "ckpt_every", "keep_last",
                  "max_skipped_steps", "dist_timeout_s", "length_bucket")
        if not isinstance(self.compile, bool) and self.compile not in COMPILE_MODES:
            raise ConfigError(f"train.compile must be true, false or one of {', '.join(COMPILE_MODES)}; "
                              f"got {self.compile!r}")
        _choice(self, "static_shapes", STATIC_SHAPES)
        _choice(self, "nonfinite", ("stop", "skip"))
        if self.compile_step and (self.grad_accum > 1 or self.nonfinite == "skip"):  # one micro-batch with its update
            raise ConfigError("train.compile_step needs train.grad_accum=1 and train.nonfinite=stop")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"train.betas must be two numbers in [0, 1), got {self.betas}")
        if self.ckpt_every_minutes < 0:
            raise ConfigError(f"train.ckpt_every_minutes must be >= 0 (0 = off), got {self.ckpt_every_minutes}")
        if self.weight_decay < 0 or self.grad_clip < 0 or self.warmup_steps < 0:
            raise ConfigError("train.weight_decay, train.grad_clip and train.warmup_steps must be >= 0")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"train.ema_decay must be in [0, 1), got {self.ema_decay}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"train.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _choice(self, "precision", PRECISIONS)
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ConfigError(f"train.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")


@dataclass(frozen=True)
class Option:
    """One field of a config section as the command line, its range check and the app show it (:func:`option`)."""

    name: str  # the field, the flag (--name-with-dashes) and the app's parameter
    type: type  # int or float
    default: Any
    help: str  # what it does: the flag's help
    label: str  # the app control's label
    range: tuple[float, float] | None  # inclusive bounds (checked by validate; the slider's ends); None: any value

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def problem(self, value: float) -> str | None:
        """Why `value` is outside :attr:`range` ("must be in [lo, hi]"), or None."""
        if self.range is None or self.range[0] <= value <= self.range[1]:
            return None
        return f"must be in [{self.range[0]:g}, {self.range[1]:g}]"


def option(default: Any, help: str, *, label: str = "", range: tuple[float, float] | None = None) -> Any:
    """A config field declared for the command line, its checks and the app (:class:`Option`): its default, `help`,
    the app's `label` (`help` when empty) and its inclusive `range`."""
    return field(default=default, metadata={"help": help, "label": label or help, "range": range})


def options(section: type) -> tuple[Option, ...]:
    """The fields of config dataclass `section` declared with :func:`option`, in declaration order."""
    hints = typing.get_type_hints(section)
    return tuple(Option(f.name, hints[f.name], f.default, f.metadata["help"], f.metadata["label"], f.metadata["range"])
                 for f in dataclasses.fields(section) if "help" in f.metadata)


@dataclass
class SamplerConfig:
    """Greedy confidence unmasking (paper Eq. 6) and its options, each an :func:`option` from which ``mdc sample``'s
    flags, their checks and the app's controls are generated: a new option is its field and its use in the sampler."""

    length: int = option(15, "caption length N' in tokens", label="caption length N'", range=(1, 75))
    tokens_per_step: int = option(1, "tokens revealed per step k, 1 as the paper", label="tokens revealed per step k",
                                  range=(1, 75))
    temperature: float = option(0.0, "0 = greedy argmax; > 0 samples the candidate tokens",
                                label="temperature (0 = greedy)", range=(0.0, 2.0))
    top_k: int = option(0, "with temperature > 0, sample among the k best tokens, 0 = all",
                        label="top-k (0 = all tokens)", range=(0, 100))
    seed: int = option(0, "seed for temperature sampling", label="seed (temperature > 0)")
    threshold: float = option(0.0, "parallel decoding (Fast-dLLM): also reveal every masked token this confident, "
                              "0 = off", label="confidence threshold", range=(0.0, 1.0))
    remask_threshold: float = option(0.0, "revisable tokens: once the caption is complete, mask again tokens revealed "
                                     "with confidence below this and predict them anew; needs remask_steps",
                                     label="remask tokens below this confidence", range=(0.0, 1.0))
    remask_steps: int = option(0, "revisable tokens: at most this many extra steps, 0 = off",
                               label="remasking: extra steps at most (0 = greedy)", range=(0, 75))

    def validate(self) -> None:
        for opt in options(type(self)):
            problem = opt.problem(getattr(self, opt.name))
            if problem:
                raise ConfigError(f"sampler.{opt.name} {problem}, got {getattr(self, opt.name)}")
        if (self.remask_threshold > 0) != (self.remask_steps > 0):
            raise ConfigError("remasking needs both sampler.remask_threshold > 0 and sampler.remask_steps > 0 "
                              f"(got {self.remask_threshold} and {self.remask_steps}); set both, or both to 0")

    @property
    def remasking(self) -> bool:
        """True when revisable-token sampling is on."""
        return self.remask_steps > 0 and self.remask_threshold > 0


def sampler_options() -> tuple[Option, ...]:
    """The options of :class:`SamplerConfig`: what the command line, its checks and the app are generated from."""
    return options(SamplerConfig)


@dataclass
class RunConfig:
    """Everything that defines a run; saved as ``config.json`` in the run folder and in every checkpoint."""

    model: ModelConfig = field(default_factory=ModelConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    preset: str = ""  # name of the preset this config started from (informational)

    def validate(self) -> RunConfig:
        for section in (self.model, self.objective, self.data, self.train, self.sampler):
            section.validate()
        if self.model.attend_to_pads and self.train.static_shapes not in ("auto", "off"):  # auto: off for such a model
            raise ConfigError(f"train.static_shapes={self.train.static_shapes} pads captions to fixed lengths, which "
                              "changes the loss of a model with model.attend_to_pads=true; set train.static_shapes=off")
        if self.sampler.length > self.model.context_length - 2:
            raise ConfigError(f"sampler.length ({self.sampler.length}) exceeds model.context_length - 2 "
                              f"({self.model.context_length - 2})")
        return self

    def to_dict(self) -> dict[str, Any]:
        """A plain JSON tree (tuples as lists), the plug-ins' keys among those of their section."""
        return json.loads(json.dumps(_plain(self)))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        return _build(cls, data, "").validate()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"config file not found: {path}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path} is not valid JSON: {err}") from err
        except RecursionError:  # what json raises for nesting deeper than the interpreter's stack
            raise ConfigError(f"{path} is not a run config: its JSON is nested too deeply") from None
        return cls.from_dict(data)


# -- presets and overrides ---------------------------------------------------------------------------------------------


def list_presets() -> list[str]:
    """Names of the registered presets (the JSON file names in ``mdc_core/presets``)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_preset(name: str, overrides: list[str] | None = None) -> RunConfig:
    """Load preset `name` and apply ``section.key=value`` overrides."""
    path = PRESET_DIR / f"{name}.json"
    if not path.is_file():
        raise ConfigError(f"unknown preset {name!r}; available: {', '.join(list_presets())}")
    data = {**json.loads(path.read_text()), "preset": name}
    return apply_overrides(_build(RunConfig, data, ""), overrides or [])


def apply_overrides(cfg: RunConfig, overrides: list[str]) -> RunConfig:
    """A validated copy of `cfg` with ``section.key=value`` strings applied: values parsed as JSON when possible
    (``train.betas=[0.9,0.95]``, ``model.pretrained=true``), else taken as strings, then type-checked."""
    data = cfg.to_dict()
    for item in overrides:
        key, sep, raw = item.partition("=")
        parts = key.strip().split(".")
        if not sep or len(parts) != 2 or not all(parts):
            raise ConfigError(f"override {item!r} must look like section.key=value")
        section, name = parts
        if section not in data or not isinstance(data[section], dict):
            raise ConfigError(f"unknown config section {section!r} in override {item!r}; "
                              f"sections: {', '.join(k for k, v in data.items() if isinstance(v, dict))}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        except RecursionError:  # what json raises for nesting deeper than the interpreter's stack
            raise ConfigError(f"override {key.strip()}: its value is nested too deeply to be a config value") from None
        data[section][name] = value
    return RunConfig.from_dict(data)


# -- strict construction -----------------------------------------------------------------------------------------------


def _plugin_settings(section: str) -> dict[str, Any]:
    """One default settings object per dataclass the plug-ins registered for config section `section`."""
    return {_settings_key(cls): cls() for cls in registry.settings_for(section)}


def _settings_key(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _plain(obj: Any) -> Any:
    """``dataclasses.asdict`` of a config, with each section's plug-in settings merged into its keys."""
    if not dataclasses.is_dataclass(obj):
        return obj
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if "plugin_settings" in f.metadata:  # a plug-in's keys only where they differ from its defaults, so a
            for settings in value.values():  # run's config holds its own objective's keys (and old ones load)
                out.update({k: v for k, v in dataclasses.asdict(settings).items()
                            if v != type(settings).__dataclass_fields__[k].default})
        else:
            out[f.name] = _plain(value)
    return out


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'} must be a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    if any("plugin_settings" in f.metadata for f in fields) and set(data) - {f.name for f in fields}:
        registry.load_plugins()  # a key the core lacks: an extension's (an old run's config), or a typo
    names = [f.name for f in fields if "plugin_settings" not in f.metadata]
    plugins: dict[type, dict[str, Any]] = {settings: {} for f in fields if "plugin_settings" in f.metadata
                                           for settings in registry.settings_for(f.metadata["plugin_settings"])}
    owner = {name: settings for settings in plugins for name in settings.__dataclass_fields__}
    kwargs = {}
    for key, value in data.items():
        where = f"{prefix}{key}"
        if key in owner:
            plugins[owner[key]][key] = value
            continue
        if key not in names:
            known = [*names, *owner]
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {prefix}{close[0]}?" if close else f"; known keys: {', '.join(known)}"
            raise ConfigError(f"unknown config key {where!r}{hint}")
        kwargs[key] = _coerce(hints[key], value, where)
    for f in fields:
        if "plugin_settings" in f.metadata:
            kwargs[f.name] = {_settings_key(s): _build(s, keys, prefix) for s, keys in plugins.items()}
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, where + ".")
    origin = typing.get_origin(tp)
    if origin is types.UnionType:  # e.g. bool | str: the first member type the value has
        members = typing.get_args(tp)
        for member in members:
            if isinstance(value, member) and not (member is int and isinstance(value, bool)):
                return _coerce(member, value, where)
        names = " or ".join(m.__name__ for m in members)
        raise ConfigError(f"{where} must be {names}, got {value!r}")
    as_given = {bool: "true or false", int: "an integer", str: "a string"}  # types taken as they are (a bool is no int)
    if tp in as_given:
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ConfigError(f"{where} must be {as_given[tp]}, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        if not math.isfinite(value):  # JSON's Infinity and NaN parse, but no config value may be one
            raise ConfigError(f"{where} must be a finite number, got {value!r}")
        return float(value)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where} must be a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=False)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a JSON object, got {value!r}")
        return dict(value)
    raise ConfigError(f"{where}: unsupported config type {tp}")  # pragma: no cover - guards new field types


def _positive(obj: Any, *names: str) -> None:
    section = type(obj).__name__.replace("Config", "").lower()
    for name in names:
        if getattr(obj, name) <= 0:
            raise ConfigError(f"{section}.{name} must be > 0, got {getattr(obj, name)}")


def check_encoder_kwargs(kwargs: dict[str, Any], where: str = "model.encoder_kwargs") -> None:
    """:class:`ConfigError` unless every number in `kwargs` (lists included; `where` names them) is finite and at
    most :data:`ENCODER_KWARG_MAX` in size, a depth at most :data:`ENCODER_DEPTH_MAX` (timm builds what they say)."""
    for key, value in kwargs.items():
        deep = key == "depth" or key.endswith(("_depth", "layers"))
        most = ENCODER_DEPTH_MAX if deep else ENCODER_KWARG_MAX
        for x in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                continue
            if not math.isfinite(x) or abs(x) > most:
                raise ConfigError(f"{where}.{key} must be a finite number of at most {most} in size, got {x!r}")


def _choice(obj: Any, name: str, choices: tuple[str, ...]) -> None:
    section = type(obj).__name__.replace("Config", "").lower()
    if getattr(obj, name) not in choices:
        raise ConfigError(f"{section}.{name} must be one of {', '.join(choices)}; got {getattr(obj, name)!r}")
