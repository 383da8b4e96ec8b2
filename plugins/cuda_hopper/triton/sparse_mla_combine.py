"""Merge split-K partial results of sparse MLA with the log-sum-exp rule.

Split ``s`` holds ``o_s`` (its own softmax-normalised output, fp32) and ``lse_s`` (natural log; ``-inf`` when
it saw no valid index). With ``m = max_s lse_s``: ``w_s = exp(lse_s - m)``, ``out = sum_s w_s o_s / sum_s w_s``,
``lse = m + log(sum_s w_s)``. When every split is empty: zeros and ``lse = +inf`` (the contract's convention).
One program per (query row, block of ``BLOCK_HC`` heads); splits are walked in a fixed order (deterministic).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
TARGET_PROGRAMS = 264  # two per SM of an H100: head blocks get wider only while this many programs remain


@triton.jit
def _combine_kernel(part_ptr, plse_ptr, out_ptr, lse_ptr, n_splits, n_rows, d_v, stride_ps, stride_ls,
                    BLOCK_HC: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr, PDL: tl.constexpr):
    if PDL:  # launched early (programmatic dependent launch): wait until the split kernel has finished and flushed
        tl.extra.cuda.gdc_wait()
    rows = tl.program_id(0) * BLOCK_HC + tl.arange(0, BLOCK_HC)  # flat (query row, head)
    r_ok = rows < n_rows
    rows64 = rows.to(tl.int64)
    offs_s = tl.arange(0, BLOCK_S)
    lse_s = tl.load(plse_ptr + offs_s[None, :] * stride_ls + rows64[:, None],
                    mask=r_ok[:, None] & (offs_s < n_splits)[None, :], other=float("-inf"))
    m = tl.max(lse_s, axis=1)
    empty = m == float("-inf")
    m_use = tl.where(empty, 0.0, m)
    w_sum = tl.sum(tl.exp(lse_s - m_use[:, None]), axis=1)
    offs_v = tl.arange(0, BLOCK_DV)
    mask = r_ok[:, None] & (offs_v < d_v)[None, :]
    acc = tl.zeros((BLOCK_HC, BLOCK_DV), tl.float32)
    for s in range(0, n_splits):
        w = tl.exp(tl.load(plse_ptr + s * stride_ls + rows64, mask=r_ok, other=float("-inf")) - m_use)
        part = tl.load(part_ptr + s * stride_ps + rows64[:, None] * d_v + offs_v[None, :], mask=mask, other=0.0)
        acc += tl.where(w[:, None] > 0.0, w[:, None] * part, 0.0)  # an empty split's partial is never trusted
    out = tl.where(empty[:, None], 0.0, acc / tl.where(empty, 1.0, w_sum)[:, None])
    tl.store(out_ptr + rows64[:, None] * d_v + offs_v[None, :], out.to(tl.bfloat16), mask=mask)
    tl.store(lse_ptr + rows64, tl.where(empty, float("inf"), m_use + tl.log(tl.where(empty, 1.0, w_sum))), mask=r_ok)


def heads_per_program(n_rows: int) -> int:
    """Rows (query row x head) per combine program: 1 on the GPU until ``TARGET_PROGRAMS`` programs remain
    at a wider block; 16 under the interpreter (whose cost is per program)."""
    if INTERPRET:
        return 16
    block = 1
    while block < 16 and n_rows // (2 * block) >= TARGET_PROGRAMS:
        block *= 2
    return block


def combine_splits(part: Tensor, part_lse: Tensor, block_hc: int | None = None,
                   pdl: bool = False) -> tuple[Tensor, Tensor]:
    """part ``[n, T, H, d_v]`` fp32 contiguous, part_lse ``[n, T, H]`` fp32 -> out ``[T, H, d_v]`` bf16, lse ``[T, H]``.

    ``pdl``: launch with programmatic dependent launch (SM90+, not under the interpreter), for a split kernel
    that signals ``griddepcontrol.launch_dependents`` (the TileLang decode: :mod:`..tilelang.pdl`); the kernel
    then waits for it with ``griddepcontrol.wait`` before reading the partials."""
    n, t_rows, heads, d_v = part.shape
    out = torch.empty(t_rows, heads, d_v, dtype=torch.bfloat16, device=part.device)
    lse = torch.empty(t_rows, heads, dtype=torch.float32, device=part.device)
    n_rows = t_rows * heads
    if n_rows == 0:
        return out, lse
    if not (part.is_contiguous() and part_lse.is_contiguous()):
        raise ValueError("combine_splits needs contiguous partials")
    block = block_hc or heads_per_program(n_rows)
    pdl = pdl and not INTERPRET and part.is_cuda and torch.cuda.get_device_capability(part.device)[0] >= 9
    _combine_kernel[(triton.cdiv(n_rows, block),)](
        part, part_lse, out, lse, n, n_rows, d_v, part.stride(0), part_lse.stride(0),
        BLOCK_HC=block, BLOCK_S=triton.next_power_of_2(max(n, 2)), BLOCK_DV=triton.next_power_of_2(d_v),
        PDL=pdl, num_warps=4, **({"launch_pdl": True} if pdl else {}),
    )
    return out, lse
