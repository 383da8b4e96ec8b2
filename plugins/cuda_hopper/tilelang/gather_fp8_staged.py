"""The staged ``fp8_656`` gather of ``wsf8s``: rows copied raw into shared memory with cp.async, then converted.

The register gather (:mod:`.gather_fp8`) holds every row it loads in registers, so at 88 registers a gather warp
keeps about four rows in flight and waits a memory latency per pass (ptxas interleaves a larger batch with its
conversions to fit). Here the copies hold no registers: each 32-row block is copied as it is stored (656 bytes a
row) into one of :data:`RAW_STAGES` shared-memory staging buffers, ``RAW_STAGES - 1`` blocks ahead of the block
being converted, and the conversion reads shared memory only.

Shared memory: the bf16 ring of the consumers holds two 32-row stages (``wsf8s`` runs ``BI = 32``) instead of two
64-row ones, which frees the room for three raw stages (``3 x 32 x 656`` bytes).

Per gather warp ``w`` (of 4) and block ``b`` (rows ``32 b .. 32 b + 32`` of the index list), rows ``8 w .. 8 w + 8``:

* issue: one cp.async per lane and row for the latent (lane ``l``: bytes ``16 l .. + 16``) and one for lanes
  ``0..8`` covering the 16 bytes of scales (lane 0) and the 128 bytes of rope (lanes 1..8); an index of ``-1`` (or
  ``>= S``) is a zero-filling copy that reads nothing, so that row converts to zeros; each thread then arrives on
  ``raw_ready[stage]`` with ``cp.async.mbarrier.arrive.noinc`` (128 arrivals);
* convert: after ``raw_ready`` and the ring stage's ``free``, lane ``l`` turns latent bytes ``16 l .. + 16`` of each
  of its warp's rows into bf16 (times scale ``l // 8``) and copies rope values ``2 l, 2 l + 1``; the warp's lanes
  0..7 store the block's indices for the score warpgroup's mask; ``fence.proxy.async`` and an arrival on
  ``ready[stage]``.

A warp copies into and converts from only its own 8 rows of a staging buffer, so reusing a buffer three blocks
later needs no warpgroup barrier. Row indices are loaded three blocks ahead (lanes 0..7 of warp ``w`` hold row
``8 w + l``) and shuffled to the lanes, so no copy waits on an index load.
"""

# No ``from __future__ import annotations``: TileLang evaluates the kernel's annotations.
from typing import Any

from dsa_runtime.plugins.cuda_hopper.tilelang.gather_fp8 import ROPE_AT, ROW_BYTES, SCALE_AT, WARPS

SBI = 32  # rows per block (the ring stage of wsf8s)
RAW_STAGES = 3
ROWS_PER_WARP = SBI // WARPS
UNROLL = 6  # lcm(RAW_STAGES, 2 ring stages): every stage index is a constant in the unrolled body


def staged_buffers(T: Any) -> tuple:
    """``(raw_lat, raw_sc, raw_rope)``: the staging buffers, allocated in the kernel body."""
    raw_lat = T.alloc_shared((RAW_STAGES, SBI, 512), "float8_e4m3fn")
    raw_sc = T.alloc_shared((RAW_STAGES, SBI, 4), "float32")
    raw_rope = T.alloc_shared((RAW_STAGES, SBI, 64), "bfloat16")
    return raw_lat, raw_sc, raw_rope


