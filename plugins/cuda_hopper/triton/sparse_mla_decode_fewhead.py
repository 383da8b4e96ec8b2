"""Sparse MLA decode for few heads per rank (8 / 16 / 32: V3.2 under TP 16 / 8 / 4), both cache layouts.

At 16 heads a decode query does ``16 x 2048 x 1088 x 2`` FLOPs against 2048 gathered rows, about 50 FLOPs per
byte of an ``fp8_656`` row: a gather problem. The head-blocked kernels (:mod:`.mla_fp8_decode`,
:mod:`.sparse_mla_decode_bf16`) planned splits as if one program filled an SM (true at 64 heads), so at batch 64
and 16 heads they ran few programs, each walking hundreds of rows one dependent step after another.

Here one program holds *all* heads of a query (an MMA tile of 16, 32 or 64 rows, padding masked) and a slice of
its selected rows. Slices are planned from the compiled kernel's residency (registers and shared memory: how many
programs one SM holds) so that one wave covers the GPU and never spills into a second
(:func:`.fewhead_plan.plan_splits`; configurations and their measured defaults live in :mod:`.fewhead_plan` too).
The latent is walked as four 128-column blocks. Kernels (:class:`.fewhead_plan.FewHeadConfig` ``variant``):

* ``cols``: each ``fp8_656`` block dequantized by its own scale column (exact in bf16); bf16 rows as they are.
* ``fold`` (``fp8_656``): ``cols`` with fp16 MMAs on the raw e4m3 values (exact in fp16): the rows' power-of-two
  scales go into the scores and, relative to the block's largest, into fp16 probabilities. q runs in fp16, each
  head first divided by a power of two when it would leave fp16's range (:data:`Q_FP16_MAX`).

What made ``fp8_656`` fast: Triton 3.6 pipelines a gather into shared memory (``cp.async``, ``num_stages``
deep) only when its single use is a dot operand, conversions allowed on the way; a tile feeding both ``q c^T``
and ``P c`` was loaded synchronously, every step waiting on its gathers. So ``cols`` / ``fold`` gather each e4m3
tile once per use, the second read hitting L2 (:func:`_latent_cols`); bf16 tiles need no conversion and are
pipelined either way. (A first kernel kept the latent as one 512-wide tile, dequantized through a
``[N, 4, 128]`` reshape: 0.110 ms at 16 heads against ``fold``'s 0.089, and within 3% of ``cols`` on bf16; it is
gone.)

Slices are merged by the log-sum-exp rule, by default in a second launch (:func:`.mla_fp8_decode._combine_kernel`,
its programs narrowed to fewer heads when a small batch would leave SMs idle). ``fused=True`` merges in the same
launch instead: every program writes its fp32 partial and takes a ticket from a per-query counter (acquire /
release, GPU scope); the one holding the last ticket reads the partials through L2 (``.cg``), writes the result
and zeroes the counter for the next call (a per-device buffer, zero between calls: graphs replay it without a
memset). Measured, it ties the second launch at batch 64 and loses at batch 1 and at 32 heads, where one program
merging every slice is the tail; it stays as an option. Split counts depend on shapes, the SM count and the
compiled kernel only: CUDA-graph capturable.

A query with no valid slot gets zeros and ``lse = +inf``; a slot ``-1`` is never dereferenced.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dsa_runtime.families import D_LATENT, D_QK, FP8_MLA_ROW_BYTES
from dsa_runtime.plugins.cuda_hopper.triton.fewhead_plan import (
    VARIANTS,
    FewHeadConfig,
    default_config,
    plan_splits,
    resident_programs,
    slice_rows,
)
from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import (
    LOG2E,
    _dot,
    flatten_decode_inputs,
    merge_slices,
    sm_count,
)
from dsa_runtime.plugins.cuda_hopper.triton.moe_quant import INTERPRET
from dsa_runtime.plugins.cuda_hopper.triton.online_softmax import softmax_block

MAX_HEADS = 64  # one program's MMA tile; more heads go to the head-blocked kernels
# ``fold`` runs q in fp16: a head whose largest |q| passes this is divided by a power of two first (exact), so no
# finite bf16 query overflows, and a product with an e4m3 value (<= 448) stays finite in the fp32 accumulator.
Q_FP16_MAX = tl.constexpr(16384.0)


@triton.jit
def _store_cols(o, col0, m, sp, h, hmask, lse2, empty, part_ptr, plse_ptr, out_ptr, lse_ptr,
                stride_pm, stride_ps, stride_ph, stride_lm, stride_ls, stride_om, stride_oh, stride_fm,
                SPLITS, D_OUT: tl.constexpr, WITH_LSE: tl.constexpr):
    """Store normalised columns ``[col0, col0 + width)`` of one slice: the fp32 partial (and its base-2 lse) when
    the query has several slices, else the bf16 output (and its natural-log lse, ``+inf`` when empty)."""
    d = col0 + tl.arange(0, o.shape[1])
    if SPLITS == 1:
        tl.store(out_ptr + m * stride_om + h[:, None] * stride_oh + d[None, :], o.to(tl.bfloat16),
                 mask=hmask[:, None] & (d[None, :] < D_OUT))
        if WITH_LSE:
            tl.store(lse_ptr + m * stride_fm + h, tl.where(empty, float("inf"), lse2 * 0.6931471805599453),
                     mask=hmask)
    else:
        tl.store(part_ptr + m * stride_pm + sp * stride_ps + h[:, None] * stride_ph + d[None, :], o,
                 mask=hmask[:, None])
        if WITH_LSE:
            tl.store(plse_ptr + m * stride_lm + sp * stride_ls + h, lse2, mask=hmask)


@triton.jit
def _merge_if_last(m, h, hmask, part_ptr, plse_ptr, out_ptr, lse_ptr, count_ptr, SPLITS,
                   stride_pm, stride_ps, stride_ph, stride_lm, stride_ls, stride_om, stride_oh, stride_fm,
                   D_OUT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_S: tl.constexpr):
    """Take a ticket; the program holding the last one merges every slice of query ``m`` (log-sum-exp rule,
    partials read through L2) and zeroes the counter again."""
    tl.debug_barrier()  # every thread's partial is written before the ticket is taken
    ticket = tl.atomic_add(count_ptr + m, 1, sem="acq_rel", scope="gpu")
    if ticket == SPLITS - 1:
        tl.debug_barrier()
        d = tl.arange(0, 512)
        s = tl.arange(0, BLOCK_S)
        smask = s < SPLITS
        all_lse = tl.load(plse_ptr + m * stride_lm + s[:, None] * stride_ls + h[None, :],
                          mask=smask[:, None] & hmask[None, :], other=float("-inf"), cache_modifier=".cg")  # [S, H]
        mx = tl.max(all_lse, axis=0)
        none = mx == float("-inf")
        w = tl.math.exp2(all_lse - tl.where(none, 0.0, mx)[None, :])  # 0 for empty slices
        total = tl.sum(w, axis=0)
        w = w / tl.where(none, 1.0, total)[None, :]
        merged = tl.zeros([BLOCK_H, 512], tl.float32)
        for i in range(0, SPLITS):
            wi = tl.sum(tl.where(s[:, None] == i, w, 0.0), axis=0)  # [H]
            part = tl.load(part_ptr + m * stride_pm + i * stride_ps + h[:, None] * stride_ph + d[None, :],
                           mask=hmask[:, None] & (wi > 0.0)[:, None], other=0.0, cache_modifier=".cg")
            merged += wi[:, None] * part
        tl.store(out_ptr + m * stride_om + h[:, None] * stride_oh + d[None, :], merged.to(tl.bfloat16),
                 mask=hmask[:, None] & (d[None, :] < D_OUT))
        lse = tl.where(none, float("inf"), (mx + tl.math.log2(tl.where(none, 1.0, total))) * 0.6931471805599453)
        tl.store(lse_ptr + m * stride_fm + h, lse, mask=hmask)
        tl.atomic_xchg(count_ptr + m, 0, sem="relaxed", scope="gpu")  # zero again for the next call


@triton.jit
def _latent_cols(kv_ptr, row, valid, col0, FP8: tl.constexpr, LAST_USE: tl.constexpr):
    """Latent columns ``[col0, col0 + 128)`` of the gathered rows as stored, ``[BLOCK_N, 128]`` e4m3 or bf16.

    ``fp8_656`` tiles are gathered once per use (scores, then values; ``LAST_USE`` marks the second, which
    finds the rows in L2): Triton 3.6 pipelines a gather into shared memory only when its one use is a dot operand
    with a conversion on the way, and a tile that feeds both ``q c^T`` and ``P c`` was loaded synchronously."""
    t = col0 + tl.arange(0, 128)
    if FP8:
        ptr = kv_ptr.to(tl.pointer_type(tl.float8e4nv)) + row[:, None] * 656 + t[None, :]
        if LAST_USE:
            c = tl.load(ptr, mask=valid[:, None], other=0.0, eviction_policy="evict_first")
        else:
            c = tl.load(ptr, mask=valid[:, None], other=0.0)
    else:
        c = tl.load(kv_ptr.to(tl.pointer_type(tl.bfloat16)) + row[:, None] * 576 + t[None, :], mask=valid[:, None],
                    other=0.0)
    return c


@triton.jit
def _cols_scores(s, q, c, sc, q_up, FP8: tl.constexpr, FOLD: tl.constexpr, UPCAST: tl.constexpr):
    """``s + q c^T`` for one 128-column block of stored rows ``c``: bf16 as is; ``fp8_656`` dequantized by the
    rows' power-of-two scales ``sc`` (exact in bf16), or with ``FOLD`` fp16 MMAs on the raw values, the rows'
    scales and the heads' ``q_up`` (what q was divided by) applied to the scores."""
    ct = tl.trans(c)
    if FP8:
        if FOLD:
            qc = _dot(q, ct.to(tl.float16), tl.zeros([q.shape[0], c.shape[0]], tl.float32), UPCAST)
            out = s + qc * (q_up[:, None] * sc[None, :])
        elif UPCAST:  # the interpreter cannot multiply bf16: the same exact product through fp32
            out = _dot(q, (ct.to(tl.float32) * sc[None, :]).to(tl.bfloat16), s, UPCAST)
        else:
            out = _dot(q, ct.to(tl.bfloat16) * sc.to(tl.bfloat16)[None, :], s, UPCAST)
    else:
        out = _dot(q, ct, s, UPCAST)
    return out


