"""CLIPScore (Hessel et al., 2021): ``2.5 * max(cos(image, caption), 0)``, reference-free.

No pretrained CLIP can be downloaded here, so the scorer is either the workbench's own CLIP baseline (a run
trained with ``objective.name = "clip"``, :class:`~mdc_core.factory.CLIPModel`) or a local open_clip
checkpoint file (``open_clip.create_model_and_transforms(name, pretrained=PATH)``). Scores from different
scorers are not comparable with each other, nor with the paper's ViT-B/32 numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F

from mdc_core.tokenizer import EOT_ID, SOT_ID, CaptionTokenizer

CLIPSCORE_W = 2.5  # Hessel et al.'s rescaling weight


class CLIPScorer(Protocol):
    def embed_images(self, images: torch.Tensor) -> torch.Tensor: ...  # (B, 3, H, W) normalised -> (B, E)
    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor: ...  # B captions -> (B, E)


def clip_score_from_embeddings(image_z: torch.Tensor, text_z: torch.Tensor, w: float = CLIPSCORE_W) -> torch.Tensor:
    """(B,) ``w * max(cos(image_z[b], text_z[b]), 0)`` for paired rows of (B, E) embeddings."""
    return w * F.cosine_similarity(image_z.float(), text_z.float(), dim=-1).clamp(min=0)


class WorkbenchCLIPScorer:
    """The workbench's CLIP baseline. Caption words outside its corpus vocabulary are dropped (and counted in
    ``dropped_tokens``), since a corpus-restricted text tower cannot embed them."""

    def __init__(self, model: torch.nn.Module) -> None:
        if not hasattr(model, "embed_image") or not hasattr(model, "encode_text"):
            raise ValueError("WorkbenchCLIPScorer needs a CLIP model (a run trained with objective 'clip')")
        self.model = model.eval()
        self.tokenizer = CaptionTokenizer(model.cfg.context_length)
        self.dropped_tokens = 0

    @torch.no_grad()
    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        device = next(self.model.parameters()).device
        return self.model.embed_image(images.to(device))

    @torch.no_grad()
    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        index = self.model.input_index  # (EMBED_SIZE,) id -> row, -1 outside the vocabulary
        L = self.model.cfg.context_length
        rows = torch.zeros(len(texts), L, dtype=torch.long)
        for i, text in enumerate(texts):
            ids = [t for t in self.tokenizer.encode_text(text) if int(index[t]) >= 0]
            self.dropped_tokens += len(self.tokenizer.encode_text(text)) - len(ids)
            seq = [SOT_ID, *ids[: L - 2], EOT_ID]
            rows[i, : len(seq)] = torch.tensor(seq)
        return self.model.encode_text(rows.to(index.device))


class OpenCLIPScorer:
    """A local open_clip checkpoint (nothing is downloaded). Images arrive normalised with the OpenAI CLIP
    mean/std, as the workbench's loaders write them, and are resized to the model's resolution."""

    def __init__(self, model_name: str, checkpoint: str | Path, device: str = "cpu") -> None:
        import open_clip

        if not Path(checkpoint).is_file():
            raise FileNotFoundError(f"open_clip checkpoint not found: {checkpoint}")
        self.model, _, _ = open_clip.create_model_and_transforms(model_name, pretrained=str(checkpoint),
                                                                 device=device)
        self.model.eval()
        self.tokenizer = open_clip.get_tokenizer(model_name)
        self.size = self.model.visual.image_size
        self.device = device

    @torch.no_grad()
    def embed_images(self, images: torch.Tensor) -> torch.Tensor:
        size = self.size if isinstance(self.size, (tuple, list)) else (self.size, self.size)
        x = F.interpolate(images.to(self.device), size=tuple(size), mode="bicubic", align_corners=False)
        return self.model.encode_image(x)

    @torch.no_grad()
    def embed_texts(self, texts: Sequence[str]) -> torch.Tensor:
        return self.model.encode_text(self.tokenizer(list(texts)).to(self.device))


def clip_scores(scorer: CLIPScorer, images: torch.Tensor, texts: Sequence[str], batch_size: int = 128) -> torch.Tensor:
    """(B,) CLIPScore of caption texts[b] for images[b] (normalised (B, 3, H, W))."""
    if len(texts) != len(images):
        raise ValueError(f"{len(images)} images but {len(texts)} captions")
    out = []
    for i in range(0, len(texts), batch_size):
        out.append(clip_score_from_embeddings(scorer.embed_images(images[i:i + batch_size]),
                                              scorer.embed_texts(texts[i:i + batch_size])).cpu())
    return torch.cat(out)


def load_clip_scorer(path: str | Path, open_clip_model: str = "", device: str = "cpu") -> CLIPScorer:
    """A workbench CLIP run folder (or checkpoint folder), or with `open_clip_model` a local open_clip file."""
    if open_clip_model:
        return OpenCLIPScorer(open_clip_model, path, device)
    from mdc_core.factory import load_model

    model, cfg = load_model(path, device=device)
    if cfg.objective.name != "clip":
        raise ValueError(f"{path} is a {cfg.objective.name!r} run, not a CLIP run (objective 'clip'); CLIPScore "
                         "needs the CLIP baseline or a local open_clip checkpoint")
    return WorkbenchCLIPScorer(model)