def staged_gather_macro(n_kv: Any, k: int) -> Any:
    """The macro ``staged_gather(KV8, Idx, raw_lat, raw_sc, raw_rope, raw_ready, idx_sh, kv_lat, kv_rope, ready,
    free, tok, g)``: the whole gather loop of one (query row, head block) over ``k // 32`` blocks; ``raw_ready`` a
    list of :data:`RAW_STAGES` mbarriers of 128 arrivals, ``ready`` / ``free`` the ring's (2 stages)."""
    import tilelang.language as T

    bf16, f32, fp8 = "bfloat16", "float32", "float8_e4m3fn"
    n_blocks = k // SBI
    assert k % SBI == 0

    @T.macro
    def issue(KV8, KVS, KVR, raw_lat, raw_sc, raw_rope, raw_ready, ids, rs, lane, wid):
        """cp.async of this warp's 8 rows of one block (indices ``ids``: lane ``i`` holds row ``i``) into stage
        ``rs``, then this thread's arrival on ``raw_ready[rs]`` once its copies land."""
        row = T.alloc_var("int32")
        for i in T.unroll(ROWS_PER_WARP):
            row = T.shfl_sync(ids, i)
            ok = (row >= 0) and (row < n_kv)
            src = T.max(T.min(row, n_kv - 1), 0)  # in bounds even when not read
            r = wid * ROWS_PER_WARP + i
            T.ptx_cp_async(T.access_ptr(raw_lat[rs, r, lane * 16], "w", 16),
                           T.access_ptr(KV8[src, lane * 16], "r", 16), 16, ok)
            if lane == 0:
                T.ptx_cp_async(T.access_ptr(raw_sc[rs, r, 0], "w", 4),
                               T.access_ptr(KVS[src, SCALE_AT], "r", 4), 4, ok)
            elif lane <= 8:
                T.ptx_cp_async(T.access_ptr(raw_rope[rs, r, (lane - 1) * 8], "w", 8),
                               T.access_ptr(KVR[src, ROPE_AT + (lane - 1) * 8], "r", 8), 8, ok)
        T.cp_async_barrier_noinc(raw_ready[rs])

    @T.macro
    def convert(raw_lat, raw_sc, raw_rope, kv_lat, kv_rope, rs, st, lane, wid):
        """This warp's 8 rows of staging buffer ``rs`` into ring stage ``st`` as bf16."""
        for i in T.unroll(ROWS_PER_WARP):
            r = wid * ROWS_PER_WARP + i
            sc = raw_sc[rs, r, lane // 8]
            for h2 in T.unroll(2):
                for v in T.vectorized(8):
                    kv_lat[st, r, lane * 16 + h2 * 8 + v] = T.cast(
                        T.cast(raw_lat[rs, r, lane * 16 + h2 * 8 + v], f32) * sc, bf16)
            for v in T.vectorized(2):
                kv_rope[st, r, lane * 2 + v] = raw_rope[rs, r, lane * 2 + v]

    @T.macro
    def staged_gather(KV8, Idx, raw_lat, raw_sc, raw_rope, raw_ready, idx_sh, kv_lat, kv_rope, ready, free,
                      tok, g):
        KVS = T.view(KV8, (n_kv, ROW_BYTES // 4), f32)
        KVR = T.view(KV8, (n_kv, ROW_BYTES // 2), bf16)
        lane, wid = g % 32, g // 32
        mine = wid * ROWS_PER_WARP + lane % ROWS_PER_WARP  # this lane's row of every block
        # i0..i2: indices of blocks b .. b + 2 (b the block being converted); i3 loads block b + 3's.
        i0 = T.alloc_var("int32")
        i1 = T.alloc_var("int32")
        i2 = T.alloc_var("int32")
        i3 = T.alloc_var("int32")
        i0 = Idx[tok, mine]
        i1 = Idx[tok, T.min(1, n_blocks - 1) * SBI + mine]
        i2 = Idx[tok, T.min(2, n_blocks - 1) * SBI + mine]
        for b0, ids in ((0, i0), (1, i1))[: RAW_STAGES - 1]:  # blocks 0 and 1 on their way before the loop
            if b0 < n_blocks:
                issue(KV8, KVS, KVR, raw_lat, raw_sc, raw_rope, raw_ready, ids, b0, lane, wid)
        for r in T.serial(-(-n_blocks // UNROLL)):
            for u in T.unroll(UNROLL):
                b = r * UNROLL + u
                if b < n_blocks:
                    i3 = Idx[tok, T.min(b + 3, n_blocks - 1) * SBI + mine]
                    if b + RAW_STAGES - 1 < n_blocks:
                        issue(KV8, KVS, KVR, raw_lat, raw_sc, raw_rope, raw_ready, i2, (u + 2) % RAW_STAGES,
                              lane, wid)
                    T.barrier_wait(raw_ready[u % RAW_STAGES], (b // RAW_STAGES) % 2)
                    T.barrier_wait(free[u % 2], (b // 2 + 1) % 2)
                    if lane < ROWS_PER_WARP:
                        idx_sh[u % 2, mine] = i0
                    convert(raw_lat, raw_sc, raw_rope, kv_lat, kv_rope, u % RAW_STAGES, u % 2, lane, wid)
                    T.fence_proxy_async()  # generic-proxy stores of the stage, read next by wgmma (async proxy)
                    T.barrier_arrive(ready[u % 2])
                    i0 = i1
                    i1 = i2
                    i2 = i3

    return staged_gather
