"""The warp-specialised schedules (``variant="ws"`` / ``"wsa"``) of the sparse MLA forward, as a TileLang program.

384 threads per (query row, 64-head group) block, in three warpgroups with fixed roles:

* ``score`` (threads 0-127): ``S = Q . K^T`` for the whole chunk of ``BI = 64`` gathered rows (one wgmma tile,
  Q from shared memory), the online softmax (fp32, base 2, masked columns ``-inf``), then it publishes ``P``
  (bf16) and the row rescale factors in shared memory and accumulates ``O[:, 0:256] += P . V[:, 0:256]``;
* ``value`` (threads 128-255): waits for ``P``, rescales and accumulates ``O[:, 256:512] += P . V[:, 256:512]``;
* ``gather`` (threads 256-383): copies each chunk's 64 indices and its 64 KV rows (576 columns) into a ring of
  two shared-memory stages with cp.async, 16 bytes per copy, 8 threads per 128-byte segment of a row; an index
  of ``-1`` (or ``>= S``) is a zero-filling copy that reads nothing. Each stage's arrival is tracked by an
  mbarrier that completes when every copy of the 128 gather threads has landed (``cp.async.mbarrier.arrive``).

mbarriers: ``ready[s]`` (gather -> compute, stage ``s`` filled), ``free[s]`` (both compute warpgroups done with
stage ``s``), ``p_ready`` / ``p_free`` (score -> value and back: ``P`` and the rescale factors published /
consumed, one phase per chunk) and ``done`` (the final row sums, for the value warpgroup's normalisation).
Chunk ``c`` lives in stage ``c % 2``; its ready/free phase is ``c // 2`` and its P phase is ``c``, so every wait
uses that phase's parity. While ``value`` multiplies by ``P`` of chunk ``c``, ``score`` already computes the
scores of chunk ``c + 1``: the two wgmma streams overlap, and the gathers run two chunks ahead.

``variant="wsa"`` also overlaps inside the score warpgroup: for chunk ``c`` it issues the wgmma of ``S(c + 1)``
and of ``P(c) . V(c)[:, 0:256]`` back to back, waits only for the scores (``wgmma.wait_group 1``), runs the
softmax of ``c + 1`` while the tensor cores still multiply ``P(c)``, then waits for that and publishes ``P(c + 1)``
(P stays in registers meanwhile, so one ``p_sh`` buffer is enough).

Register split (``setmaxnreg``): the kernel launches with ``__launch_bounds__(384, 1)``, so ptxas gives every
thread 168 registers (65536 / 384 rounded down to 8) and the CTA's pool holds 168 * 384. ``score`` raises its
count to 240 (128 accumulators of O, 32 of S), ``gather`` lowers its own to 56, ``value`` keeps the launch count
(no instruction): ``(240 + 168 + 56) * 128 <= 168 * 384``. A ``setmaxnreg.inc`` to fewer registers than the
warp holds (the first version asked ``inc 160`` for ``value``) is outside the PTX contract and made the kernel
die on an H200 with "an illegal instruction was encountered"; :mod:`.setmaxnreg_check` rejects it in the
generated source.

``variant="wsf8"``: ``ws`` over the ``fp8_656`` cache (decode only), the gather being :mod:`.gather_fp8`
(ordinary loads and stores into the same ring, an ordinary arrival on ``ready[s]``); setmaxnreg 248 / 168 / 88,
each gather warp loading 4 rows (24 registers a lane) before converting them. ``wsf8h``: the same with fp16
tensor-core operands (Q converted when loaded, the ring, P), which the gather reaches from e4m3 in two
instructions a pair. ``wsf8c``: ``wsf8h`` with the two 64-head blocks of a row launched as a cluster of two that
splits the gather (:mod:`.cluster_push`: each converts half of every chunk and stores each converted piece into
its own stage and, with ``st.async``, into its peer's; ``free`` then counts both CTAs' consumers), a gather whose
loads are issued before the wait for a free stage, its indices read a chunk ahead and the next chunk's rows
prefetched into L2 (:func:`.gather_fp8.fp8_half_gather_macros`; setmaxnreg 240 / 168 / 96). Its outputs (not
split) leave through shared memory: once the last S GEMM is done Q is dead, and its 64 KB buffer, viewed as bf16,
holds the block's ``[64, 512]`` output; each consumer warpgroup writes its half there and stores it with TMA. Its
Q (not split) comes in through :mod:`.q_f16` (every load of a thread in flight at once, then three instructions a
converted pair).

In ncu (H200, batch 64 x 32K) the ``wsf8`` gather warps never waited for a free stage while both consumer
warpgroups waited for rows; the register gather kept ~4 rows a warp in flight whatever the batch size asked (ptxas
interleaves larger batches with their conversions to fit 88 registers), and with that gather an L2 prefetch of the
next chunk's rows and a cp.async-staged gather did not help (the bench numbers are in
docs/benchmarks.md); halving each CTA's rows did.
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

BI = 64
REGS = (240, None, 56)  # score (inc), value (the launch count: no setmaxnreg), gather (dec)
# wsf8: the dequantising gather (.gather_fp8) holds its rows in registers, so it keeps 88; the score warpgroup
# gets 248 (at 240 ptxas spilled 8 bytes there in this build): (248 + 168 + 88) * 128 = 168 * 384, the pool.
REGS_FP8 = (248, None, 88)
# wsf8c: its gather holds a thread's twenty loads (48 registers of data) across the wait for a free stage
# (.gather_fp8.fp8_half_gather_macros); no spill at 96 (4 bytes split), none in the score warpgroup at 240.
# (240 + 168 + 96) * 128 = 168 * 384. H200, 2026-11-27, batch 64 x 32K: 0.1154 ms, against 0.1196 at
# (248, 168, 88) in the same run; (240, 160, 104) measured the same on a later build.
REGS_FP8_CLUSTER = (240, None, 96)
FP8_IN_FLIGHT = 4  # wsf8: rows a gather warp loads before converting (8 spilled at 88 registers)


def ws_program(heads: int, k: int, sm_scale: float, cfg: Any, split: bool = False) -> Any:
    """The ``ws`` / ``wsa`` / ``wsf8`` / ``wsf8h`` / ``wsf8c`` schedule as a TileLang ``PrimFunc`` (imports
    tilelang); ``split`` as in :func:`.sparse_mla.program`. ``k`` must be a multiple of 64 (the chunk); chunks past
    the last are skipped. The FP8 ones: ``ws`` over the ``[S, 656]`` ``fp8_656`` cache viewed as e4m3,
    dequantised by the gather (:mod:`.gather_fp8`); ``wsf8c`` needs 128 heads."""
    import tilelang.language as T

    from dsa_runtime.plugins.cuda_hopper.tilelang.chunk_steps import chunk_steps, ring_buffers, softmax_state
    from dsa_runtime.plugins.cuda_hopper.tilelang.cluster_push import CLUSTER_SRC
    from dsa_runtime.plugins.cuda_hopper.tilelang.gather_fp8 import (
        GATHER_SRC,
        ROW_BYTES,
        fp8_gather_macro,
        fp8_half_gather_macros,
    )
    from dsa_runtime.plugins.cuda_hopper.tilelang.pdl import PDL_SRC
    from dsa_runtime.plugins.cuda_hopper.tilelang.q_f16 import Q_F16_SRC, q_f16_macro

    hb, d, half = HEAD_BLOCK, D_LATENT, D_LATENT // 2
    overlap = cfg.variant == "wsa"
    n_chunks = k // BI
    n_rounds = -(-n_chunks // 2)
    scale2 = sm_scale * LOG2E
    n_tok, n_kv = T.dynamic("n_tok"), T.dynamic("n_kv")
    q_rows = split_q_rows(T, n_tok, split)  # split: q is read in place (.sparse_mla.program)
    bf16, f32 = "bfloat16", "float32"
    out_t = f32 if split else bf16
    fp8 = cfg.variant in ("wsf8", "wsf8h", "wsf8c")
    cluster = cfg.variant == "wsf8c"  # the two head blocks of a row (128 heads: check_shape) share the gather
    # wsf8h / wsf8c: the tensor-core operands (Q, the gathered rows, P) in fp16, which the gather reaches from
    # e4m3 in two instructions a pair (.gather_fp8); bf16 goes through fp32.
    mm_t = "float16" if cfg.variant in ("wsf8h", "wsf8c") else "bfloat16"
    kv_w, kv_t = (ROW_BYTES, "float8_e4m3fn") if fp8 else (D_QK, bf16)
    regs = REGS_FP8_CLUSTER if cluster else REGS_FP8 if fp8 else REGS
    if cluster:  # its loads issued before the wait for a free stage, its stores into both CTAs
        gather_prime, fp8_gather = fp8_half_gather_macros(n_kv, n_chunks)
    else:
        fp8_gather = fp8_gather_macro(n_kv, FP8_IN_FLIGHT, out=mm_t) if fp8 else None

    softmax, lse, scores, bf16_gather = chunk_steps(hb, BI, scale2, n_kv, split)
    # wsf8c's bf16 outputs through the dead Q buffer and TMA stores (H200, batch 64 x 32K: 0.1021 ms against 0.1061
    # with 4-byte stores from the accumulators, same run; split partials are fp32 and twice Q's size)
    staged = cluster and not split
    prelude = ((CLUSTER_SRC + Q_F16_SRC + GATHER_SRC if cluster else "") + (PDL_SRC if split else "")) or None
    q_f16 = q_f16_macro(hb, 128, 0, d, rope=True)  # wsf8c unsplit: Q's loads all in flight at once (.q_f16)

    @T.macro
    def publish(acc_s, alpha, p_sh, alpha_sh, acc_o_lo, p_ready, p_free, c):
        """P and alpha of chunk ``c`` into shared memory, once the value warpgroup has read chunk c - 1's."""
        if c > 0:
            T.barrier_wait(p_free, (c + 1) % 2)
        T.copy(acc_s, p_sh)
        T.copy(alpha, alpha_sh)
        T.fence_proxy_async()  # generic-proxy stores of P, read next by wgmma (async proxy)
        T.barrier_arrive(p_ready)
        for h, e in T.Parallel(hb, half):
            acc_o_lo[h, e] *= alpha[h]


    @T.macro
    def store_half(acc, o_sh, Out, tok, h0, lo, bar):
        """One consumer warpgroup's normalised ``[64, 256]`` output columns ``lo ..``: through the dead Q buffer
        and TMA when ``staged`` (after a barrier of the warpgroup's 128 threads, id ``bar``), else straight."""
        if staged:
            T.copy(acc, o_sh[:, lo : lo + half])
            T.sync_threads(bar, 128)
            T.copy(o_sh[:, lo : lo + half], Out[tok, h0 : h0 + hb, lo : lo + half])
        else:
            T.copy(acc, Out[tok, h0 : h0 + hb, lo : lo + half])

    @T.macro
    def release(free, st, hblk):
        """This consumer thread is done with stage ``st`` (wsf8c: in the peer CTA's count as well)."""
        T.barrier_arrive(free[st])
        if cluster:
            T.mbarrier_arrive(free[st], 1 - hblk)

    @T.prim_func
    def sparse_mla_ws(
        Q: T.Tensor((q_rows, heads, D_QK), bf16),
        KV: T.Tensor((n_kv, kv_w), kv_t),
        Idx: T.Tensor((n_tok, k), "int32"),
        Out: T.Tensor((n_tok, heads, d), out_t),
        Lse: T.Tensor((n_tok, heads), f32),
    ):
        with T.Kernel(n_tok, heads // hb, threads=384, prelude=prelude,
                      cluster_dims=(1, 2, 1) if cluster else None) as (tok, hblk):
            q_lat, q_rope, kv_lat, kv_rope, idx_sh, p_sh, alpha_sh, l_sh = ring_buffers(T, hb, BI, mm_t)
            o_sh = T.view(q_lat, dtype=bf16) if staged else None  # written only once Q is dead (staged)

            acc_s = T.alloc_fragment((hb, BI), f32)
            acc_o_lo = T.alloc_fragment((hb, half), f32)
            acc_o_hi = T.alloc_fragment((hb, half), f32)
            m_i, m_prev, l_i, l_blk, alpha = softmax_state(T, hb)

            ready = T.alloc_barrier([128, 128])
            # wsf8c: both CTAs' consumers free a stage (the peer's arrive remotely)
            free = T.alloc_cluster_barrier([512, 512]) if cluster else T.alloc_barrier([256, 256])
            p_ready = T.alloc_barrier(128)
            p_free = T.alloc_barrier(128)
            done = T.alloc_barrier(128)

            tx = T.get_thread_binding()
            h0 = hblk * hb

            if tx < 128:  # score warpgroup (the only reader of Q: it loads Q while the first gathers run)
                T.set_max_nreg(regs[0], 1)
                if staged:  # wsf8c unsplit (split, at batch 1, T.copy measured 0.4 us faster: 22.9 against 23.3)
                    q_f16(Q, q_lat, q_rope, tok, h0, tx)
                    T.fence_proxy_async()  # generic-proxy stores of Q, read by wgmma (async proxy)
                    T.sync_threads(8, 128)  # (barrier 8: TileLang's own syncs take 3, 4, 5 and 7)
                else:
                    T.copy(Q[split_q_row(T, tok, q_rows, split), h0 : h0 + hb, 0:d], q_lat)
                    T.copy(Q[split_q_row(T, tok, q_rows, split), h0 : h0 + hb, d:D_QK], q_rope)
                T.fill(acc_o_lo, 0)
                T.fill(l_i, 0)
                T.fill(m_i, -(2.0**30))  # finite floor: (m_prev - m) stays finite while all was masked
                if overlap:
                    # Chunk 0 up front; then per chunk c: issue S(c + 1) and P(c) . V(c) back to back, run the
                    # softmax of c + 1 while the tensor cores still multiply P(c), publish P(c + 1) after.
                    T.barrier_wait(ready[0], 0)
                    scores(acc_s, idx_sh, q_lat, q_rope, kv_lat, kv_rope, 0, False)
                    softmax(acc_s, m_i, m_prev, l_i, l_blk, alpha)
                    publish(acc_s, alpha, p_sh, alpha_sh, acc_o_lo, p_ready, p_free, 0)
                    for r in T.serial(n_rounds):
                        for st in T.unroll(2):
                            if r * 2 + st < n_chunks:
                                if r * 2 + st + 1 < n_chunks:
                                    T.barrier_wait(ready[1 - st], (r + st) % 2)
                                    scores(acc_s, idx_sh, q_lat, q_rope, kv_lat, kv_rope, 1 - st, True)
                                    T.wgmma_gemm(p_sh, kv_lat[st, :, 0:half], acc_o_lo)
                                    T.wait_wgmma(1)  # the scores of c + 1 are in; P(c) . V(c) may still run
                                    # Pin the accumulators after each wait: nvcc must not hoist their reads above it.
                                    T.warpgroup_fence_operand(acc_s, num_regs=hb * BI // 128)
                                    softmax(acc_s, m_i, m_prev, l_i, l_blk, alpha)
                                    T.wait_wgmma(0)
                                    T.warpgroup_fence_operand(acc_o_lo, num_regs=hb * half // 128)
                                    release(free, st, hblk)
                                    publish(acc_s, alpha, p_sh, alpha_sh, acc_o_lo, p_ready, p_free, r * 2 + st + 1)
                                else:
                                    T.gemm(p_sh, kv_lat[st, :, 0:half], acc_o_lo)
                                    release(free, st, hblk)
                else:
                    for r in T.serial(n_rounds):
                        for st in T.unroll(2):
                            if r * 2 + st < n_chunks:
                                T.barrier_wait(ready[st], r % 2)
                                scores(acc_s, idx_sh, q_lat, q_rope, kv_lat, kv_rope, st, False)
                                softmax(acc_s, m_i, m_prev, l_i, l_blk, alpha)
                                publish(acc_s, alpha, p_sh, alpha_sh, acc_o_lo, p_ready, p_free, r * 2 + st)
                                T.gemm(p_sh, kv_lat[st, :, 0:half], acc_o_lo)
                                release(free, st, hblk)
                if split:  # the combine kernel (launched with PDL) may start launching: only the stores remain
                    T.call_extern("handle", "dsa_launch_dependents")
                T.copy(l_i, l_sh)
                T.barrier_arrive(done)
                for h, e in T.Parallel(hb, half):
                    acc_o_lo[h, e] = T.if_then_else(l_i[h] > 0, acc_o_lo[h, e] / l_i[h], 0)
                lse(l_blk, l_i, m_i)
                # this warpgroup's last S GEMM has completed: Q is dead. Barrier ids 14 and 15: TileLang's own syncs
                # here take 3, 4 and 5.
                store_half(acc_o_lo, o_sh, Out, tok, h0, 0, 14)
                T.copy(l_blk, Lse[tok, h0 : h0 + hb])
            elif tx < 256:  # value warpgroup: stays at the launch count (151 registers used; see the docstring)
                if regs[1] is not None:
                    T.set_max_nreg(regs[1], 0)
                T.fill(acc_o_hi, 0)
                for r in T.serial(n_rounds):
                    for st in T.unroll(2):
                        if r * 2 + st < n_chunks:
                            T.barrier_wait(p_ready, (r * 2 + st) % 2)
                            T.fence_proxy_async()  # the stage's cp.async rows are read by wgmma next
                            for h, e in T.Parallel(hb, half):
                                acc_o_hi[h, e] *= alpha_sh[h]
                            T.gemm(p_sh, kv_lat[st, :, half:d], acc_o_hi)
                            T.barrier_arrive(p_free)
                            release(free, st, hblk)
                T.barrier_wait(done, 0)
                for h, e in T.Parallel(hb, half):
                    acc_o_hi[h, e] = T.if_then_else(l_sh[h] > 0, acc_o_hi[h, e] / l_sh[h], 0)
                store_half(acc_o_hi, o_sh, Out, tok, h0, half, 15)  # after done: every S GEMM has completed
            else:  # gather warpgroup
                T.set_max_nreg(regs[2], 0)
                g = tx - 256
                if cluster:
                    nxt = T.alloc_local((5,), "int32")  # indices read ahead (.gather_fp8.fp8_half_gather_macros)
                    gather_prime(Idx, nxt, tok, g, hblk)
                    delta = T.alloc_var("uint32")  # the peer's shared window, as an offset from ours
                    delta = T.call_extern("uint32", "dsa_peer_delta", T.access_ptr(kv_lat[0, 0, 0], "r"), 1 - hblk)
                for r in T.serial(n_rounds):
                    for st in T.unroll(2):
                        if r * 2 + st < n_chunks:
                            c0 = (r * 2 + st) * BI
                            if cluster:  # waits for the free stage itself (after its loads); stores into both CTAs
                                fp8_gather(KV, Idx, idx_sh, kv_lat, kv_rope, free, ready, (r + 1) % 2, tok, r * 2 + st,
                                           st, g, hblk, nxt, delta,
                                           T.call_extern("uint32", "dsa_peer_addr", T.address_of(ready[st]), 1 - hblk))
                            elif fp8:
                                T.barrier_wait(free[st], (r + 1) % 2)
                                fp8_gather(KV, Idx, idx_sh, kv_lat, kv_rope, ready, tok, c0, st, g)
                            else:
                                T.barrier_wait(free[st], (r + 1) % 2)
                                bf16_gather(KV, Idx, idx_sh, kv_lat, kv_rope, ready, tok, c0, st, g)
            if cluster:  # no CTA leaves while its peer may still store into it or arrive on its barriers
                T.call_extern("handle", "dsa_cluster_sync")

    return sparse_mla_ws
