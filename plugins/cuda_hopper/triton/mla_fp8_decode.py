"""Sparse MLA decode over the ``fp8_656`` paged cache (absorbed / MQA form), with split-K and a combine pass.

One program per (request-query ``m``, block of ``BLOCK_H`` heads, split ``s``). It keeps its queries in
registers (``[BLOCK_H, 512]`` latent + ``[BLOCK_H, 64]`` rope, bf16) and walks its share of the ``K`` selected
slots ``BLOCK_N`` at a time: it gathers the 656-byte rows through three typed views of the cache (e4m3 ``c``,
fp32 scales, bf16 ``k_pe``; slot ``-1`` is masked, never dereferenced), dequantizes ``c`` into bf16 in
registers (exact: an e4m3 value times a power of two fits bf16), computes ``S = q_c c^T + q_pe k_pe^T`` with
fp32 accumulation, an online softmax in base 2 (``sm_scale * log2(e)`` folded into ``S``), and ``acc += P c``.

Split-K (when ``B * Q * ceil(H / BLOCK_H)`` programs cannot fill the GPU) writes fp32 partial outputs and base-2
lse into a workspace sized from shapes; :func:`_combine_kernel` merges them (an empty split has lse ``-inf``).
The number of splits comes from shapes and the SM count only, so the call is CUDA-graph capturable.
A query with no valid slot gets zeros and ``lse = +inf``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from dsa_runtime.families import D_LATENT, D_QK, FP8_MLA_ROW_BYTES
from dsa_runtime.plugins.cuda_hopper.triton.moe_quant import INTERPRET
from dsa_runtime.plugins.cuda_hopper.triton.online_softmax import softmax_block
from dsa_runtime.plugins.cuda_hopper.triton.pdl import grid_sync, pdl_kwargs

LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape: heads per program, slots per step, warps, pipeline stages, splits (0 = from shapes)."""

    block_h: int = 64
    block_n: int = 32
    num_warps: int = 8
    num_stages: int = 2
    splits: int = 0
    variant: str = "plain"  # "plain": _decode_kernel; "pipe": .mla_fp8_decode_pipe (index prefetch, bf16 dequant)


# Candidates for the GPU bench (bench/kv_fp8_triton.py); the default picks by head count.
CANDIDATES: tuple[DecodeConfig, ...] = (
    DecodeConfig(16, 32, 4, 2), DecodeConfig(16, 64, 4, 2), DecodeConfig(16, 64, 4, 3), DecodeConfig(32, 32, 4, 2),
    DecodeConfig(32, 64, 8, 2), DecodeConfig(64, 32, 8, 2), DecodeConfig(64, 64, 8, 2), DecodeConfig(64, 32, 8, 3),
    DecodeConfig(64, 32, 16, 2), DecodeConfig(64, 64, 16, 2),
)


def default_config(heads: int) -> DecodeConfig:
    """By head count, from :data:`.sparse_attn_candidates.FP8_DEFAULTS` (the one dict the GPU sweep flips);
    under ``TRITON_INTERPRET=1`` 128 slots per step (the interpreter's cost is per step)."""
    from dsa_runtime.plugins.cuda_hopper.triton.sparse_attn_candidates import FP8_DEFAULTS

    gpu = FP8_DEFAULTS[16 if heads <= 16 else 32 if heads <= 32 else 64]
    if INTERPRET:  # the GPU default's kernel, in wide steps
        return DecodeConfig(16 if heads <= 16 else 64, 128, 4, 2, 0, gpu.variant)
    return gpu


