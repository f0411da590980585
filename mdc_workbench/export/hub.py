"""A captioner that Hugging Face's own loading call opens: :class:`MDCCaptioner`, a :class:`~mdc_core.model.Captioner`
with huggingface_hub's ``PyTorchModelHubMixin``.

``mdc export --format hf`` writes the folder this class reads (``config.json`` = the run's config, ``model.safetensors``
= the captioner), so a user types the Hub's usual call::

    from mdc_workbench.export import MDCCaptioner
    model = MDCCaptioner.from_pretrained("exported/")   # a local folder; a Hub repo id once uploaded
    model.save_pretrained("copy/")                      # the same layout back, card and meta.json included

The folder is also a checkpoint folder (``meta.json`` beside it), so :func:`mdc_core.factory.load_model` and every
``mdc`` verb read it too; ``save_pretrained`` writes ``meta.json`` as well (sizes, SHA-256, and the step of the folder
the model came from), and keeps the model card (``README.md``) of the local folder the model was loaded from, where
the mixin would write its "[More Information Needed]" template. Loading checks what it opens as ``load_model`` does,
before building anything: a local folder's ``model.safetensors`` must match the size and SHA-256 its ``meta.json``
records (a folder without one is checked from here on); ``config.json`` passes validation (every size bounded) and
must build exactly the tensors and shapes of the weights file's header
(:func:`~mdc_core.factory.check_fits`); an encoder named by a Hub name (``hf-hub:...``) is refused. Loading is
strict, unlike the mixin's default: a weights file that does not fit is a one-line ValueError, never a
half-initialised model. Nothing is downloaded unless a Hub repo id is given.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

from huggingface_hub import PyTorchModelHubMixin

from mdc_core.checkpoint import load_weights, verify_checkpoint
from mdc_core.config import RunConfig
from mdc_core.factory import check_fits
from mdc_core.model import Captioner
from mdc_core.registry import objective_spec
from mdc_core.sources import file_sha256

WEIGHTS = "model.safetensors"  # huggingface_hub's constants.SAFETENSORS_SINGLE_FILE


class MDCCaptioner(Captioner, PyTorchModelHubMixin, library_name="mdc-workbench", pipeline_tag="image-to-text",
                   tags=["masked-diffusion-captioning", "image-captioning"]):
    """A captioner built from a run's config as a plain dict (what ``config.json`` holds); the mixin saves that dict
    as ``config.json`` and passes it back to ``__init__`` in ``from_pretrained``."""

    def __init__(self, config: dict) -> None:
        run = config if isinstance(config, RunConfig) else RunConfig.from_dict(config)
        spec = objective_spec(run.objective.name)
        if spec.model != "captioner":
            raise ValueError(f"objective {run.objective.name!r} trains a {spec.model} model, not a captioner; load it "
                             "with mdc_core.factory.load_model")
        # the weights come from model.safetensors, never from the run's pretrained encoder file
        super().__init__(dataclasses.replace(run.model, pretrained=False, pretrained_path=""), causal=spec.causal)
        self.run_config = run
        self.card = b""  # the README.md of the folder it was loaded from (empty for none): save_pretrained keeps it
        self.source_meta: dict[str, Any] = {}  # step, weights, exported_from of that folder's meta.json

    @classmethod
    def _from_pretrained(cls, *, model_id: str, config: Any = None, **kwargs: Any) -> MDCCaptioner:
        """The mixin's loading, after the checks of the module docstring on a local folder `model_id` (the mixin
        builds the model before it reads the weights, so they come first)."""
        folder = Path(model_id)
        if folder.is_dir():
            weights = folder / WEIGHTS
            if not weights.is_file():
                raise FileNotFoundError(f"{weights} not found (an export folder holds config.json and {WEIGHTS})")
            if (folder / "meta.json").is_file():
                verify_checkpoint(folder, (WEIGHTS,))
            else:  # never in silence: the shapes are still checked against config.json below
                warnings.warn(f"{folder} has no meta.json, so its weights are not checked against recorded SHA-256 "
                              "digests (save_pretrained and mdc export write one); loading them unchecked",
                              stacklevel=3)
            if not isinstance(config, dict):
                raise ValueError(f"{folder / 'config.json'} is missing or not a JSON object")
            check_fits(RunConfig.from_dict(config), weights)
        model = super()._from_pretrained(model_id=model_id, config=config, **kwargs)
        if folder.is_dir():
            card, meta = folder / "README.md", folder / "meta.json"
            model.card = card.read_bytes() if card.is_file() else b""
            if meta.is_file():  # verified above
                saved = json.loads(meta.read_text())
                model.source_meta = {k: saved[k] for k in ("step", "weights", "exported_from") if k in saved}
        return model

    def _save_pretrained(self, save_directory: Path) -> None:
        """The mixin's ``model.safetensors``, then ``config.json`` (the run's config), ``meta.json`` as an export
        writes it (step, files, sizes, SHA-256), so the folder loads wherever an exported one does, and the card of
        the folder the model was loaded from."""
        super()._save_pretrained(save_directory)
        (save_directory / "config.json").write_text(json.dumps(self.run_config.to_dict(), sort_keys=True, indent=2))
        files = ["config.json", WEIGHTS]
        meta = {"step": 0, **self.source_meta, "complete": True, "files": files,
                "bytes": {f: (save_directory / f).stat().st_size for f in files},
                "sha256": {f: file_sha256(save_directory / f) for f in files}}
        (save_directory / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        if self.card:  # byte for byte; the mixin writes its template only where no README.md exists
            (save_directory / "README.md").write_bytes(self.card)

    @classmethod
    def _load_as_safetensor(cls, model: MDCCaptioner, model_file: str, map_location: str, strict: bool
                            ) -> MDCCaptioner:
        """Always strict (`strict` is ignored): :meth:`Captioner.load_state_dict` names what does not fit."""
        model.load_state_dict(load_weights(model_file))
        return model.to(map_location).eval()


def hub_captioner(cfg: RunConfig, state: dict[str, Any]) -> MDCCaptioner:
    """An :class:`MDCCaptioner` of the run config `cfg` holding the weights `state` (a captioner's state dict)."""
    model = MDCCaptioner(cfg.to_dict())
    model.load_state_dict(state)
    return model.eval()
