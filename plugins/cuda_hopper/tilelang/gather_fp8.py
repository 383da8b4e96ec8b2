"""The ``fp8_656`` gathers of the warp-specialised schedules (``ws4f8``, ``wsf8``, ``wsf8h``, ``wsf8c``): TileLang
macros run by the gather warpgroup, which dequantise cache rows into the ring stage the consumer warpgroups read
(bf16, or fp16 for ``wsf8h`` / ``wsf8c``).

A ``fp8_656`` row (656 bytes; ``dsa_runtime.families``): bytes ``[0, 512)`` the latent as e4m3, ``[512, 528)``
four fp32 scales (scale ``u`` covers latent columns ``128 u .. + 128``; any fp32 value is read, the cache writes
powers of two), ``[528, 656)`` the 64 bf16 rope values. The stage row is ``[fp32(e4m3) * scale -> bf16 | rope]``,
the bf16 576-row the bf16 gathers copy (fp16: ``fp16(e4m3) * fp16(scale) | fp16(rope)``).

The rows are read straight from global memory into registers (no staging buffer: the bf16 ring fills shared
memory): one warp per row, 4 rows a pass, 16 passes a 64-row chunk; a warp issues the loads of ``in_flight``
rows before it converts them (``wsf8``: 4, ``ws4f8``: 1, its 48 registers hold no more). Lane ``l`` loads latent bytes
``16 l .. + 16`` (one 16-byte load, all under scale ``l // 8``), that scale, and rope values ``2 l, 2 l + 1``; a
warp's loads of a row are contiguous. An index of ``-1`` (or ``>= S``) reads nothing: the registers are zero, so
the stage row is zero (its score is masked; a zero ``V`` row keeps ``0 * V`` finite).

Indices: each lane loads one index a chunk and every pass takes its row's by warp shuffle (warp ``w`` fills rows
``4 p + w``; lane ``l`` holds row ``4 (l % 16) + w``, pass ``p`` reads lane ``p``). Reading ``Idx`` once per row
costs a 64-bit address each (``n_tok * k`` is unbounded), which did not fit the ``ws4`` gather's registers.
Threads ``g < 64`` also store the chunk's indices into ``idx_sh`` for the score warpgroup's mask.

The stage is written with ordinary stores (generic proxy) and read by wgmma (async proxy): every gather thread
fences (``fence.proxy.async``) and then arrives on ``ready[stage]`` (128 arrivals, the count the cp.async gather's
``cp.async.mbarrier.arrive.noinc`` gave).

``wsf8c`` converts only its CTA's half of each chunk and takes :func:`fp8_half_gather_macros` instead: one row per
thread, all of a thread's loads from one row address and issued before the wait for the stage, the indices read
a chunk ahead and the next chunk's rows prefetched into L2.
"""

# No ``from __future__ import annotations``: TileLang evaluates the kernel's annotations.
from typing import Any

from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import D_LATENT

ROW_BYTES = 656
SCALE_AT = D_LATENT // 4  # in the fp32 view: bytes 512..527
ROPE_AT = (D_LATENT + 16) // 2  # in the bf16 view: bytes 528..655
WARPS = 4  # gather warps: one row each per pass
BI = 64  # rows per chunk (the schedules' chunk)


def lane_slot(g: Any) -> Any:
    """Chunk position of the index lane ``g % 32`` of gather warp ``g // 32`` holds (passes shuffle it out)."""
    return ((g % 32) % 16) * WARPS + g // 32