@triton.jit
def _cols_update(acc, alpha, p, c, sc, FP8: tl.constexpr, FOLD: tl.constexpr, UPCAST: tl.constexpr):
    """``acc * alpha + P V`` for one 128-column block of stored rows ``c``. With ``FOLD`` the rows' scales go
    into fp16 probabilities relative to the block's largest scale (a power of two: exact), which multiplies the
    product."""
    if FP8:
        if FOLD:
            top = tl.max(sc, axis=0)
            top = tl.where(top > 0.0, top, 1.0)
            pv = _dot((p * (sc / top)[None, :]).to(tl.float16), c.to(tl.float16), tl.zeros(acc.shape, tl.float32),
                      UPCAST)
            out = acc * alpha[:, None] + pv * top
        elif UPCAST:
            out = _dot(p.to(tl.bfloat16), (c.to(tl.float32) * sc[:, None]).to(tl.bfloat16), acc * alpha[:, None],
                       UPCAST)
        else:
            out = _dot(p.to(tl.bfloat16), c.to(tl.bfloat16) * sc.to(tl.bfloat16)[:, None], acc * alpha[:, None],
                       UPCAST)
    else:
        out = _dot(p.to(tl.bfloat16), c, acc * alpha[:, None], UPCAST)
    return out


@triton.jit
def _fewhead_cols_kernel(q_ptr, kv_ptr, idx_ptr, part_ptr, plse_ptr, out_ptr, lse_ptr, count_ptr,
                         H, K, K_PER_SPLIT, SPLITS, qk_scale,
                         stride_qm, stride_qh, stride_im, stride_pm, stride_ps, stride_ph, stride_lm, stride_ls,
                         stride_om, stride_oh, stride_fm,
                         FP8: tl.constexpr, D_OUT: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_S: tl.constexpr, FUSED: tl.constexpr, FOLD: tl.constexpr, UPCAST: tl.constexpr):
    """One program: every head of query ``m`` (program axis 1) over slice ``sp`` (axis 0) of its selected rows,
    the latent in four 128-column blocks, each ``fp8_656`` block dequantized by its own scale column (or, with
    ``FOLD``, fp16 MMAs on the raw e4m3 values); writes the output (one slice) or its slice's partial."""
    sp = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    h = tl.arange(0, BLOCK_H)
    hmask = h < H
    t = tl.arange(0, 128)
    dp = tl.arange(0, 64)
    q_row = q_ptr + m * stride_qm + h[:, None] * stride_qh
    q0 = tl.load(q_row + t[None, :], mask=hmask[:, None], other=0.0)
    q1 = tl.load(q_row + 128 + t[None, :], mask=hmask[:, None], other=0.0)
    q2 = tl.load(q_row + 256 + t[None, :], mask=hmask[:, None], other=0.0)
    q3 = tl.load(q_row + 384 + t[None, :], mask=hmask[:, None], other=0.0)
    q_up = tl.full([BLOCK_H], 1.0, tl.float32)
    if FOLD:  # fp16 q: each head scaled by a power of two into fp16's range (exact), scores scaled back
        top = tl.maximum(tl.maximum(tl.max(tl.abs(q0.to(tl.float32)), axis=1), tl.max(tl.abs(q1.to(tl.float32)), axis=1)),
                         tl.maximum(tl.max(tl.abs(q2.to(tl.float32)), axis=1), tl.max(tl.abs(q3.to(tl.float32)), axis=1)))
        q_up = tl.math.exp2(tl.maximum(tl.math.ceil(tl.math.log2(tl.maximum(top, 1.0) / Q_FP16_MAX)), 0.0))
        q_down = (1.0 / q_up)[:, None]
        q0 = (q0.to(tl.float32) * q_down).to(tl.float16)
        q1 = (q1.to(tl.float32) * q_down).to(tl.float16)
        q2 = (q2.to(tl.float32) * q_down).to(tl.float16)
        q3 = (q3.to(tl.float32) * q_down).to(tl.float16)
    q_pe = tl.load(q_row + 512 + dp[None, :], mask=hmask[:, None], other=0.0)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    a0 = tl.zeros([BLOCK_H, 128], tl.float32)
    a1 = tl.zeros([BLOCK_H, 128], tl.float32)
    a2 = tl.zeros([BLOCK_H, 128], tl.float32)
    a3 = tl.zeros([BLOCK_H, 128], tl.float32)
    lo = sp * K_PER_SPLIT
    hi = tl.minimum(lo + K_PER_SPLIT, K)
    offs_n = tl.arange(0, BLOCK_N)
    idx_row = idx_ptr + m * stride_im
    s32 = kv_ptr.to(tl.pointer_type(tl.float32))
    for n0 in range(lo, hi, BLOCK_N):
        slot = tl.load(idx_row + n0 + offs_n, mask=n0 + offs_n < hi, other=-1)
        valid = slot >= 0
        row = tl.where(valid, slot, 0).to(tl.int64)
        if FP8:
            sc0 = tl.load(s32 + row * 164 + 128, mask=valid, other=0.0)
            sc1 = tl.load(s32 + row * 164 + 129, mask=valid, other=0.0)
            sc2 = tl.load(s32 + row * 164 + 130, mask=valid, other=0.0)
            sc3 = tl.load(s32 + row * 164 + 131, mask=valid, other=0.0)
            pe = tl.load(kv_ptr.to(tl.pointer_type(tl.bfloat16)) + row[:, None] * 328 + 264 + dp[None, :],
                         mask=valid[:, None], other=0.0)
        else:
            sc0 = tl.zeros([BLOCK_N], tl.float32)  # unused without FP8
            sc1 = sc0
            sc2 = sc0
            sc3 = sc0
            pe = tl.load(kv_ptr.to(tl.pointer_type(tl.bfloat16)) + row[:, None] * 576 + 512 + dp[None, :],
                         mask=valid[:, None], other=0.0)
        s = _dot(q_pe, tl.trans(pe), tl.zeros([BLOCK_H, BLOCK_N], tl.float32), UPCAST)
        s = _cols_scores(s, q0, _latent_cols(kv_ptr, row, valid, 0, FP8, False), sc0, q_up, FP8, FOLD,
                         UPCAST)
        s = _cols_scores(s, q1, _latent_cols(kv_ptr, row, valid, 128, FP8, False), sc1, q_up, FP8, FOLD,
                         UPCAST)
        s = _cols_scores(s, q2, _latent_cols(kv_ptr, row, valid, 256, FP8, False), sc2, q_up, FP8, FOLD,
                         UPCAST)
        s = _cols_scores(s, q3, _latent_cols(kv_ptr, row, valid, 384, FP8, False), sc3, q_up, FP8, FOLD,
                         UPCAST)
        m_i, l_i, alpha, p = softmax_block(s, valid, qk_scale, m_i, l_i)
        a0 = _cols_update(a0, alpha, p, _latent_cols(kv_ptr, row, valid, 0, FP8, FP8), sc0, FP8, FOLD, UPCAST)
        a1 = _cols_update(a1, alpha, p, _latent_cols(kv_ptr, row, valid, 128, FP8, FP8), sc1, FP8, FOLD, UPCAST)
        a2 = _cols_update(a2, alpha, p, _latent_cols(kv_ptr, row, valid, 256, FP8, FP8), sc2, FP8, FOLD, UPCAST)
        a3 = _cols_update(a3, alpha, p, _latent_cols(kv_ptr, row, valid, 384, FP8, FP8), sc3, FP8, FOLD, UPCAST)

    empty = l_i == 0.0
    lse2 = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
    inv = (1.0 / tl.where(empty, 1.0, l_i))[:, None]
    _store_cols(a0 * inv, 0, m, sp, h, hmask, lse2, empty, part_ptr, plse_ptr, out_ptr, lse_ptr, stride_pm,
                stride_ps, stride_ph, stride_lm, stride_ls, stride_om, stride_oh, stride_fm, SPLITS, D_OUT, True)
    _store_cols(a1 * inv, 128, m, sp, h, hmask, lse2, empty, part_ptr, plse_ptr, out_ptr, lse_ptr, stride_pm,
                stride_ps, stride_ph, stride_lm, stride_ls, stride_om, stride_oh, stride_fm, SPLITS, D_OUT, False)
    _store_cols(a2 * inv, 256, m, sp, h, hmask, lse2, empty, part_ptr, plse_ptr, out_ptr, lse_ptr, stride_pm,
                stride_ps, stride_ph, stride_lm, stride_ls, stride_om, stride_oh, stride_fm, SPLITS, D_OUT, False)
    _store_cols(a3 * inv, 384, m, sp, h, hmask, lse2, empty, part_ptr, plse_ptr, out_ptr, lse_ptr, stride_pm,
                stride_ps, stride_ph, stride_lm, stride_ls, stride_om, stride_oh, stride_fm, SPLITS, D_OUT, False)
    if SPLITS > 1:  # noqa: SIM102 - a runtime and a constexpr condition, kept apart for the JIT
        if FUSED:
            _merge_if_last(m, h, hmask, part_ptr, plse_ptr, out_ptr, lse_ptr, count_ptr, SPLITS,
                           stride_pm, stride_ps, stride_ph, stride_lm, stride_ls, stride_om, stride_oh, stride_fm,
                           D_OUT, BLOCK_H, BLOCK_S)


