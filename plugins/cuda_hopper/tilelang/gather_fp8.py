"""The ``fp8_656`` gather of the warp-specialised schedules (``ws4f8``, ``wsf8``): a TileLang macro run by the
gather warpgroup, which dequantises cache rows into the bf16 ring stage the consumer warpgroups read.

A ``fp8_656`` row (656 bytes; ``dsa_runtime.families``): bytes ``[0, 512)`` the latent as e4m3, ``[512, 528)``
four fp32 scales (scale ``u`` covers latent columns ``128 u .. + 128``; any fp32 value is read, the cache writes
powers of two), ``[528, 656)`` the 64 bf16 rope values. The stage row is ``[fp32(e4m3) * scale -> bf16 | rope]``,
the bf16 576-row the bf16 gathers copy.

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
"""

# No ``from __future__ import annotations``: TileLang evaluates the kernel's annotations.
from typing import Any

from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import D_LATENT

ROW_BYTES = 656
SCALE_AT = D_LATENT // 4  # in the fp32 view: bytes 512..527
ROPE_AT = (D_LATENT + 16) // 2  # in the bf16 view: bytes 528..655
WARPS = 4  # gather warps: one row each per pass
BI = 64  # rows per chunk (the schedules' chunk)
# The kernel prelude of the prefetching gather (``wsf8p``): a 656-byte bulk prefetch into the L2 (sm_90).
PREFETCH_SRC = """
__device__ __forceinline__ void dsa_prefetch_row_l2(const void* row) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], 656;" :: "l"(row) : "memory");
}
"""


def lane_slot(g: Any) -> Any:
    """Chunk position of the index lane ``g % 32`` of gather warp ``g // 32`` holds (passes shuffle it out)."""
    return ((g % 32) % 16) * WARPS + g // 32


def fp8_prefetch_macro(n_kv: Any) -> Any:
    """The macro ``prefetch_rows(KV8, row, g)``: lanes 0..15 of each gather warp ask the L2 for the whole
    656-byte row ``row`` (their chunk index, :func:`lane_slot`) with one ``cp.async.bulk.prefetch.L2``; nothing
    is written and no register waits for it. ``-1`` (or ``>= S``) asks for nothing. Needs :data:`PREFETCH_SRC`
    in the kernel's prelude."""
    import tilelang.language as T

    @T.macro
    def prefetch_rows(KV8, row, g):
        if (g % 32) < 16 and (row >= 0) and (row < n_kv):
            T.call_extern("handle", "dsa_prefetch_row_l2", T.address_of(KV8[row, 0]))

    return prefetch_rows