_SM_COUNT: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (cached); 8 elsewhere (the CPU interpreter), so tests exercise splits."""
    if device.type != "cuda":
        return 8
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def flatten_decode_inputs(q: Tensor, indices: Tensor) -> tuple[Tensor, Tensor]:
    """Check a decode call's queries and slots and flatten them into the kernels' layout.

    Args:
        q: ``[B, Q, H, 576]`` bf16 (dtype not checked).
        indices: ``[B, Q, K]`` integer slots (``-1`` = empty), the same ``B, Q`` as ``q``.
    Returns:
        ``q`` as ``[B * Q, H, 576]`` with unit-stride columns and ``indices`` as ``[B * Q, K]`` int32 with
        unit-stride columns (views where the layout allows, copies otherwise).
    Raises:
        ValueError: any other shape.
    """
    if q.dim() != 4 or q.shape[-1] != D_QK or indices.dim() != 3 or tuple(indices.shape[:2]) != tuple(q.shape[:2]):
        raise ValueError(f"expected q [B, Q, H, 576] and indices [B, Q, K], got {tuple(q.shape)}, "
                         f"{tuple(indices.shape)}")
    batch, n_q, heads, _ = q.shape
    qf = q.reshape(batch * n_q, heads, D_QK)
    if qf.stride(2) != 1:
        qf = qf.contiguous()
    idx = indices.reshape(batch * n_q, indices.shape[2]).to(torch.int32)
    if idx.stride(1) != 1:
        idx = idx.contiguous()
    return qf, idx


# Fewest slots per split on the GPU: each split writes and the combine reads an fp32 [H, 512] partial (256 KB at
# 128 heads), so at batch 1 sixty-four 32-slot splits moved 16 MB to save almost nothing (0.052 ms on an H100).
MIN_CHUNK = 128


def choose_splits(programs: int, top_k: int, block_n: int, sms: int, min_chunk: int = 0) -> int:
    """Splits of the K slots so that about one wave of programs covers the SMs (one CTA per SM: the fp32
    accumulator fills the register file), each at least ``max(block_n, min_chunk)`` slots; none when the
    programs already fill three quarters of the SMs."""
    if 4 * programs >= 3 * sms:
        return 1
    return max(1, min(triton.cdiv(sms, programs), triton.cdiv(top_k, max(block_n, min_chunk)), 64))


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr):
    """``acc + a @ b`` (bf16 operands, fp32 accumulation). ``UPCAST`` (only under ``TRITON_INTERPRET=1``) runs
    it in fp32 on the same bf16 values: the CPU interpreter of Triton 3.6 mis-computes bf16 ``tl.dot``."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def attend_block(q_c, q_pe, c, pe, valid, qk_scale, m_i, l_i, acc, UPCAST: tl.constexpr):
    """One block of online softmax: scores of the ``[BLOCK_H]`` heads against the block's dequantized rows
    (``c`` ``[BLOCK_N, 512]``, ``pe`` ``[BLOCK_N, 64]`` bf16; ``valid`` masks empty slots), base-2 with the scale
    folded into ``qk_scale``; returns the updated running max, sum and fp32 accumulator."""
    s = _dot(q_c, tl.trans(c), tl.zeros([q_c.shape[0], c.shape[0]], tl.float32), UPCAST)
    s = _dot(q_pe, tl.trans(pe), s, UPCAST)
    m_new, l_i, alpha, p = softmax_block(s, valid, qk_scale, m_i, l_i)
    acc = _dot(p.to(tl.bfloat16), c, acc * alpha[:, None], UPCAST)
    return m_new, l_i, acc