_COUNTERS: dict[tuple[str, int | None], Tensor] = {}


def _counters(device: torch.device, n: int) -> Tensor:
    """``n`` int32 ticket counters, zero between calls (each merge resets its own). Kept per device and grown
    outside graph capture; a call first seen while capturing gets zeros from a memset node of its graph."""
    key = (device.type, device.index)
    buf = _COUNTERS.get(key)
    if buf is not None and buf.numel() >= n:
        return buf
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    fresh = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
    if not capturing:  # memory from a graph's private pool must not outlive that graph
        _COUNTERS[key] = fresh
    return fresh


def decode_fewhead(q: Tensor, kv_cache: Tensor, indices: Tensor, sm_scale: float, d_v: int = D_LATENT, *,
                   layout: str, config: FewHeadConfig | None = None) -> tuple[Tensor, Tensor]:
    """Sparse MLA decode with every head of a query in one program.

    Args:
        q: ``[B, Q, H, 576]`` bf16, ``1 <= H <= 64``.
        kv_cache: ``[pages, page_size, 576]`` bf16 (``layout="bf16"``) or ``[pages, page_size, 656]`` uint8
            (``layout="fp8_656"``), contiguous; slot = page * page_size + offset.
        indices: ``[B, Q, K]`` int32 slots, ``-1`` = empty (never read).
        sm_scale: softmax scale. d_v: value width (the first ``d_v`` latent columns, <= 512).
        config: launch shape (default :func:`.fewhead_plan.default_config` of the layout and head count).
    Returns:
        ``out`` ``[B, Q, H, d_v]`` bf16 and ``lse`` ``[B, Q, H]`` fp32 (natural log; ``+inf`` with no valid slot).
    """
    qf, idx = flatten_decode_inputs(q, indices)
    fp8 = layout == "fp8_656"
    if layout not in ("bf16", "fp8_656"):
        raise ValueError(f"unknown MLA layout {layout!r}; valid: bf16, fp8_656")
    width, dtype = (FP8_MLA_ROW_BYTES, torch.uint8) if fp8 else (D_QK, torch.bfloat16)
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != width or kv_cache.dtype != dtype:
        raise ValueError(f"{layout} cache must be [pages, page_size, {width}] {dtype}, got {tuple(kv_cache.shape)} "
                         f"{kv_cache.dtype}")
    if not 0 < d_v <= D_LATENT:
        raise ValueError(f"d_v must be in [1, 512], got {d_v}")
    batch, n_q, heads, _ = q.shape
    if heads > MAX_HEADS:
        raise ValueError(f"decode_fewhead takes at most {MAX_HEADS} heads, got {heads}")
    cfg = config or default_config(layout, heads)
    top_k = indices.shape[2]
    mq = batch * n_q
    out = torch.empty(mq, heads, d_v, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(mq, heads, dtype=torch.float32, device=q.device)
    if mq == 0 or heads == 0:
        return out.reshape(batch, n_q, heads, d_v), lse.reshape(batch, n_q, heads)
    rows = kv_cache.contiguous().view(-1, width)
    if cfg.variant not in VARIANTS:
        raise ValueError(f"unknown few-head variant {cfg.variant!r}; valid: {', '.join(VARIANTS)}")
    kernel = _fewhead_cols_kernel
    block_h = 16 if heads <= 16 else 32 if heads <= 32 else 64
    consts = {"FP8": fp8, "D_OUT": d_v, "BLOCK_H": block_h, "BLOCK_N": cfg.block_n, "UPCAST": INTERPRET,
              "FOLD": fp8 and cfg.variant == "fold", "num_warps": cfg.num_warps, "num_stages": cfg.num_stages}

    def args(part, plse, count, splits, per_split):
        return (qf, rows, idx, part, plse, out, lse, count, heads, top_k, per_split, splits,
                float(sm_scale) * LOG2E, qf.stride(0), qf.stride(1), idx.stride(0),
                part.stride(0), part.stride(1), part.stride(2), plse.stride(0), plse.stride(1),
                out.stride(0), out.stride(1), lse.stride(0))

    def probe_args():  # only when the residency of this launch shape is not cached yet
        probe = torch.empty(1, 2, heads, D_LATENT, dtype=torch.float32, device=q.device)
        return args(probe, probe[:, :, :, 0], lse, 2, top_k)

    if cfg.splits:
        splits = plan_splits(mq, top_k, 0, 0, cfg)
    else:  # residency of the split kernel (its registers and shared memory set how many programs fit an SM)
        resident = resident_programs(kernel, probe_args, {**consts, "FUSED": cfg.fused, "BLOCK_S": 2}, q.device)
        splits = plan_splits(mq, top_k, sm_count(q.device), resident, cfg)
    splits, per_split = slice_rows(top_k, splits, cfg.block_n)
    if splits == 1:
        kernel[(1, mq)](*args(out.view(mq, 1, heads, d_v), lse.view(mq, 1, heads), lse, 1, per_split),
                        FUSED=False, BLOCK_S=2, **consts)
        return out.reshape(batch, n_q, heads, d_v), lse.reshape(batch, n_q, heads)
    part = torch.empty(mq, splits, heads, D_LATENT, dtype=torch.float32, device=q.device)
    plse = torch.empty(mq, splits, heads, dtype=torch.float32, device=q.device)
    count = _counters(q.device, mq) if cfg.fused else plse  # (unread without the fused merge)
    block_s = max(triton.next_power_of_2(splits), 2)
    kernel[(splits, mq)](*args(part, plse, count, splits, per_split), FUSED=cfg.fused, BLOCK_S=block_s, **consts)
    if not cfg.fused:  # fewer heads per merge program when a small batch would leave SMs idle
        merge_slices(part, plse, out, lse, d_v, min_programs=sm_count(q.device))
    return out.reshape(batch, n_q, heads, d_v), lse.reshape(batch, n_q, heads)
