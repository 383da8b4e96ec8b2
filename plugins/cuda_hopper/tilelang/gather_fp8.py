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

``wsf8c`` converts only its CTA's half of each chunk and takes :func:`fp8_half_gather_macros` instead: eight
lanes to a row, a thread's twenty loads issued before the wait for the stage, the indices read a chunk ahead, the
next chunk's rows prefetched into L2, and each converted piece stored into both CTAs' stages (:mod:`.cluster_push`).
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


# The wsf8c gather's device helpers: loads as FlashMLA's gather issues them (read-only path, kept in L1 with
# evict_last, 256-byte L2 fetches; not volatile, so ptxas schedules a thread's loads together), the next chunk's
# rows into L2 (one bulk prefetch a row: no registers, nothing to wait for), and the conversions of eight values
# whose 16 bytes go into both CTAs' stages (dsa_store_both of .cluster_push.CLUSTER_SRC and the bf16 -> fp16
# conversion of .q_f16.Q_F16_SRC, both placed before these in the prelude).
GATHER_SRC = r"""
__device__ __forceinline__ void dsa_ld_nc8(void* dst, const void* src) {
  int2 r;
  asm("ld.global.nc.L1::evict_last.L2::256B.v2.s32 {%0, %1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(src));
  *static_cast<int2*>(dst) = r;
}

__device__ __forceinline__ void dsa_ld_nc16(void* dst, const void* src) {
  int4 r;
  asm("ld.global.nc.L1::evict_last.L2::256B.v4.s32 {%0, %1, %2, %3}, [%4];"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(src));
  *static_cast<int4*>(dst) = r;
}

__device__ __forceinline__ void dsa_prefetch_row_l2(const void* row) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], 656;" :: "l"(row) : "memory");
}

// Eight e4m3 values (registers) times fp16(scale) -> eight fp16 (e4m3 -> fp16 is exact; one rounding, the
// product's), into both stages.
__device__ __forceinline__ void dsa_cvt8_both(void* dst, unsigned delta, unsigned rbar, const void* src,
                                              float scale) {
  const unsigned short* s = static_cast<const unsigned short*>(src);
  unsigned sc2, h[4];
  asm("cvt.rn.f16x2.f32 %0, %1, %1;" : "=r"(sc2) : "f"(scale));
  #pragma unroll
  for (int i = 0; i < 4; ++i) {
    unsigned x;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(x) : "h"(s[i]));
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(h[i]) : "r"(x), "r"(sc2));
  }
  dsa_store_both(dst, delta, rbar, make_uint4(h[0], h[1], h[2], h[3]));
}

// Eight bf16 values (registers) -> eight fp16 (.q_f16.Q_F16_SRC's conversion), into both stages.
__device__ __forceinline__ void dsa_rope8_both(void* dst, unsigned delta, unsigned rbar, const void* src) {
  dsa_store_both(dst, delta, rbar, dsa_bf16x8_to_f16x8(src));
}
"""