@triton.jit
def store_result(out_ptr, lse_ptr, m, sp, h, hmask, acc, m_i, l_i,
                 stride_om, stride_os, stride_oh, stride_lm, stride_ls, D_OUT: tl.constexpr, SPLIT: tl.constexpr):
    """Normalise and store one (query, head block[, split]): with ``SPLIT`` fp32 partials and a base-2 lse
    (``-inf`` for a split without a valid slot: the combine skips it), else bf16 out and a natural-log lse
    (``+inf`` and zeros for a query without any valid slot)."""
    d = tl.arange(0, 512)
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    if SPLIT:
        base = out_ptr + m * stride_om + sp * stride_os + h[:, None] * stride_oh
        tl.store(base + d[None, :], o, mask=hmask[:, None])
        lse2 = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
        tl.store(lse_ptr + m * stride_lm + sp * stride_ls + h, lse2, mask=hmask)
    else:
        base = out_ptr + m * stride_om + h[:, None] * stride_oh
        tl.store(base + d[None, :], o.to(tl.bfloat16), mask=hmask[:, None] & (d[None, :] < D_OUT))
        lse = tl.where(empty, float("inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
        tl.store(lse_ptr + m * stride_lm + h, lse, mask=hmask)


@triton.jit
def _decode_kernel(q_ptr, c8_ptr, s32_ptr, pe16_ptr, idx_ptr, out_ptr, lse_ptr,
                   H, K, K_PER_SPLIT, qk_scale,
                   stride_qm, stride_qh, stride_im, stride_om, stride_os, stride_oh, stride_lm, stride_ls,
                   D_OUT: tl.constexpr, SPLIT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                   UPCAST: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < H
    d = tl.arange(0, 512)
    dp = tl.arange(0, 64)
    j = tl.arange(0, 4)
    t = tl.arange(0, 128)
    q_row = q_ptr + m * stride_qm + h[:, None] * stride_qh
    q_c = tl.load(q_row + d[None, :], mask=hmask[:, None], other=0.0)
    q_pe = tl.load(q_row + 512 + dp[None, :], mask=hmask[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, 512], tl.float32)
    lo = sp * K_PER_SPLIT
    hi = tl.minimum(lo + K_PER_SPLIT, K)
    for n0 in range(lo, hi, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        slot = tl.load(idx_ptr + m * stride_im + n, mask=n < hi, other=-1)
        valid = slot >= 0
        row = tl.where(valid, slot, 0).to(tl.int64)
        c8 = tl.load(c8_ptr + row[:, None, None] * 656 + j[None, :, None] * 128 + t[None, None, :],
                     mask=valid[:, None, None], other=0.0)
        sc = tl.load(s32_ptr + row[:, None] * 164 + 128 + j[None, :], mask=valid[:, None], other=0.0)
        c = tl.reshape((c8.to(tl.float32) * sc[:, :, None]).to(tl.bfloat16), (BLOCK_N, 512))
        pe = tl.load(pe16_ptr + row[:, None] * 328 + 264 + dp[None, :], mask=valid[:, None], other=0.0)
        m_i, l_i, acc = attend_block(q_c, q_pe, c, pe, valid, qk_scale, m_i, l_i, acc, UPCAST)

    store_result(out_ptr, lse_ptr, m, sp, h, hmask, acc, m_i, l_i,
                 stride_om, stride_os, stride_oh, stride_lm, stride_ls, D_OUT, SPLIT)


@triton.jit
def _combine_kernel(part_ptr, plse_ptr, out_ptr, lse_ptr, scale_ptr, H, SPLITS,
                    stride_pm, stride_ps, stride_ph, stride_lm, stride_ls, stride_om, stride_oh, stride_fm,
                    stride_cm, stride_cs,
                    D_OUT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr = False,
                    SCALED: tl.constexpr = False):
    """Log-sum-exp merge of the splits of one request-query and ``BLOCK_H`` heads (``PDL``: launched as a
    programmatic dependent, it waits for the previous grid first: :func:`.pdl.grid_sync`; ``SCALED``: each split's
    128-column blocks are multiplied by their scales at ``scale_ptr`` first)."""
    grid_sync(PDL)
    m = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < H
    s = tl.arange(0, BLOCK_S)
    smask = s < SPLITS
    lse2 = tl.load(plse_ptr + m * stride_lm + s[:, None] * stride_ls + h[None, :],
                   mask=smask[:, None] & hmask[None, :], other=float("-inf"))  # [S, H]
    mx = tl.max(lse2, axis=0)
    empty = mx == float("-inf")
    w = tl.math.exp2(lse2 - tl.where(empty, 0.0, mx)[None, :])  # 0 for empty splits
    total = tl.sum(w, axis=0)
    w = w / tl.where(empty, 1.0, total)[None, :]
    d = tl.arange(0, 512)
    acc = tl.zeros([BLOCK_H, 512], tl.float32)
    for i in range(0, SPLITS):
        wi = tl.sum(tl.where(s[:, None] == i, w, 0.0), axis=0)  # [H]
        part = tl.load(part_ptr + m * stride_pm + i * stride_ps + h[:, None] * stride_ph + d[None, :],
                       mask=hmask[:, None] & (wi > 0.0)[:, None], other=0.0).to(tl.float32)
        if SCALED:
            part *= tl.load(scale_ptr + m * stride_cm + i * stride_cs + d // 128)[None, :]
        acc += wi[:, None] * part
    tl.store(out_ptr + m * stride_om + h[:, None] * stride_oh + d[None, :], acc.to(tl.bfloat16),
             mask=hmask[:, None] & (d[None, :] < D_OUT))
    lse = tl.where(empty, float("inf"), (mx + tl.math.log2(tl.where(empty, 1.0, total))) * 0.6931471805599453)
    tl.store(lse_ptr + m * stride_fm + h, lse, mask=hmask)


def merge_slices(part: Tensor, plse: Tensor, out: Tensor, lse: Tensor, d_v: int, min_programs: int = 0,
                 pdl: bool = False, part_scale: Tensor | None = None) -> None:
    """Merge per-slice partials into ``out`` / ``lse`` (log-sum-exp rule, :func:`_combine_kernel`).

    Args:
        part: ``[M, S, H, 512]`` normalised partials, fp32 (or fp16 with ``part_scale``); plse: ``[M, S, H]``
            fp32 base-2 lse (``-inf`` empty).
        out: ``[M, H, d_v]`` bf16; lse: ``[M, H]`` fp32 (natural log, ``+inf`` when every slice was empty).
        min_programs: heads per program are halved (from 16) while fewer programs than this would run, so a
            small batch still spreads over the GPU (the merge is then the tail).
        pdl: launch as a programmatic dependent of the previous kernel (:mod:`.pdl`; on where it is supported),
            so its scheduling overlaps that kernel's last wave.
        part_scale: ``[M, S, 4]`` fp32, each slice's scale of each 128-column block of ``part`` (fp16 partials
            stored divided by it), or None.
    """
    mq, splits, heads, _ = part.shape
    cb_h = 16
    while cb_h > 1 and mq * triton.cdiv(heads, cb_h) < min_programs:
        cb_h //= 2
    scaled = part_scale is not None
    if scaled and (part_scale.shape != (mq, splits, 4) or part_scale.stride(2) != 1):
        raise ValueError(f"part_scale must be [{mq}, {splits}, 4] with unit last stride, got {tuple(part_scale.shape)}")
    scale = part_scale if scaled else plse  # (unread unless scaled)
    _combine_kernel[(mq, triton.cdiv(heads, cb_h))](
        part, plse, out, lse, scale, heads, splits, part.stride(0), part.stride(1), part.stride(2),
        plse.stride(0), plse.stride(1), out.stride(0), out.stride(1), lse.stride(0), scale.stride(0), scale.stride(1),
        D_OUT=d_v, BLOCK_H=cb_h, BLOCK_S=max(triton.next_power_of_2(splits), 2), PDL=pdl, SCALED=scaled,
        num_warps=4, **pdl_kwargs(pdl))


def _kernels():
    from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode_pipe import _decode_pipe_kernel

    return {"plain": _decode_kernel, "pipe": _decode_pipe_kernel}


def decode_fp8_656(q: Tensor, kv_cache: Tensor, indices: Tensor, sm_scale: float, d_v: int = D_LATENT,
                   config: DecodeConfig | None = None) -> tuple[Tensor, Tensor]:
    """Sparse MLA decode over an ``fp8_656`` cache.

    Args:
        q: ``[B, Q, H, 576]`` bf16 (any H from 1 to 128 and beyond; heads are masked per block).
        kv_cache: ``[pages, page_size, 656]`` uint8, contiguous (slot = page * page_size + offset).
        indices: ``[B, Q, K]`` int32 slots, ``-1`` = empty (never read).
        sm_scale: softmax scale. d_v: value width (<= 512; the first ``d_v`` latent columns).
        config: launch shape (:data:`CANDIDATES`); by default :func:`default_config` of H.
    Returns:
        ``out`` ``[B, Q, H, d_v]`` bf16 and ``lse`` ``[B, Q, H]`` fp32 (natural log; ``+inf`` with no valid slot).
    """
    qf, idx = flatten_decode_inputs(q, indices)
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != FP8_MLA_ROW_BYTES or kv_cache.dtype != torch.uint8:
        raise ValueError(f"fp8_656 cache must be [pages, page_size, 656] uint8, got {tuple(kv_cache.shape)} "
                         f"{kv_cache.dtype}")
    if not 0 < d_v <= D_LATENT:
        raise ValueError(f"d_v must be in [1, 512], got {d_v}")
    batch, n_q, heads, _ = q.shape
    top_k = indices.shape[2]
    cfg = config or default_config(heads)
    rows = kv_cache.contiguous().view(-1, FP8_MLA_ROW_BYTES)
    c8, s32, pe16 = rows.view(torch.float8_e4m3fn), rows.view(torch.float32), rows.view(torch.bfloat16)
    mq = batch * n_q
    out = torch.empty(mq, heads, d_v, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(mq, heads, dtype=torch.float32, device=q.device)
    if mq == 0 or heads == 0:
        return out.reshape(batch, n_q, heads, d_v), lse.reshape(batch, n_q, heads)
    kernels = _kernels()
    if cfg.variant not in kernels:
        raise ValueError(f"unknown fp8 decode variant {cfg.variant!r}; valid: {', '.join(kernels)}")
    # The pipe kernel puts head blocks fastest (L2 reuse), so queries go on grid axis 1 (at most 65535 programs):
    # beyond that the plain kernel (queries on axis 0) serves the call.
    head_fast = cfg.variant == "pipe" and mq <= 65535
    kernel = kernels[cfg.variant] if head_fast or cfg.variant != "pipe" else _decode_kernel
    hblocks = triton.cdiv(heads, cfg.block_h)

    def grid(n_splits: int) -> tuple[int, int, int]:
        return (hblocks, mq, n_splits) if head_fast else (mq, hblocks, n_splits)

    # On the CPU (the interpreter's tests) no chunk floor: small K still exercises the split path.
    splits = cfg.splits or choose_splits(mq * hblocks, top_k, cfg.block_n, sm_count(q.device),
                                         MIN_CHUNK if q.is_cuda else 0)
    per_split = triton.cdiv(triton.cdiv(max(top_k, 1), splits), cfg.block_n) * cfg.block_n
    qk_scale = float(sm_scale) * LOG2E
    launch = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
    if splits == 1:
        kernel[grid(1)](
            qf, c8, s32, pe16, idx, out, lse, heads, top_k, per_split, qk_scale,
            qf.stride(0), qf.stride(1), idx.stride(0), out.stride(0), 0, out.stride(1), lse.stride(0), 0,
            D_OUT=d_v, SPLIT=False, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, UPCAST=INTERPRET, **launch)
    else:
        part = torch.empty(mq, splits, heads, D_LATENT, dtype=torch.float32, device=q.device)
        plse = torch.empty(mq, splits, heads, dtype=torch.float32, device=q.device)
        kernel[grid(splits)](
            qf, c8, s32, pe16, idx, part, plse, heads, top_k, per_split, qk_scale,
            qf.stride(0), qf.stride(1), idx.stride(0), part.stride(0), part.stride(1), part.stride(2),
            plse.stride(0), plse.stride(1), D_OUT=D_LATENT, SPLIT=True, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n,
            UPCAST=INTERPRET, **launch)
        merge_slices(part, plse, out, lse, d_v)
    return out.reshape(batch, n_q, heads, d_v), lse.reshape(batch, n_q, heads)

