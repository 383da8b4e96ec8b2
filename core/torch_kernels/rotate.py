"""The indexer's normalized Walsh-Hadamard rotation as one fp32 GEMM with a cached matrix.

The reference computes it with log2(n) butterfly stages (seven small ops for n = 128); here it is one
``x @ (H / sqrt(n))`` matmul. ``H`` is symmetric with entries ``+-1`` and ``1 / sqrt(128)`` is applied
inside the matrix, so each output is a sum of 128 exactly-scaled fp32 terms: only the summation order
differs from the butterfly (well inside the kit's ``indexer.quant_q`` slack).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dsa_runtime.reference.hadamard import hadamard_matrix

_CACHE: dict[tuple[int, str], Tensor] = {}


def rotation_matrix(n: int, device: torch.device) -> Tensor:
    """``[n, n]`` fp32 ``H / sqrt(n)`` (Sylvester order), cached per size and device."""
    key = (n, str(device))
    m = _CACHE.get(key)
    if m is None:
        m = hadamard_matrix(n, device) * (1.0 / math.sqrt(n))
        _CACHE[key] = m
    return m


def hadamard_rotate(x: Tensor) -> Tensor:
    """``[..., n]`` bf16/fp32 -> ``[..., n]`` fp32 ``H x / sqrt(n)``."""
    n = x.shape[-1]
    return x.float() @ rotation_matrix(n, x.device)
