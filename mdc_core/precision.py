"""Numeric precision of training and inference: bf16 autocast on CUDA by default, fp32 on the CPU.

One rule for both (``precision`` = ``auto`` | ``fp32`` | ``bf16``): ``auto`` means bf16 autocast on a CUDA device that
supports it and fp32 elsewhere (a CPU without native bf16 runs bf16 matmuls hundreds of times slower). Autocast
keeps the weights in fp32 and runs matmuls and attention in bf16; losses, softmaxes of scores and likelihoods are
taken in fp32 (the sampler and scorers call ``.float()`` on the logits).

Inference (:func:`mdc_core.sampler.sample`, :func:`mdc_core.scoring.score_tokens`) takes ``precision=None`` to mean
"the current default", which is ``auto`` unless a caller set another for a block of code with
:func:`default_inference_precision` (how ``mdc ... --precision`` reaches the sampling and scoring inside the eval
verbs without every function passing it on).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch

from .config import PRECISIONS

_DEFAULT: contextvars.ContextVar[str] = contextvars.ContextVar("mdc_inference_precision", default="auto")


def check_precision(precision: str) -> str:
    """`precision` if it is one of :data:`~mdc_core.config.PRECISIONS`; ValueError naming the choices otherwise."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return precision


def bf16_enabled(precision: str, device: torch.device | str) -> bool:
    """Whether `precision` means bf16 autocast on `device` (``auto``: on CUDA with bf16 support only)."""
    device = torch.device(device)
    if check_precision(precision) == "auto":
        return device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    return precision == "bf16"


@contextlib.contextmanager
def default_inference_precision(precision: str) -> Iterator[None]:
    """Within the block, sampling and scoring called with ``precision=None`` use `precision`."""
    token = _DEFAULT.set(check_precision(precision))
    try:
        yield
    finally:
        _DEFAULT.reset(token)


def inference_precision(precision: str | None = None) -> str:
    """`precision`, or the current default when None (see :func:`default_inference_precision`)."""
    return _DEFAULT.get() if precision is None else check_precision(precision)


def inference_autocast(precision: str | None, device: torch.device | str) -> torch.autocast:
    """The autocast context of inference in `precision` (None: the current default) on `device`. For fp32 it is
    a disabled autocast, so that fp32 also holds inside a caller's bf16 region."""
    device = torch.device(device)
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16_enabled(inference_precision(precision),
                                                                                  device))
