"""The ``ws4`` schedule of the sparse MLA forward: four warpgroups, the scores apart from all of ``P . V``.

512 threads per (query row, 64-head group) block:

* ``score`` (threads 0-127): ``S = Q . K^T`` for the chunk of ``BI = 64`` gathered rows (Q in shared memory), the
  online softmax (fp32, base 2, masked columns ``-inf``); publishes ``P`` (bf16) and the rescale factors in shared
  memory. It holds no output accumulator, so it computes ``S(c + 1)`` and its softmax while the value
  warpgroups still multiply ``P(c)``: the tensor cores see the scores of one chunk and the ``P . V`` of the
  previous one at once (in ``ws`` the score warpgroup also did half of ``P . V``, serially after its softmax);
* ``value`` (threads 128-383, two warpgroups in one branch): ``O[:, 0:512] += P . V`` as two GEMMs of 256
  columns, TileLang splitting each over the two warpgroups (every warpgroup holds 2 x ``[64, 128]`` fp32, 128
  registers a thread, and runs 64 x 128 wgmma), after rescaling ``O`` by the published factors;
* ``gather`` (threads 384-511): the ``ws`` gather (cp.async, 16 bytes a copy, zero-filling for an index of
  ``-1`` or ``>= S``) into a two-stage ring, each stage's arrival an mbarrier completed by
  ``cp.async.mbarrier.arrive``.

mbarriers: ``ready[s]`` (128 gather arrivals), ``free[s]`` (384: score and both value warpgroups are done with
stage ``s``), ``p_ready`` (128, score -> value) / ``p_free`` (256, value -> score: ``P`` and the factors may be
overwritten), ``done`` (128: the final row sums are in ``l_sh``). Chunk ``c`` lives in stage ``c % 2`` (phase
``c // 2``) and is ``P``'s phase ``c``.

Registers: ``__launch_bounds__(512, 1)`` gives every thread 128; ``score`` lowers to 112, both ``value``
warpgroups raise to 176 and ``gather`` lowers to 40: ``(112 + 2 * 176 + 40) * 128 <= 128 * 512``
(:mod:`.setmaxnreg_check` checks the generated source).

``ws4f8`` (``fp8=True``): the same schedule over the ``fp8_656`` cache, the gather being :mod:`.gather_fp8`
(ordinary loads and stores, an ordinary arrival on ``ready[s]``); its gather gets 48 registers, the whole pool
``(112 + 2 * 176 + 48) * 128 = 128 * 512``, and ptxas spills 40 bytes there.
"""

# No ``from __future__ import annotations``: TileLang evaluates the kernel's annotations, which name locals.
from typing import Any

from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import (
    D_LATENT,
    D_QK,
    HEAD_BLOCK,
    LOG2E,
    split_q_row,
    split_q_rows,
)
from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla_ws import BI

THREADS = 512
REGS = (112, 176, 40)  # score (dec), each value warpgroup (inc), gather (dec)
# ws4f8: the dequantising gather holds its rows in registers. ptxas spilled at 48 (the whole pool: score 112
# and value 176 spill below those), so this spills a little in the gather only (bench/tilelang_compile.py).
REGS_FP8 = (112, 176, 48)