def half_slot(g: Any, rank: Any, i: Any) -> tuple[Any, Any]:
    """``wsf8c``: the stage row and 16-byte piece (8 columns of each 64-column atom) gather thread ``g`` (0..127)
    converts in pass ``i`` (0..1) in CTA ``rank``: row ``32 rank + 16 i + 4 (g // 32) + (g % 32) // 8``, piece
    ``g % 8``. Eight consecutive lanes share a row, so a warp's store of piece ``p`` of atom ``a`` writes four whole
    128-byte rows of the atom (also in the peer CTA, where these rows go over the cluster network)."""
    return rank * 32 + i * 16 + (g // 32) * 4 + (g % 32) // 8, g % 8


def fp8_half_gather_macros(n_kv: Any, n_chunks: int) -> Any:
    """``(prime, gather)``: the gather of ``wsf8c`` (fp16 stages, ``n_chunks`` chunks of 64 rows), which converts
    rows ``32 rank .. + 32`` of every chunk and writes each converted piece into both CTAs' stages.

    ``gather(KV8, Idx, idx_sh, kv_lat, kv_rope, free, ready, phase, tok, c, st, g, rank, nxt, delta, rbar)``
    converts chunk ``c`` of row ``tok`` into stage ``st`` of this CTA and of the peer once ``free[st]`` (both CTAs'
    consumers) has completed ``phase``, then arrives on ``ready[st]`` (thread 0 also expecting the peer's
    :data:`.cluster_push.PEER_BYTES`). ``delta`` and ``rbar``: the peer's shared window offset and its
    ``ready[st]`` (:data:`.cluster_push.CLUSTER_SRC`). ``prime(Idx, nxt, tok, g, rank)`` fills ``nxt`` (an int32
    local of 5) for chunk 0 before the first call.

    Thread ``g`` converts piece ``g % 8`` of two stage rows (:func:`half_slot`): per row eight 8-byte latent loads
    (bytes ``64 a + 8 p ..``), the row's four scales (16 bytes) and rope values ``8 p .. + 8`` (16 bytes), twenty
    loads from two row addresses, 48 registers of data, all issued before the wait for the stage, which registers
    do not need: their latency overlaps the consumers' last use of it. Each converted piece (eight fp16) is stored
    locally and sent to the peer from the same registers, eight lanes to a row: no warpgroup barrier and no bulk
    push on the rows' path (:mod:`.cluster_push`). An index of ``-1`` (or ``>= S``) reads nothing: zero registers,
    a zero stage row (its score is masked; a zero ``V`` row keeps ``0 * V`` finite).

    The indices are read ahead: ``nxt`` holds, between calls, this thread's two row indices for chunks ``c`` and
    ``c + 1`` and the mask index (``g < 64``) of chunk ``c``. So chunk ``c``'s loads wait on no index read; while
    they are in flight the gather reads chunk ``c + 2``'s row indices and chunk ``c + 1``'s mask index, and one
    thread of the eight that share a row prefetches chunk ``c + 1``'s row into L2 (:data:`GATHER_SRC`). Reading
    each chunk's index just before its loads put two memory latencies in a row on the gather's path (0.1061 ms
    against 0.1158 at batch 64 x 32K with the read-ahead and the prefetch, H200, 2026-11-27)."""
    import tilelang.language as T

    from dsa_runtime.plugins.cuda_hopper.tilelang.cluster_push import PEER_BYTES

    bf16, f32, fp8 = "bfloat16", "float32", "float8_e4m3fn"

    def row_of(g, rank, i):
        return half_slot(g, rank, i)[0]

    @T.macro
    def prime(Idx, nxt, tok, g, rank):
        for i in T.unroll(2):
            nxt[i] = Idx[tok, row_of(g, rank, i)]
            if n_chunks > 1:
                nxt[2 + i] = Idx[tok, BI + row_of(g, rank, i)]
            else:
                nxt[2 + i] = -1
        nxt[4] = Idx[tok, g % BI]

    @T.macro
    def gather(KV8, Idx, idx_sh, kv_lat, kv_rope, free, ready, phase, tok, c, st, g, rank, nxt, delta, rbar):
        KVS = T.view(KV8, (n_kv, ROW_BYTES // 4), f32)
        KVR = T.view(KV8, (n_kv, ROW_BYTES // 2), bf16)
        lat8 = T.alloc_local((2, 8, 8), fp8)
        sc = T.alloc_local((2, 4), f32)
        rope = T.alloc_local((2, 8), bf16)
        p = g % 8
        c0 = c * BI
        row = T.alloc_var("int32")  # a variable, not an inlined Idx read: the guards below name it
        for i in T.unroll(2):
            row = nxt[i]
            if (row >= 0) and (row < n_kv):
                for a in T.unroll(8):
                    T.call_extern("handle", "dsa_ld_nc8", T.access_ptr(lat8[i, a, 0], "w", 8),
                                  T.access_ptr(KV8[row, a * 64 + p * 8], "r", 8))
                T.call_extern("handle", "dsa_ld_nc16", T.access_ptr(sc[i, 0], "w", 4),
                              T.access_ptr(KVS[row, SCALE_AT], "r", 4))
                T.call_extern("handle", "dsa_ld_nc16", T.access_ptr(rope[i, 0], "w", 8),
                              T.access_ptr(KVR[row, ROPE_AT + p * 8], "r", 8))
            else:  # -1 (or past the cache): a zero row, nothing read
                for a in T.unroll(8):
                    for v in T.vectorized(8):
                        lat8[i, a, v] = T.cast(0, fp8)
                for v in T.vectorized(4):
                    sc[i, v] = T.float32(0)
                for v in T.vectorized(8):
                    rope[i, v] = T.cast(0, bf16)
        for i in T.unroll(2):
            row = nxt[2 + i]  # chunk c + 1's (-1 past the last chunk)
            if p == 0:  # noqa: SIM102 - the guard must stay the exact `if ((0 <= row) && (row < n_kv))` the check reads
                if (row >= 0) and (row < n_kv):
                    T.call_extern("handle", "dsa_prefetch_row_l2", T.access_ptr(KV8[row, 0], "r"))
        mask = T.alloc_var("int32")
        mask = nxt[4]
        for i in T.unroll(2):
            nxt[i] = nxt[2 + i]
            nxt[2 + i] = T.if_then_else(c + 2 < n_chunks, Idx[tok, c0 + 2 * BI + row_of(g, rank, i)], -1)
        nxt[4] = T.if_then_else(c + 1 < n_chunks, Idx[tok, c0 + BI + g % BI], -1)
        T.barrier_wait(free[st], phase)  # the loads are in flight; the stores need the stage free in both CTAs
        if g < BI:  # the score warpgroup's mask reads them: after the stage is free
            idx_sh[st, g] = mask
        for i in T.unroll(2):
            for a in T.unroll(8):
                T.call_extern("handle", "dsa_cvt8_both",
                              T.access_ptr(kv_lat[st, row_of(g, rank, i), a * 64 + p * 8], "w", 8), delta, rbar,
                              T.access_ptr(lat8[i, a, 0], "r", 8), sc[i, a // 2])
            T.call_extern("handle", "dsa_rope8_both", T.access_ptr(kv_rope[st, row_of(g, rank, i), p * 8], "w", 8),
                          delta, rbar, T.access_ptr(rope[i, 0], "r", 8))
        T.fence_proxy_async()  # generic-proxy stores of the stage, read next by wgmma (async proxy)
        if g == 0:
            T.mbarrier_arrive_expect_tx(ready[st], PEER_BYTES)  # and the peer's half, its st.async bytes
        else:
            T.barrier_arrive(ready[st])

    return prime, gather
