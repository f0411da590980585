"""Comparisons of float tensors whose reduction order differs (padding, another CPU's kernels).

Float sums differ in their last bits between CPUs and between reduction orders, so an absolute tolerance that holds
on one machine fails on another for an element much smaller than the tensor it belongs to. These checks scale the
absolute tolerance to each tensor's magnitude: an element may be off by ``rel`` times the tensor's largest value.
They still fail on a real error: one element off by more than that (the guard in tests/core/test_numerics.py).
"""

from __future__ import annotations

import torch


def scaled_atol(expected: torch.Tensor, rel: float) -> float:
    """``rel`` times the largest magnitude in ``expected`` (at least the dtype's tiny, so a zero tensor compares)."""
    scale = float(expected.detach().abs().max()) if expected.numel() else 0.0
    return max(rel * scale, torch.finfo(expected.dtype).tiny)


def assert_close_to_scale(actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-4, msg: str | None = None):
    """``actual`` equals ``expected`` elementwise within ``rel`` of each element and ``rel`` of the tensor's scale."""
    torch.testing.assert_close(actual, expected, rtol=rel, atol=scaled_atol(expected, rel), msg=msg)