def fp8_gather_macro(n_kv: Any, in_flight: int = 1, given_index: bool = False, pipelined: bool = False,
                     out: str = "bfloat16", half_rows: bool = False) -> Any:
    """The gather macro ``fp8_gather(KV8, Idx, idx_sh, kv_lat, kv_rope, ready, tok, c0, st, g, given)``: ``KV8``
    the ``[S, 656]`` e4m3 cache, ``g`` the thread's index in the gather warpgroup (0..127), chunk ``c0 .. c0 +
    64`` of row ``tok`` into stage ``st``; ends with the warpgroup's arrival on ``ready[st]``.

    ``in_flight``: rows a warp loads per pass before converting them (6 registers a lane each): the loads of one
    row alone keep too few bytes in flight to cover the memory latency. ``pipelined``: two register buffers of
    ``in_flight`` rows; the loads of pass ``p + 1`` are issued before the conversions of pass ``p``, so a warp
    converts while its next rows are on the way. ``given_index``: ``given`` is the lane's index (``Idx[tok, c0 +
    lane_slot(g)]``, loaded a chunk ahead by the caller) instead of the macro loading it once the stage is free
    (otherwise ``given`` is unused). ``out``: the stage's dtype (``"float16"``: e4m3 -> fp16 and the scale
    multiplied in fp16; the rope converted from bf16). ``half_rows`` (``wsf8c``): only rows ``32 rank .. + 32``
    (``rank`` the macro's last argument) and no arrival on ``ready`` (the caller pushes the half to the peer CTA
    first: :mod:`.cluster_push`)."""
    import tilelang.language as T

    bf16, f16, f32, fp8 = "bfloat16", "float16", "float32", "float8_e4m3fn"
    half = out == f16
    r_n = in_flight
    passes = BI // WARPS // r_n
    assert (BI // WARPS) % r_n == 0 and (not pipelined or passes % 2 == 0)
    n_buf = 2 if pipelined else 1

    @T.macro
    def load_rows(KV8, KVS, KVR, lat8, sc, rope, mine, pp, b, lane):
        """Rows of pass ``pp`` into register buffer ``b`` (a Python int: the buffers stay in registers)."""
        row = T.alloc_var("int32")
        for i in T.unroll(r_n):
            row = T.shfl_sync(mine, pp * r_n + i)
            if (row >= 0) and (row < n_kv):
                for v in T.vectorized(16):
                    lat8[b * r_n + i, v] = KV8[row, lane * 16 + v]
                sc[b * r_n + i] = KVS[row, SCALE_AT + lane // 8]
                for v in T.vectorized(2):
                    rope[b * r_n + i, v] = KVR[row, ROPE_AT + lane * 2 + v]
            else:  # -1 (or past the cache): a zero row, nothing read
                for v in T.vectorized(16):
                    lat8[b * r_n + i, v] = T.cast(0, fp8)
                sc[b * r_n + i] = T.float32(0)
                for v in T.vectorized(2):
                    rope[b * r_n + i, v] = T.cast(0, bf16)

    @T.macro
    def store_rows(kv_lat, kv_rope, lat8, sc, rope, st, pp, b, lane, wid):
        """Buffer ``b`` (pass ``pp``'s rows) converted to bf16 into the stage."""
        for i in T.unroll(r_n):
            dst = (pp * r_n + i) * WARPS + wid
            if half:
                sc_h = T.cast(sc[b * r_n + i], f16)
                for h2 in T.unroll(2):
                    for v in T.vectorized(8):
                        kv_lat[st, dst, lane * 16 + h2 * 8 + v] = T.cast(lat8[b * r_n + i, h2 * 8 + v], f16) * sc_h
                for v in T.vectorized(2):
                    kv_rope[st, dst, lane * 2 + v] = T.cast(T.cast(rope[b * r_n + i, v], f32), f16)
            else:
                for h2 in T.unroll(2):
                    for v in T.vectorized(8):
                        kv_lat[st, dst, lane * 16 + h2 * 8 + v] = T.cast(
                            T.cast(lat8[b * r_n + i, h2 * 8 + v], f32) * sc[b * r_n + i], bf16)
                for v in T.vectorized(2):
                    kv_rope[st, dst, lane * 2 + v] = rope[b * r_n + i, v]

    @T.macro
    def fp8_gather(KV8, Idx, idx_sh, kv_lat, kv_rope, ready, tok, c0, st, g, given, rank):
        # The scales and the rope through views of the same buffer: one base pointer and row offset for all.
        KVS = T.view(KV8, (n_kv, ROW_BYTES // 4), f32)
        KVR = T.view(KV8, (n_kv, ROW_BYTES // 2), bf16)
        lat8 = T.alloc_local((n_buf * r_n, 16), fp8)
        sc = T.alloc_local((n_buf * r_n,), f32)
        rope = T.alloc_local((n_buf * r_n, 2), bf16)
        lane, wid = g % 32, g // 32
        if g < BI:
            idx_sh[st, g] = Idx[tok, c0 + g]
        mine = given if given_index else Idx[tok, c0 + lane_slot(g)]
        if pipelined:
            load_rows(KV8, KVS, KVR, lat8, sc, rope, mine, 0, 0, lane)
            for q in T.serial(passes // 2):
                for b in T.unroll(2):
                    if q * 2 + b + 1 < passes:
                        load_rows(KV8, KVS, KVR, lat8, sc, rope, mine, q * 2 + b + 1, 1 - b, lane)
                    store_rows(kv_lat, kv_rope, lat8, sc, rope, st, q * 2 + b, b, lane, wid)
        elif half_rows:
            for pp in T.serial(passes // 2):
                load_rows(KV8, KVS, KVR, lat8, sc, rope, mine, rank * (passes // 2) + pp, 0, lane)
                store_rows(kv_lat, kv_rope, lat8, sc, rope, st, rank * (passes // 2) + pp, 0, lane, wid)
        else:
            for pp in T.serial(passes):
                load_rows(KV8, KVS, KVR, lat8, sc, rope, mine, pp, 0, lane)
                store_rows(kv_lat, kv_rope, lat8, sc, rope, st, pp, 0, lane, wid)
        T.fence_proxy_async()  # generic-proxy stores of the stage, read next by wgmma / bulk copies (async proxy)
        if not half_rows:
            T.barrier_arrive(ready[st])

    return fp8_gather