def half_row(g: Any, rank: Any) -> Any:
    """``wsf8c``: the stage row gather thread ``g`` owns in CTA ``rank``'s half, ``32 rank + 8 (g // 32) + g % 8``
    (lanes ``l``, ``l + 8``, ``l + 16``, ``l + 24`` of a warp share it, a column group each)."""
    return rank * 32 + (g // 32) * 8 + (g % 32) % 8


def fp8_gather_macro(n_kv: Any, in_flight: int = 1, out: str = "bfloat16") -> Any:
    """The gather macro ``fp8_gather(KV8, Idx, idx_sh, kv_lat, kv_rope, ready, tok, c0, st, g)``: ``KV8``
    the ``[S, 656]`` e4m3 cache, ``g`` the thread's index in the gather warpgroup (0..127), chunk ``c0 .. c0 +
    64`` of row ``tok`` into stage ``st``; ends with the warpgroup's arrival on ``ready[st]``.

    ``in_flight``: rows a warp loads per pass before converting them (6 registers a lane each): the loads of one
    row alone keep too few bytes in flight to cover the memory latency. ``out``: the stage's dtype
    (``"float16"``: e4m3 -> fp16 is one instruction a pair and the scale one fp16 multiply a pair, where bf16 goes
    through fp32, three instructions a value; the rope converted from bf16)."""
    import tilelang.language as T

    bf16, f16, f32, fp8 = "bfloat16", "float16", "float32", "float8_e4m3fn"
    half = out == f16
    r_n = in_flight
    passes = BI // WARPS // r_n
    assert (BI // WARPS) % r_n == 0 and passes % 2 == 0

    @T.macro
    def load_rows(KV8, KVS, KVR, lat8, sc, rope, mine, pp, lane):
        """The rows of pass ``pp`` into registers (zeros for an index of -1 or past the cache)."""
        row = T.alloc_var("int32")
        for i in T.unroll(r_n):
            row = T.shfl_sync(mine, pp * r_n + i)
            if (row >= 0) and (row < n_kv):
                for v in T.vectorized(16):
                    lat8[i, v] = KV8[row, lane * 16 + v]
                sc[i] = KVS[row, SCALE_AT + lane // 8]
                for v in T.vectorized(2):
                    rope[i, v] = KVR[row, ROPE_AT + lane * 2 + v]
            else:  # -1 (or past the cache): a zero row, nothing read
                for v in T.vectorized(16):
                    lat8[i, v] = T.cast(0, fp8)
                sc[i] = T.float32(0)
                for v in T.vectorized(2):
                    rope[i, v] = T.cast(0, bf16)

    @T.macro
    def store_rows(kv_lat, kv_rope, lat8, sc, rope, st, pp, lane, wid):
        """Pass ``pp``'s rows converted into the stage."""
        for i in T.unroll(r_n):
            dst = (pp * r_n + i) * WARPS + wid
            if half:
                sc_h = T.cast(sc[i], f16)
                for h2 in T.unroll(2):
                    for v in T.vectorized(8):
                        kv_lat[st, dst, lane * 16 + h2 * 8 + v] = T.cast(lat8[i, h2 * 8 + v], f16) * sc_h
                for v in T.vectorized(2):
                    kv_rope[st, dst, lane * 2 + v] = T.cast(T.cast(rope[i, v], f32), f16)
            else:
                for h2 in T.unroll(2):
                    for v in T.vectorized(8):
                        kv_lat[st, dst, lane * 16 + h2 * 8 + v] = T.cast(
                            T.cast(lat8[i, h2 * 8 + v], f32) * sc[i], bf16)
                for v in T.vectorized(2):
                    kv_rope[st, dst, lane * 2 + v] = rope[i, v]

    @T.macro
    def fp8_gather(KV8, Idx, idx_sh, kv_lat, kv_rope, ready, tok, c0, st, g):
        # The scales and the rope through views of the same buffer: one base pointer and row offset for all.
        KVS = T.view(KV8, (n_kv, ROW_BYTES // 4), f32)
        KVR = T.view(KV8, (n_kv, ROW_BYTES // 2), bf16)
        lat8 = T.alloc_local((r_n, 16), fp8)
        sc = T.alloc_local((r_n,), f32)
        rope = T.alloc_local((r_n, 2), bf16)
        lane, wid = g % 32, g // 32
        if g < BI:
            idx_sh[st, g] = Idx[tok, c0 + g]
        mine = Idx[tok, c0 + lane_slot(g)]
        for pp in T.serial(passes):
            load_rows(KV8, KVS, KVR, lat8, sc, rope, mine, pp, lane)
            store_rows(kv_lat, kv_rope, lat8, sc, rope, st, pp, lane, wid)
        T.fence_proxy_async()  # generic-proxy stores of the stage, read next by wgmma (async proxy)
        T.barrier_arrive(ready[st])

    return fp8_gather


# The gather's loads (dsa_ld_nc16), and the next chunk's rows into L2 while this chunk's loads are in flight: one
# bulk prefetch a row (656 bytes, no registers, nothing to wait for).
PREFETCH_SRC = r"""
// A row's 16-byte load as FlashMLA's gather issues it: read-only path, kept in L1 (evict_last), 256-byte L2
// fetches (a 656-byte row spans three); not volatile, so ptxas may still schedule the eleven loads together.
__device__ __forceinline__ void dsa_ld_nc16(void* dst, const void* src) {
  int4 r;
  asm("ld.global.nc.L1::evict_last.L2::256B.v4.s32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(src));
  *static_cast<int4*>(dst) = r;
}
__device__ __forceinline__ void dsa_prefetch_row_l2(const void* row) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], 656;" :: "l"(row) : "memory");
}
"""


def fp8_half_gather_macros(n_kv: Any, n_chunks: int) -> Any:
    """``(prime, gather)``: the gather of ``wsf8c`` (one row per thread, fp16 stages, ``n_chunks`` chunks of 64).

    ``gather(KV8, Idx, idx_sh, kv_lat, kv_rope, free, phase, tok, c, st, g, rank, nxt)`` converts rows
    ``32 rank .. + 32`` of chunk ``c`` of row ``tok`` into stage ``st`` once ``free[st]`` has completed ``phase``; no
    arrival on ``ready`` (the caller first pushes the half into the peer CTA: :mod:`.cluster_push`).
    ``prime(Idx, nxt, tok, g, rank)`` fills ``nxt`` (an int32 local of 3) for chunk 0 before the first call.

    Thread ``g`` (warp ``w = g // 32``, lane ``l``) owns stage row ``32 rank + 8 w + l % 8`` (:func:`half_row`) and
    its column group
    ``l // 8``: latent bytes ``64 d + 16 (l // 8) .. + 16`` for ``d`` in 0..7 (eight 16-byte loads), the row's four
    scales (one 16-byte load) and rope values ``32 u + 8 (l // 8) .. + 8`` for ``u`` in 0..1 (two 16-byte loads).
    All eleven loads of a thread come from one row address, so they fit the gather's registers together (44 of
    data) and are in flight at once: the half chunk (21 KB) is read in one memory latency. They are
    ``ld.global.nc.L1::evict_last.L2::256B``, FlashMLA's flavour (H200, batch 64 x 32K, same run: 0.0954 ms a call
    of a 4-layer graph against 0.0960 with plain loads; batch 128 0.1921 against 0.1932). They are issued before
    the wait for the stage, which registers do not need, so that latency overlaps the consumers' last use of it.

    The indices are read ahead: ``nxt`` holds, between calls, this thread's row index for chunks ``c`` and
    ``c + 1`` and the mask index (``g < 64``) of chunk ``c``. So chunk ``c``'s loads wait on no index read; while
    they are in flight the gather reads chunk ``c + 2``'s row index and chunk ``c + 1``'s mask index, and one
    thread of the four that share a row prefetches chunk ``c + 1``'s row into L2 (:data:`PREFETCH_SRC`).
    Reading each chunk's index just before its loads put two memory latencies in a row on the gather's path: in a
    per-chunk globaltimer trace (H200, batch 64 x 32K, 2026-11-27) its chunk period was about 2.7 us, nearly all
    of it from issuing the loads to storing the rows, while the score warpgroup waited 1.3 us a chunk for rows.
    With the indices read ahead and the prefetch, 0.1061 ms against 0.1158 in the same run (docs/benchmarks.md,
    session 15; the share of each of the two was not measured apart)."""
    import tilelang.language as T

    bf16, f16, f32, fp8 = "bfloat16", "float16", "float32", "float8_e4m3fn"
    lat_parts, rope_parts = D_LATENT // 64, 2

    @T.macro
    def prime(Idx, nxt, tok, g, rank):
        dst = half_row(g, rank)
        nxt[0] = Idx[tok, dst]
        if n_chunks > 1:
            nxt[1] = Idx[tok, BI + dst]
        else:
            nxt[1] = -1
        nxt[2] = Idx[tok, g % BI]

    @T.macro
    def gather(KV8, Idx, idx_sh, kv_lat, kv_rope, free, phase, tok, c, st, g, rank, nxt):
        KVS = T.view(KV8, (n_kv, ROW_BYTES // 4), f32)
        KVR = T.view(KV8, (n_kv, ROW_BYTES // 2), bf16)
        lat8 = T.alloc_local((lat_parts, 16), fp8)
        sc = T.alloc_local((4,), f32)
        rope = T.alloc_local((rope_parts, 8), bf16)
        lane = g % 32
        col = lane // 8
        dst = half_row(g, rank)
        c0 = c * BI
        row = T.alloc_var("int32")  # a variable, not an inlined Idx read: the guards below name it
        row = nxt[0]
        if (row >= 0) and (row < n_kv):
            for d in T.unroll(lat_parts):
                T.call_extern("handle", "dsa_ld_nc16", T.access_ptr(lat8[d, 0], "w", 16),
                              T.access_ptr(KV8[row, d * 64 + col * 16], "r", 16))
            T.call_extern("handle", "dsa_ld_nc16", T.access_ptr(sc[0], "w", 4), T.access_ptr(KVS[row, SCALE_AT], "r", 4))
            for u in T.unroll(rope_parts):
                T.call_extern("handle", "dsa_ld_nc16", T.access_ptr(rope[u, 0], "w", 8),
                              T.access_ptr(KVR[row, ROPE_AT + u * 32 + col * 8], "r", 8))
        else:  # -1 (or past the cache): a zero row, nothing read
            for d in T.unroll(lat_parts):
                for v in T.vectorized(16):
                    lat8[d, v] = T.cast(0, fp8)
            for v in T.vectorized(4):
                sc[v] = T.float32(0)
            for u in T.unroll(rope_parts):
                for v in T.vectorized(8):
                    rope[u, v] = T.cast(0, bf16)
        row = nxt[1]  # chunk c + 1's (-1 past the last chunk)
        if col == 0:  # noqa: SIM102 - the guard must stay the exact `if ((0 <= row) && (row < n_kv))` the check reads
            if (row >= 0) and (row < n_kv):
                T.call_extern("handle", "dsa_prefetch_row_l2", T.access_ptr(KV8[row, 0], "r"))
        mask = T.alloc_var("int32")
        mask = nxt[2]
        nxt[0] = row
        nxt[1] = T.if_then_else(c + 2 < n_chunks, Idx[tok, c0 + 2 * BI + dst], -1)
        nxt[2] = T.if_then_else(c + 1 < n_chunks, Idx[tok, c0 + BI + g % BI], -1)
        T.barrier_wait(free[st], phase)  # the loads are in flight; the stores need the stage
        if g < BI:  # the score warpgroup's mask reads them: after the stage is free
            idx_sh[st, g] = mask
        for d in T.unroll(lat_parts):
            sc_h = T.cast(sc[d // 2], f16)
            for h2 in T.unroll(2):
                for v in T.vectorized(8):
                    kv_lat[st, dst, d * 64 + col * 16 + h2 * 8 + v] = T.cast(lat8[d, h2 * 8 + v], f16) * sc_h
        for u in T.unroll(rope_parts):
            for v in T.vectorized(8):
                kv_rope[st, dst, u * 32 + col * 8 + v] = T.cast(T.cast(rope[u, v], f32), f16)
        T.fence_proxy_async()  # generic-proxy stores of the stage, read next by wgmma / bulk copies (async proxy)

    return prime, gather
