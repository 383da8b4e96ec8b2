"""Merge split-K partial results of sparse MLA with the log-sum-exp rule.

Split ``s`` holds ``o_s`` (its own softmax-normalised output, fp32) and ``lse_s`` (natural log; ``-inf`` when
it saw no valid index). With ``m = max_s lse_s``: ``w_s = exp(lse_s - m)``, ``out = sum_s w_s o_s / sum_s w_s``,
``lse = m + log(sum_s w_s)``. When every split is empty: zeros and ``lse = +inf`` (the contract's convention).
One program per (query row, head); splits are walked in a fixed order, so the result is deterministic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _combine_kernel(part_ptr, plse_ptr, out_ptr, lse_ptr, n_splits, d_v, stride_ps, stride_ls,
                    BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # flat (query row, head)
    offs_s = tl.arange(0, BLOCK_S)
    lse_s = tl.load(plse_ptr + offs_s * stride_ls + row, mask=offs_s < n_splits, other=float("-inf"))
    m = tl.max(lse_s, axis=0)
    empty = m == float("-inf")
    m_use = tl.where(empty, 0.0, m)
    w_sum = tl.sum(tl.exp(lse_s - m_use), axis=0)
    offs_v = tl.arange(0, BLOCK_DV)
    v_ok = offs_v < d_v
    acc = tl.zeros((BLOCK_DV,), tl.float32)
    for s in range(0, n_splits):
        w = tl.exp(tl.load(plse_ptr + s * stride_ls + row) - m_use)
        part = tl.load(part_ptr + s * stride_ps + row * d_v + offs_v, mask=v_ok, other=0.0)
        acc += tl.where(w > 0.0, w * part, 0.0)  # an empty split's partial is 0 anyway; never trust it
    out = tl.where(empty, 0.0, acc / tl.where(empty, 1.0, w_sum))
    tl.store(out_ptr + row * d_v + offs_v, out.to(tl.bfloat16), mask=v_ok)
    tl.store(lse_ptr + row, tl.where(empty, float("inf"), m_use + tl.log(tl.where(empty, 1.0, w_sum))))


def combine_splits(part: Tensor, part_lse: Tensor) -> tuple[Tensor, Tensor]:
    """part ``[n, T, H, d_v]`` fp32 contiguous, part_lse ``[n, T, H]`` fp32 -> out ``[T, H, d_v]`` bf16, lse ``[T, H]``."""
    n, t_rows, heads, d_v = part.shape
    out = torch.empty(t_rows, heads, d_v, dtype=torch.bfloat16, device=part.device)
    lse = torch.empty(t_rows, heads, dtype=torch.float32, device=part.device)
    if t_rows * heads == 0:
        return out, lse
    assert part.is_contiguous() and part_lse.is_contiguous()
    _combine_kernel[(t_rows * heads,)](
        part, part_lse, out, lse, n, d_v, part.stride(0), part_lse.stride(0),
        BLOCK_S=triton.next_power_of_2(max(n, 2)), BLOCK_DV=triton.next_power_of_2(d_v), num_warps=4,
    )
    return out, lse
