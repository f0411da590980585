"""Probe features of a seed stack's members in one pass over the images (issue 63, item 3).

:func:`stacked_features` reads and decodes each batch of a probe data set once for all K members (what
:func:`mdc_workbench.eval.probe_data.extract_features` does for one model) and gives every member's frozen features
(``model.pooled_features(images, pool)``): mode ``vmap`` runs the K encoders as one vmapped forward over the stacked
encoder weights (:func:`~mdc_workbench.seed_stack.stacked.stack_models`; on the CPU under the math attention, as the
training step), mode ``each`` the members one after another with the solo kernels (then member k's features are
``extract_features`` of its model to the bit). Member k's rows are the features its solo probe would train on, so
the probes that follow (:func:`mdc_workbench.eval.probe.linear_probe` on each member's) are the solo runs' probes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn.attention import SDPBackend, sdpa_kernel

from mdc_workbench.eval.probe_data import ProbeDataset

from .stacked import stack_models


@torch.no_grad()
def stacked_features(models: Sequence[nn.Module], data: ProbeDataset, *, pool: str, image_size: int,
                     batch_size: int = 64, device: str | torch.device = "cpu", mode: str = "auto"
                     ) -> tuple[Tensor, dict[str, Tensor]]:
    """Every member's frozen features (K, N, D) float32 and the labels {task: (N,)} of split `data`, one read of
    its images for all members. `models`: the members (one architecture, e.g. :func:`~mdc_core.checkpoint.
    load_model` of each member folder); `mode` ``vmap``, ``each`` or ``auto`` (each on the CPU, vmap elsewhere)."""
    if mode not in ("auto", "vmap", "each"):
        raise ValueError(f"stacked features mode {mode!r}: choose one of auto, vmap, each")
    device = torch.device(device)
    mode = ("each" if device.type == "cpu" else "vmap") if mode == "auto" else mode
    members = [m.to(device).eval() for m in models]
    stacked = Pooled(stack_models(members), pool).eval() if mode == "vmap" else None  # one architecture, or raises
    if stacked is not None:
        params = {n: p.detach() for n, p in stacked.named_parameters()}  # (K, ...) each
        buffers = dict(stacked.named_buffers())

        def one(p: dict, b: dict, x: Tensor) -> Tensor:
            return functional_call(stacked, (p, b), (x,))

    feats: list[Tensor] = []
    labels: dict[str, list[Tensor]] = {t: [] for t in data.classes}
    for images, batch_labels in data.read(image_size, batch_size):
        images = images.to(device)
        if stacked is None:
            feats.append(torch.stack([m.pooled_features(images, pool).float().cpu() for m in members]))  # (K, B, D)
        else:
            math = sdpa_kernel(SDPBackend.MATH) if device.type == "cpu" else contextlib.nullcontext()
            with math:
                out = torch.vmap(one, in_dims=(0, 0, None), randomness="error")(params, buffers, images)
            feats.append(out.float().cpu())  # (K, B, D)
        for t in labels:
            labels[t].append(batch_labels[t])
    if not feats:
        raise ValueError(f"the {data.split} split of {data.root} holds no usable image")
    return torch.cat(feats, dim=1), {t: torch.cat(v) for t, v in labels.items()}


class Pooled(nn.Module):
    """``model.pooled_features(images, pool)`` as a module's forward (what ``functional_call`` calls)."""

    def __init__(self, model: nn.Module, pool: str) -> None:
        super().__init__()
        self.model, self.pool = model, pool

    def forward(self, images: Tensor) -> Tensor:
        return self.model.pooled_features(images, self.pool)
