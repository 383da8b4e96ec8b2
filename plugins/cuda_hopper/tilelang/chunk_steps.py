"""The per-chunk steps every sparse MLA schedule shares, as TileLang macros (one definition, inlined per program).

* ``softmax``: the online-softmax update of one chunk's scores (fp32, base 2, ``sm_scale * log2(e)`` folded into
  ``scale2``): new row max ``m_i``, rescale factor ``alpha`` of the running sums, probabilities in ``acc_s``,
  running sum ``l_i``;
* ``lse``: the natural-log ``lse`` of each head row from ``l_i`` and ``m_i``; a row without any valid index
  (``l == 0``) gets ``+inf``, or ``-inf`` in a split-K partial (the combine's empty split);
* ``scores``: ``acc_s = mask + Q . K^T`` over ring stage ``st`` (an index of ``-1`` or ``>= S`` masked to
  ``-inf``), with synchronous GEMMs or issued only (``asynchronous``: the caller waits);
* ``ring_buffers`` / ``softmax_state``: the shared memory of the warp-specialised schedules (Q, the two-stage ring of
  rows and their indices, P and the values' rescale factors and row sums) and the running softmax statistics;
* ``bf16_gather``: the producer warpgroup's cp.async copy of one chunk's indices and its 64 bf16 KV rows into ring
  stage ``st`` (16 bytes a copy, 8 threads per 128-byte segment; an index of ``-1`` or ``>= S`` is a zero-filling
  copy that reads nothing), completing ``ready[st]`` through ``cp.async.mbarrier.arrive.noinc``.
"""

# No ``from __future__ import annotations``: TileLang evaluates the macros' annotations.
from typing import Any

from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import D_LATENT, D_ROPE, LN2

ROWS_PER_PASS = 16  # gather: 128 threads = 16 rows x 8 threads, each thread 16 bytes of a 128-byte segment


def ring_buffers(T: Any, hb: int, bi: int, dtype: str) -> tuple:
    """``(q_lat, q_rope, kv_lat, kv_rope, idx_sh, p_sh, alpha_sh, l_sh)`` of a warp-specialised schedule: the
    tensor-core operands in ``dtype`` (Q ``[hb, 512 | 64]``, two ring stages of ``bi`` rows, P ``[hb, bi]``), the
    stages' indices, and fp32 ``[hb]`` rescale factors and row sums for the value warpgroups."""
    f32 = "float32"
    return (T.alloc_shared((hb, D_LATENT), dtype), T.alloc_shared((hb, D_ROPE), dtype),
            T.alloc_shared((2, bi, D_LATENT), dtype), T.alloc_shared((2, bi, D_ROPE), dtype),
            T.alloc_shared((2, bi), "int32"), T.alloc_shared((hb, bi), dtype),
            T.alloc_shared((hb,), f32), T.alloc_shared((hb,), f32))


def softmax_state(T: Any, hb: int) -> tuple:
    """``(m_i, m_prev, l_i, l_blk, alpha)``: fp32 ``[hb]`` fragments of the online softmax."""
    return tuple(T.alloc_fragment((hb,), "float32") for _ in range(5))


def chunk_steps(hb: int, bi: int, scale2: float, n_kv: Any, split: bool) -> Any:
    """``(softmax, lse, scores, bf16_gather)`` for ``hb`` head rows, ``bi``-row chunks and a cache of ``n_kv`` rows."""
    import tilelang.language as T

    f32, d = "float32", D_LATENT

    @T.macro
    def softmax(acc_s, m_i, m_prev, l_i, l_blk, alpha):
        T.copy(m_i, m_prev)
        T.reduce_max(acc_s, m_i, dim=1, clear=False)
        for h in T.Parallel(hb):
            alpha[h] = T.exp2((m_prev[h] - m_i[h]) * scale2)
        for h, j in T.Parallel(hb, bi):
            acc_s[h, j] = T.exp2(acc_s[h, j] * scale2 - m_i[h] * scale2)
        T.reduce_sum(acc_s, l_blk, dim=1)
        for h in T.Parallel(hb):
            l_i[h] = l_i[h] * alpha[h] + l_blk[h]

    @T.macro
    def lse(out, l_i, m_i):
        for h in T.Parallel(hb):
            out[h] = T.if_then_else(l_i[h] > 0, (T.log2(l_i[h]) + m_i[h] * scale2) * LN2,
                                    -T.infinity(f32) if split else T.infinity(f32))

    @T.macro
    def scores(acc_s, idx_sh, q_lat, q_rope, kv_lat, kv_rope, st, asynchronous):
        for h, j in T.Parallel(hb, bi):
            acc_s[h, j] = T.if_then_else(
                (idx_sh[st, j] >= 0) and (idx_sh[st, j] < n_kv), 0, -T.infinity(f32))
        if asynchronous:
            T.wgmma_gemm(q_lat, kv_lat[st, :, :], acc_s, transpose_B=True)
            T.wgmma_gemm(q_rope, kv_rope[st, :, :], acc_s, transpose_B=True)
        else:
            T.gemm(q_lat, kv_lat[st, :, :], acc_s, transpose_B=True)
            T.gemm(q_rope, kv_rope[st, :, :], acc_s, transpose_B=True)

    @T.macro
    def bf16_gather(KV, Idx, idx_sh, kv_lat, kv_rope, ready, tok, c0, st, g):
        row = T.alloc_var("int32")
        if g < bi // 4:  # the chunk's indices: 4 int32 a thread
            T.ptx_cp_async(T.access_ptr(idx_sh[st, g * 4], "w", 4), T.access_ptr(Idx[tok, c0 + g * 4], "r", 4), 4)
        for p in T.unroll(bi // ROWS_PER_PASS):
            row = Idx[tok, c0 + p * ROWS_PER_PASS + g // 8]
            ok = (row >= 0) and (row < n_kv)
            src = T.max(T.min(row, n_kv - 1), 0)  # in bounds even when not read
            dst = p * ROWS_PER_PASS + g // 8
            for u in T.unroll(d // 64):
                T.ptx_cp_async(T.access_ptr(kv_lat[st, dst, u * 64 + (g % 8) * 8], "w", 8),
                               T.access_ptr(KV[src, u * 64 + (g % 8) * 8], "r", 8), 8, ok)
            T.ptx_cp_async(T.access_ptr(kv_rope[st, dst, (g % 8) * 8], "w", 8),
                           T.access_ptr(KV[src, d + (g % 8) * 8], "r", 8), 8, ok)
        T.cp_async_barrier_noinc(ready[st])

    return softmax, lse, scores, bf16_gather
