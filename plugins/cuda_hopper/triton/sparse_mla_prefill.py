"""Sparse MLA forward kernel (absorbed / MQA form) over gathered latent rows, shared by prefill and decode.

One program per (query row ``t``, block of ``BLOCK_H`` heads, block of ``BLOCK_DV`` value columns, K split).
The query tile ``[BLOCK_H, 576]`` is loaded once, as a 512-wide latent part and a 64-wide rope part (both
powers of two, so each is one ``tl.dot``). The loop walks the row's indices ``BLOCK_N`` at a time, gathers
those KV rows (whole 1152-byte rows: coalesced; an index of ``-1``, past ``K`` or past the buffer is masked
and never dereferenced), scores them with two dots, and runs the online softmax in base 2 (``sm_scale *
log2(e)`` folded into one multiply). The same gathered latent tile is the value operand of ``P @ V`` when
``BLOCK_DV == 512``. Everything accumulates in fp32; ``P`` is rounded to the KV dtype for the second dot.

Outputs: with ``SPLIT`` false, ``out`` bf16 and natural-log ``lse`` (a row/head with no valid index: zeros and
``+inf``); with ``SPLIT`` true, the split's normalised fp32 partial output and its lse (``-inf`` when the split
saw no valid index), merged later by :mod:`.sparse_mla_combine`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from dsa_runtime.plugins.cuda_hopper.triton.online_softmax import finish_rows, softmax_block

D_NOPE = 512
D_ROPE = 64
LOG2E = 1.4426950408889634
# Under TRITON_INTERPRET=1 the dots run on fp32 copies: Triton 3.6's CPU interpreter mis-computes bf16 tl.dot.
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"


@dataclass(frozen=True)
class AttnConfig:
    """Launch shape: head tile, gathered rows per step, value columns per program, warps, pipeline stages."""

    block_h: int = 64
    block_n: int = 32
    block_dv: int = 512
    num_warps: int = 8
    num_stages: int = 2
    # "plain": _sparse_mla_kernel; "pipe": .sparse_mla_pipe (index prefetch, 256-wide halves); "pipew": prefetch
    # with one 512-wide latent tile (block_dv 512)
    variant: str = "plain"

    def label(self) -> str:
        tail = "" if self.variant == "plain" else f"_{self.variant}"
        return f"h{self.block_h}_n{self.block_n}_dv{self.block_dv}_w{self.num_warps}_s{self.num_stages}{tail}"


def head_tile(heads: int) -> int:
    """Smallest head tile covering ``heads`` among 16/32/64 (``tl.dot`` needs at least 16 rows)."""
    return 16 if heads <= 16 else 32 if heads <= 32 else 64


def default_config(heads: int, dtype: torch.dtype, kind: str = "prefill") -> AttnConfig:
    """The default launch shape for ``kind`` ("prefill" or "decode"): on the GPU the entry of
    :data:`.sparse_attn_candidates.BF16_DEFAULTS` for the head tile (bench/sparse_attn_triton.py --sweep)."""
    if dtype == torch.float32:  # the fp32 verification mode: twice the bytes per tile, IEEE dots
        return AttnConfig(block_h=min(head_tile(heads), 32), block_n=16, num_warps=4, num_stages=1)
    from dsa_runtime.plugins.cuda_hopper.triton.sparse_attn_candidates import BF16_DEFAULTS

    bh = head_tile(heads)
    gpu = BF16_DEFAULTS[kind][bh]
    if INTERPRET:  # the interpreter's cost is per loop step: fewer, wider steps of the GPU default's kernel
        return AttnConfig(block_h=bh, block_n=128, num_warps=4, num_stages=1, variant=gpu.variant)
    return gpu


# Sizes and counts change per call; specializing on them (value 1, divisibility by 16) would recompile per batch
# size. Strides stay specialized: a row stride divisible by 16 is what lets the gathers use 16-byte copies.
@triton.jit(do_not_specialize=["n_q_rows", "heads", "top_k", "n_kv_rows", "chunk", "n_hb", "n_dvb"])
def _sparse_mla_kernel(
    q_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr,
    n_q_rows, heads, top_k, n_kv_rows, chunk, d_v, n_hb, n_dvb,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_os, stride_ot, stride_oh, stride_ls, stride_lt,
    scale_log2,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr,
    SPLIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    dvb = pid % n_dvb
    rest = pid // n_dvb
    hb = rest % n_hb
    rest = rest // n_hb
    t = rest % n_q_rows
    split = rest // n_q_rows

    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < heads
    offs_d = tl.arange(0, 512)
    offs_r = 512 + tl.arange(0, 64)
    offs_v = dvb * BLOCK_DV + tl.arange(0, BLOCK_DV)

    q_rows = q_ptr + t.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh
    q_nope = tl.load(q_rows + offs_d[None, :], mask=h_ok[:, None], other=0.0)
    q_rope = tl.load(q_rows + offs_r[None, :], mask=h_ok[:, None], other=0.0)
    if UPCAST:
        q_nope = q_nope.to(tl.float32)
        q_rope = q_rope.to(tl.float32)

    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_DV), tl.float32)

    k_lo = split * chunk
    k_hi = tl.minimum(k_lo + chunk, top_k)
    idx_row = idx_ptr + t.to(tl.int64) * stride_it
    for k0 in range(k_lo, k_hi, BLOCK_N):
        offs_k = k0 + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_row + offs_k, mask=offs_k < k_hi, other=-1)
        valid = (idx >= 0) & (idx < n_kv_rows)
        kv_rows = kv_ptr + tl.where(valid, idx, 0).to(tl.int64) * stride_kv
        k_nope = tl.load(kv_rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        k_rope = tl.load(kv_rows[:, None] + offs_r[None, :], mask=valid[:, None], other=0.0)
        if UPCAST:
            k_nope = k_nope.to(tl.float32)
            k_rope = k_rope.to(tl.float32)
        s = tl.dot(q_nope, tl.trans(k_nope), input_precision=PRECISION)
        s = tl.dot(q_rope, tl.trans(k_rope), s, input_precision=PRECISION)
        m_new, l_i, alpha, p = softmax_block(s, valid, scale_log2, m_i, l_i)
        if BLOCK_DV == 512:
            v = k_nope
        else:
            v = tl.load(kv_rows[:, None] + offs_v[None, :], mask=valid[:, None], other=0.0).to(k_nope.dtype)
        acc = acc * alpha[:, None]
        # P rounded to the KV dtype (bf16 on the GPU); UPCAST keeps that rounding, then multiplies in fp32.
        acc = tl.dot(p.to(kv_ptr.dtype.element_ty).to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new

    out, lse, seen = finish_rows(acc, m_i, l_i)
    o_ptrs = (out_ptr + split.to(tl.int64) * stride_os + t.to(tl.int64) * stride_ot
              + offs_h[:, None] * stride_oh + offs_v[None, :])
    o_mask = h_ok[:, None] & (offs_v < d_v)[None, :]
    l_ptrs = lse_ptr + split.to(tl.int64) * stride_ls + t.to(tl.int64) * stride_lt + offs_h
    if SPLIT:
        tl.store(o_ptrs, out, mask=o_mask)
        tl.store(l_ptrs, tl.where(seen, lse, float("-inf")), mask=h_ok & (dvb == 0))
    else:
        tl.store(o_ptrs, out.to(tl.bfloat16), mask=o_mask)
        tl.store(l_ptrs, tl.where(seen, lse, float("inf")), mask=h_ok & (dvb == 0))


def _check(q: Tensor, kv: Tensor, indices: Tensor, d_v: int) -> None:
    if q.dim() != 3 or q.shape[-1] != D_NOPE + D_ROPE or kv.dim() != 2 or kv.shape[-1] != D_NOPE + D_ROPE:
        raise ValueError(f"expected q [T, H, 576] and kv [S, 576], got {tuple(q.shape)}, {tuple(kv.shape)}")
    if indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(f"expected indices [T, K] with T = {q.shape[0]}, got {tuple(indices.shape)}")
    if not 1 <= d_v <= D_NOPE:
        raise ValueError(f"d_v must be in [1, {D_NOPE}] (the latent width), got {d_v}")
    if q.dtype not in (torch.bfloat16, torch.float32) or kv.dtype != q.dtype:
        raise ValueError(f"q and kv must both be bf16 (or both fp32), got {q.dtype} and {kv.dtype}")


def sparse_mla_forward(
    q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int = D_NOPE, *,
    config: AttnConfig | None = None, num_splits: int = 1,
) -> tuple[Tensor, Tensor]:
    """Sparse MLA over rows of a flat buffer.

    Args:
        q: ``[T, H, 576]`` bf16 (or fp32: IEEE dots); kv: ``[S, 576]`` same dtype, rows contiguous;
        indices: ``[T, K]`` int32 rows of ``kv`` (``-1`` empty; anything outside ``[0, S)`` is skipped too).
        num_splits: ``1`` -> the final ``(out [T, H, d_v] bf16, lse [T, H] fp32)``; ``n > 1`` -> partials
            ``(out [n, T, H, d_v] fp32, lse [n, T, H] fp32)`` over ``n`` consecutive chunks of the K indices
            (a chunk with no valid index: lse ``-inf``), for :func:`.sparse_mla_combine.combine_splits`.
    """
    _check(q, kv, indices, d_v)
    t_rows, heads, _ = q.shape
    top_k = indices.shape[1]
    cfg = config or default_config(heads, q.dtype)
    split = num_splits > 1
    if split:
        out = torch.empty(num_splits, t_rows, heads, d_v, dtype=torch.float32, device=q.device)
        lse = torch.empty(num_splits, t_rows, heads, dtype=torch.float32, device=q.device)
    else:
        out = torch.empty(t_rows, heads, d_v, dtype=torch.bfloat16, device=q.device)
        lse = torch.empty(t_rows, heads, dtype=torch.float32, device=q.device)
    if t_rows == 0 or heads == 0:
        return out, lse
    if top_k == 0 or kv.shape[0] == 0:  # shape-only decision: nothing can be valid
        out.zero_()
        lse.fill_(float("-inf") if split else float("inf"))
        return out, lse
    if q.stride(-1) != 1:
        q = q.contiguous()
    if kv.stride(-1) != 1:
        kv = kv.contiguous()
    if indices.stride(-1) != 1 or indices.dtype != torch.int32:
        indices = indices.to(torch.int32).contiguous()
    chunk = triton.cdiv(triton.cdiv(top_k, num_splits), cfg.block_n) * cfg.block_n
    n_hb = triton.cdiv(heads, cfg.block_h)
    n_dvb = triton.cdiv(d_v, cfg.block_dv)
    so, sl = (out.stride(0), lse.stride(0)) if split else (0, 0)
    grid = (num_splits * t_rows * n_hb * n_dvb,)
    if cfg.variant == "pipe":
        if cfg.block_dv not in (256, 512):
            raise ValueError(f"the pipe variant needs block_dv 256 or 512, got {cfg.block_dv}")
        from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_pipe import _sparse_mla_pipe_kernel as kernel
    elif cfg.variant == "pipew":
        if cfg.block_dv != 512:
            raise ValueError(f"the pipew variant needs block_dv 512, got {cfg.block_dv}")
        from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_pipe import _sparse_mla_wide_kernel as kernel
    elif cfg.variant == "plain":
        kernel = _sparse_mla_kernel
    else:
        raise ValueError(f"unknown sparse MLA kernel variant {cfg.variant!r}; valid: plain, pipe, pipew")
    kernel[grid](
        q, kv, indices, out, lse,
        t_rows, heads, top_k, kv.shape[0], chunk, d_v, n_hb, n_dvb,
        q.stride(0), q.stride(1), kv.stride(0), indices.stride(0),
        so, out.stride(-3), out.stride(-2), sl, lse.stride(-2),
        sm_scale * LOG2E,
        BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, BLOCK_DV=cfg.block_dv,
        SPLIT=split, PRECISION="ieee" if q.dtype == torch.float32 or INTERPRET else "tf32", UPCAST=INTERPRET,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return out, lse


def flops(t_rows: int, heads: int, top_k: int, d_v: int = D_NOPE) -> int:
    """Matmul FLOPs of one call: ``2 * H * (576 + d_v) * K`` per query row."""
    return 2 * t_rows * heads * (D_NOPE + D_ROPE + d_v) * top_k

