"""Sparse MLA forward, pipelined variant ("pipe"): same contract and outputs as ``_sparse_mla_kernel`` of
:mod:`.sparse_mla_prefill`, restructured for SM90 latency hiding.

Differences from the plain kernel, and why:

* **Index prefetch.** The indices of block ``i + 1`` are loaded while block ``i`` is gathered and multiplied
  (a loop-carried tile), so the gather's addresses never wait on a global load inside the iteration; the plain
  kernel's index -> gather -> dot chain serialises two memory latencies per step when the pipeliner cannot
  split it.
* **Latent halves.** The 512 latent columns are handled as two 256-wide halves (``own`` and ``other``), each
  one ``tl.dot`` for ``S`` (plus the 64-wide rope dot). With ``BLOCK_DV == 512`` the value product uses both
  halves with two ``[BLOCK_H, 256]`` accumulators; with ``BLOCK_DV == 256`` a program owns one half of the
  output columns (``own`` is that half) and still scores with both halves, so the value operand is a tile
  already gathered, not a second load. Two programs then share one head block's gathers (L2) and each holds
  half the accumulator: fewer registers, twice the programs for small batches.
* The scale is folded into ``exp2`` once (``sm_scale * log2(e)``), masking is a single ``where`` on ``S``.

Outputs exactly as the plain kernel: bf16 ``out`` and natural-log ``lse`` (``+inf`` when empty) without
``SPLIT``; fp32 normalised partials and lse (``-inf`` when empty) with ``SPLIT``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from dsa_runtime.plugins.cuda_hopper.triton.online_softmax import finish_rows, softmax_block


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    """``acc + a @ b`` with fp32 accumulation; ``UPCAST`` (interpreter only) multiplies fp32 copies."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=PRECISION)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit(do_not_specialize=["n_q_rows", "heads", "top_k", "n_kv_rows", "chunk", "n_hb", "n_dvb"])
def _sparse_mla_pipe_kernel(
    q_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr,
    n_q_rows, heads, top_k, n_kv_rows, chunk, d_v, n_hb, n_dvb,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_os, stride_ot, stride_oh, stride_ls, stride_lt,
    scale_log2,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr,
    SPLIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    dvb = pid % n_dvb  # value-column blocks of one head block are adjacent: they share gathers in L2
    rest = pid // n_dvb
    hb = rest % n_hb
    rest = rest // n_hb
    t = rest % n_q_rows
    split = rest // n_q_rows

    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < heads
    half = tl.arange(0, 256)
    own_lo = dvb * 256 if BLOCK_DV == 256 else 0
    offs_own = own_lo + half
    offs_oth = (256 - own_lo) + half
    offs_r = 512 + tl.arange(0, 64)

    q_rows = q_ptr + t.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh
    q_own = tl.load(q_rows + offs_own[None, :], mask=h_ok[:, None], other=0.0)
    q_oth = tl.load(q_rows + offs_oth[None, :], mask=h_ok[:, None], other=0.0)
    q_rope = tl.load(q_rows + offs_r[None, :], mask=h_ok[:, None], other=0.0)

    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc_a = tl.zeros((BLOCK_H, 256), tl.float32)
    acc_b = tl.zeros((BLOCK_H, 256), tl.float32)

    k_lo = split * chunk
    k_hi = tl.minimum(k_lo + chunk, top_k)
    idx_row = idx_ptr + t.to(tl.int64) * stride_it
    offs_n = tl.arange(0, BLOCK_N)
    idx_next = tl.load(idx_row + k_lo + offs_n, mask=k_lo + offs_n < k_hi, other=-1)
    for k0 in range(k_lo, k_hi, BLOCK_N):
        idx = idx_next
        nxt = k0 + BLOCK_N + offs_n
        idx_next = tl.load(idx_row + nxt, mask=nxt < k_hi, other=-1)  # issued before this block's work
        valid = (idx >= 0) & (idx < n_kv_rows)
        kv_rows = kv_ptr + tl.where(valid, idx, 0).to(tl.int64) * stride_kv
        k_own = tl.load(kv_rows[:, None] + offs_own[None, :], mask=valid[:, None], other=0.0)
        k_oth = tl.load(kv_rows[:, None] + offs_oth[None, :], mask=valid[:, None], other=0.0)
        k_rope = tl.load(kv_rows[:, None] + offs_r[None, :], mask=valid[:, None], other=0.0)
        s = _dot(q_own, tl.trans(k_own), tl.zeros((BLOCK_H, BLOCK_N), tl.float32), PRECISION, UPCAST)
        s = _dot(q_oth, tl.trans(k_oth), s, PRECISION, UPCAST)
        s = _dot(q_rope, tl.trans(k_rope), s, PRECISION, UPCAST)
        m_new, l_i, alpha, p = softmax_block(s, valid, scale_log2, m_i, l_i)
        p16 = p.to(kv_ptr.dtype.element_ty)  # P rounded to the KV dtype, as in the plain kernel
        acc_a = _dot(p16, k_own, acc_a * alpha[:, None], PRECISION, UPCAST)
        if BLOCK_DV == 512:
            acc_b = _dot(p16, k_oth, acc_b * alpha[:, None], PRECISION, UPCAST)
        m_i = m_new

    seen = l_i > 0.0
    inv = 1.0 / tl.where(seen, l_i, 1.0)
    lse = (m_i + tl.math.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453
    o_base = out_ptr + split.to(tl.int64) * stride_os + t.to(tl.int64) * stride_ot + offs_h[:, None] * stride_oh
    l_ptrs = lse_ptr + split.to(tl.int64) * stride_ls + t.to(tl.int64) * stride_lt + offs_h
    mask_a = h_ok[:, None] & (offs_own < d_v)[None, :]
    mask_b = h_ok[:, None] & (offs_oth < d_v)[None, :]
    out_a = acc_a * inv[:, None]
    out_b = acc_b * inv[:, None]
    if SPLIT:
        tl.store(o_base + offs_own[None, :], out_a, mask=mask_a)
        if BLOCK_DV == 512:
            tl.store(o_base + offs_oth[None, :], out_b, mask=mask_b)
        tl.store(l_ptrs, tl.where(seen, lse, float("-inf")), mask=h_ok & (dvb == 0))
    else:
        tl.store(o_base + offs_own[None, :], out_a.to(tl.bfloat16), mask=mask_a)
        if BLOCK_DV == 512:
            tl.store(o_base + offs_oth[None, :], out_b.to(tl.bfloat16), mask=mask_b)
        tl.store(l_ptrs, tl.where(seen, lse, float("inf")), mask=h_ok & (dvb == 0))


@triton.jit(do_not_specialize=["n_q_rows", "heads", "top_k", "n_kv_rows", "chunk", "n_hb", "n_dvb"])
def _sparse_mla_wide_kernel(
    q_ptr, kv_ptr, idx_ptr, out_ptr, lse_ptr,
    n_q_rows, heads, top_k, n_kv_rows, chunk, d_v, n_hb, n_dvb,
    stride_qt, stride_qh, stride_kv, stride_it,
    stride_os, stride_ot, stride_oh, stride_ls, stride_lt,
    scale_log2,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr,
    SPLIT: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    """Variant "pipew": the index prefetch of the pipe kernel with one 512-wide latent tile (``BLOCK_DV == 512``
    only): two dots for ``S`` and one for ``P V`` per step, so fewer wgmma waits than the halves."""
    pid = tl.program_id(0)
    hb = pid % n_hb
    rest = pid // n_hb
    t = rest % n_q_rows
    split = rest // n_q_rows

    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = offs_h < heads
    offs_d = tl.arange(0, 512)
    offs_r = 512 + tl.arange(0, 64)
    q_rows = q_ptr + t.to(tl.int64) * stride_qt + offs_h[:, None] * stride_qh
    q_nope = tl.load(q_rows + offs_d[None, :], mask=h_ok[:, None], other=0.0)
    q_rope = tl.load(q_rows + offs_r[None, :], mask=h_ok[:, None], other=0.0)

    m_i = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, 512), tl.float32)
    k_lo = split * chunk
    k_hi = tl.minimum(k_lo + chunk, top_k)
    idx_row = idx_ptr + t.to(tl.int64) * stride_it
    offs_n = tl.arange(0, BLOCK_N)
    idx_next = tl.load(idx_row + k_lo + offs_n, mask=k_lo + offs_n < k_hi, other=-1)
    for k0 in range(k_lo, k_hi, BLOCK_N):
        idx = idx_next
        nxt = k0 + BLOCK_N + offs_n
        idx_next = tl.load(idx_row + nxt, mask=nxt < k_hi, other=-1)
        valid = (idx >= 0) & (idx < n_kv_rows)
        kv_rows = kv_ptr + tl.where(valid, idx, 0).to(tl.int64) * stride_kv
        k_nope = tl.load(kv_rows[:, None] + offs_d[None, :], mask=valid[:, None], other=0.0)
        k_rope = tl.load(kv_rows[:, None] + offs_r[None, :], mask=valid[:, None], other=0.0)
        s = _dot(q_nope, tl.trans(k_nope), tl.zeros((BLOCK_H, BLOCK_N), tl.float32), PRECISION, UPCAST)
        s = _dot(q_rope, tl.trans(k_rope), s, PRECISION, UPCAST)
        m_new, l_i, alpha, p = softmax_block(s, valid, scale_log2, m_i, l_i)
        acc = _dot(p.to(kv_ptr.dtype.element_ty), k_nope, acc * alpha[:, None], PRECISION, UPCAST)
        m_i = m_new

    out, lse, seen = finish_rows(acc, m_i, l_i)
    o_ptrs = (out_ptr + split.to(tl.int64) * stride_os + t.to(tl.int64) * stride_ot
              + offs_h[:, None] * stride_oh + offs_d[None, :])
    o_mask = h_ok[:, None] & (offs_d < d_v)[None, :]
    l_ptrs = lse_ptr + split.to(tl.int64) * stride_ls + t.to(tl.int64) * stride_lt + offs_h
    if SPLIT:
        tl.store(o_ptrs, out, mask=o_mask)
        tl.store(l_ptrs, tl.where(seen, lse, float("-inf")), mask=h_ok)
    else:
        tl.store(o_ptrs, out.to(tl.bfloat16), mask=o_mask)
        tl.store(l_ptrs, tl.where(seen, lse, float("inf")), mask=h_ok)
