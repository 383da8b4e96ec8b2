"""Normalized Walsh-Hadamard rotation (Sylvester order) used by the lightning indexer.

The Sylvester matrix ``H_1 = [1]``, ``H_2m = [[H_m, H_m], [H_m, -H_m]]`` is symmetric with ``H @ H = n * I``, so
``x @ H / sqrt(n)`` equals ``H x / sqrt(n)`` per vector and is orthogonal: dot products ``q . k`` are
unchanged. It spreads outliers over all channels before the FP8 cast.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _check_pow2(n: int) -> None:
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")


def hadamard_matrix(n: int, device: torch.device | str = "cpu") -> Tensor:
    """The unnormalized ``[n, n]`` fp32 Sylvester Hadamard matrix (entries +-1)."""
    _check_pow2(n)
    h = torch.ones(1, 1, dtype=torch.float32, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], dim=1), torch.cat([h, -h], dim=1)], dim=0)
    return h


def hadamard_rotate(x: Tensor) -> Tensor:
    """Rotate the last dim: ``H x / sqrt(n)`` in fp32 (no intermediate rounding to the input dtype).

    Computed with the fast butterfly (log2(n) stages of ``(a + b, a - b)``) rather than a matmul: it is
    exactly the Sylvester product and only adds, so no TF32 or reduced-precision GEMM setting can touch it.

    Args:
        x: ``[..., n]`` bf16 or fp32, ``n`` a power of two (128 for the indexer).
    Returns:
        ``[..., n]`` fp32.
    """
    n = x.shape[-1]
    _check_pow2(n)
    y = x.float()
    half = 1
    while half < n:
        # Pair element i with i + half inside each block of 2 * half: one level of the Sylvester recursion.
        pairs = y.reshape(*x.shape[:-1], n // (2 * half), 2, half)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2)
        half *= 2
    return y.reshape(x.shape) * (1.0 / math.sqrt(n))