def ws4_program(heads: int, k: int, sm_scale: float, cfg: Any, split: bool = False, fp8: bool = False) -> Any:
    """The ``ws4`` schedule as a TileLang ``PrimFunc`` (imports tilelang); ``split`` as in
    :func:`.sparse_mla.program`. ``k`` must be a multiple of 64 (the chunk). ``fp8`` (``ws4f8``): ``KV`` is the
    ``[S, 656]`` ``fp8_656`` cache viewed as e4m3, dequantised by the gather (:mod:`.gather_fp8`)."""
    import tilelang.language as T

    from dsa_runtime.plugins.cuda_hopper.tilelang.chunk_steps import chunk_steps, ring_buffers, softmax_state
    from dsa_runtime.plugins.cuda_hopper.tilelang.gather_fp8 import ROW_BYTES, fp8_gather_macro

    hb, d, half = HEAD_BLOCK, D_LATENT, D_LATENT // 2
    n_chunks = k // BI
    n_rounds = -(-n_chunks // 2)
    scale2 = sm_scale * LOG2E
    n_tok, n_kv = T.dynamic("n_tok"), T.dynamic("n_kv")
    q_rows = split_q_rows(T, n_tok, split)  # split: q is read in place (.sparse_mla.program)
    bf16, f32 = "bfloat16", "float32"
    out_t = f32 if split else bf16
    kv_w, kv_t = (ROW_BYTES, "float8_e4m3fn") if fp8 else (D_QK, bf16)
    regs = REGS_FP8 if fp8 else REGS
    fp8_gather = fp8_gather_macro(n_kv, 1) if fp8 else None  # one row at a time: 48 registers (2 spilled more)
    softmax, lse, scores, bf16_gather = chunk_steps(hb, BI, scale2, n_kv, split)

    @T.prim_func
    def sparse_mla_ws4(
        Q: T.Tensor((q_rows, heads, D_QK), bf16),
        KV: T.Tensor((n_kv, kv_w), kv_t),
        Idx: T.Tensor((n_tok, k), "int32"),
        Out: T.Tensor((n_tok, heads, d), out_t),
        Lse: T.Tensor((n_tok, heads), f32),
    ):
        with T.Kernel(n_tok, heads // hb, threads=THREADS) as (tok, hblk):
            q_lat, q_rope, kv_lat, kv_rope, idx_sh, p_sh, alpha_sh, l_sh = ring_buffers(T, hb, BI, bf16)

            acc_s = T.alloc_fragment((hb, BI), f32)
            # Two [64, 256] accumulators, each split over the two value warpgroups: every wgmma is then 64 x 128
            # (64 accumulator registers). One [64, 512] would be a 64 x 256 wgmma per warpgroup, which ptxas
            # refuses at this launch's 128 registers a thread (C7602: it needs 154 whatever setmaxnreg raises).
            acc_o0 = T.alloc_fragment((hb, half), f32)
            acc_o1 = T.alloc_fragment((hb, half), f32)
            m_i, m_prev, l_i, l_blk, alpha = softmax_state(T, hb)

            ready = T.alloc_barrier([128, 128])
            free = T.alloc_barrier([384, 384])
            p_ready = T.alloc_barrier(128)
            p_free = T.alloc_barrier(256)
            done = T.alloc_barrier(128)

            tx = T.get_thread_binding()
            h0 = hblk * hb

            if tx < 128:  # score warpgroup (the only reader of Q)
                T.set_max_nreg(regs[0], 0)
                T.copy(Q[split_q_row(T, tok, q_rows, split), h0 : h0 + hb, 0:d], q_lat)
                T.copy(Q[split_q_row(T, tok, q_rows, split), h0 : h0 + hb, d:D_QK], q_rope)
                T.fill(l_i, 0)
                T.fill(m_i, -(2.0**30))  # finite floor: (m_prev - m) stays finite while all was masked
                for r in T.serial(n_rounds):
                    for st in T.unroll(2):
                        if r * 2 + st < n_chunks:
                            T.barrier_wait(ready[st], r % 2)
                            scores(acc_s, idx_sh, q_lat, q_rope, kv_lat, kv_rope, st, False)
                            T.barrier_arrive(free[st])  # K of this stage read; the values still read V
                            softmax(acc_s, m_i, m_prev, l_i, l_blk, alpha)
                            if r * 2 + st > 0:  # the values are done with P and alpha of the chunk before
                                T.barrier_wait(p_free, (r * 2 + st + 1) % 2)
                            T.copy(acc_s, p_sh)
                            T.copy(alpha, alpha_sh)
                            T.fence_proxy_async()  # generic-proxy stores of P, read next by wgmma (async proxy)
                            T.barrier_arrive(p_ready)
                T.copy(l_i, l_sh)
                T.barrier_arrive(done)
                lse(l_blk, l_i, m_i)
                T.copy(l_blk, Lse[tok, h0 : h0 + hb])
            elif tx < 384:  # the two value warpgroups: the gemm splits the 512 columns between them
                T.set_max_nreg(regs[1], 1)
                T.fill(acc_o0, 0)
                T.fill(acc_o1, 0)
                for r in T.serial(n_rounds):
                    for st in T.unroll(2):
                        if r * 2 + st < n_chunks:
                            T.barrier_wait(p_ready, (r * 2 + st) % 2)
                            T.fence_proxy_async()  # the stage's cp.async rows are read by wgmma next
                            for h, e in T.Parallel(hb, half):
                                acc_o0[h, e] *= alpha_sh[h]
                                acc_o1[h, e] *= alpha_sh[h]
                            T.gemm(p_sh, kv_lat[st, :, 0:half], acc_o0, policy=T.GemmWarpPolicy.FullRow)
                            T.gemm(p_sh, kv_lat[st, :, half:d], acc_o1, policy=T.GemmWarpPolicy.FullRow)
                            T.barrier_arrive(p_free)
                            T.barrier_arrive(free[st])
                T.barrier_wait(done, 0)
                for h, e in T.Parallel(hb, half):
                    acc_o0[h, e] = T.if_then_else(l_sh[h] > 0, acc_o0[h, e] / l_sh[h], 0)
                    acc_o1[h, e] = T.if_then_else(l_sh[h] > 0, acc_o1[h, e] / l_sh[h], 0)
                T.copy(acc_o0, Out[tok, h0 : h0 + hb, 0:half])
                T.copy(acc_o1, Out[tok, h0 : h0 + hb, half:d])
            else:  # gather warpgroup (as in ws)
                T.set_max_nreg(regs[2], 0)
                g = tx - 384
                for r in T.serial(n_rounds):
                    for st in T.unroll(2):
                        if r * 2 + st < n_chunks:
                            T.barrier_wait(free[st], (r + 1) % 2)
                            c0 = (r * 2 + st) * BI
                            if fp8:
                                fp8_gather(KV, Idx, idx_sh, kv_lat, kv_rope, ready, tok, c0, st, g)
                            else:
                                bf16_gather(KV, Idx, idx_sh, kv_lat, kv_rope, ready, tok, c0, st, g)

    return sparse_mla_ws4
