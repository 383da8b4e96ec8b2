"""The indexer's normalized Walsh-Hadamard rotation as one fp32 GEMM with a cached matrix.

The reference computes it with log2(n) butterfly stages (seven small ops for n = 128); here it is one
``x @ (H / sqrt(n))`` matmul. ``H`` is symmetric with entries ``+-1`` and ``1 / sqrt(128)`` is applied
inside the matrix, so each output is a sum of 128 exactly-scaled fp32 terms: only the summation order
differs from the butterfly. A bf16 input is rotated by a bf16 GEMM with the +-1 matrix (exact in bf16; the
sums accumulate in fp32 and are rounded once to bf16, 2**-9 relative, against the 2**-4 of the FP8 cast
that follows; the kit's ``indexer.quant_q`` rule allows a bf16 rotation), then scaled by 1/sqrt(n) in fp32: ~4x faster on CPUs with
AVX512-BF16, and the indexer's queries are its largest GEMM in a prefill. Below ``BF16_MIN_ROWS`` rows
(decode) fp32 is faster: a bf16 GEMM has a fixed cost of ~15 us on CPU.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dsa_runtime.reference.hadamard import hadamard_matrix

_CACHE: dict[tuple[int, str, torch.dtype], Tensor] = {}
BF16_MIN_ROWS = 64


def rotation_matrix(n: int, device: torch.device, dtype: torch.dtype = torch.float32) -> Tensor:
    """``[n, n]`` Sylvester matrix, cached per size, device and dtype: fp32 ``H / sqrt(n)``, or for bf16 the
    exact ``+-1`` ``H`` (``1 / sqrt(n)`` is not a bf16 value; the caller scales)."""
    key = (n, str(device), dtype)
    m = _CACHE.get(key)
    if m is None:
        h = hadamard_matrix(n, device)
        m = h.to(dtype) if dtype == torch.bfloat16 else h * (1.0 / math.sqrt(n))
        _CACHE[key] = m
    return m


def hadamard_rotate(x: Tensor) -> Tensor:
    """``[..., n]`` bf16 or fp32 -> ``[..., n]`` fp32 ``H x / sqrt(n)``."""
    n = x.shape[-1]
    if x.dtype == torch.bfloat16 and x.numel() >= BF16_MIN_ROWS * n:
        return (x @ rotation_matrix(n, x.device, torch.bfloat16)).float().mul_(1.0 / math.sqrt(n))
    return x.float() @ rotation_matrix(n, x.device)
