"""Q of the fp16 schedules (``wsf8c``) into shared memory: every load issued first, then a short conversion.

The fp16 schedules multiply fp16 operands, so a block's bf16 Q (``[64, 576]``, 72 KB) is converted on its way into
shared memory. TileLang's own ``T.copy`` of bf16 into an fp16 buffer converts each value through ``cutlass::half_t``
into a ``__half`` (f32 -> f16 -> f32 -> f16: five instructions a pair in the SASS), and ptxas interleaved those
conversions with the 36 loads of a thread, about eleven loads in flight at a time: three or four memory latencies
in a row before the first S GEMM could start. Here each thread loads all of its 16-byte pieces into registers
first, then converts each pair in three instructions (two shifts to fp32, one ``cvt.rn.f16x2.f32``) and stores 16
bytes at a time (:data:`Q_F16_SRC`); the rounding is the same (bf16 -> fp32 is exact).
"""

# No ``from __future__ import annotations``: TileLang evaluates the macro's annotations.
from typing import Any

from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import D_LATENT

ROPE_PIECES = 8  # 16-byte pieces of a head's 64 rope values

Q_F16_SRC = r"""
// (inline PTX: the prelude precedes the CUDA headers.) cvt.rn.f16x2.f32 puts its first source in the upper half.
__device__ __forceinline__ unsigned dsa_bf16x2_to_f16x2(unsigned w) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(__uint_as_float(w & 0xffff0000u)), "f"(__uint_as_float(w << 16)));
  return r;
}

// Eight bf16 values (registers) -> eight fp16 values (also the wsf8c gather's rope: .gather_fp8.GATHER_SRC).
__device__ __forceinline__ uint4 dsa_bf16x8_to_f16x8(const void* src) {
  const unsigned* s = static_cast<const unsigned*>(src);
  return make_uint4(dsa_bf16x2_to_f16x2(s[0]), dsa_bf16x2_to_f16x2(s[1]), dsa_bf16x2_to_f16x2(s[2]),
                    dsa_bf16x2_to_f16x2(s[3]));
}

// ... into shared memory, one 16-byte store.
__device__ __forceinline__ void dsa_store_f16x8(void* dst, const void* src) {
  *static_cast<uint4*>(dst) = dsa_bf16x8_to_f16x8(src);
}
"""


def q_f16_macro(hb: int, n_threads: int, lat_lo: int, lat_hi: int, rope: bool) -> Any:
    """The macro ``load(Q, q_lat, q_rope, q_row, h0, t)``: thread ``t`` of ``n_threads`` loads its share of Q row
    ``q_row``, heads ``h0 .. h0 + hb``, latent columns ``lat_lo .. lat_hi`` (and the 64 rope columns when
    ``rope``), into ``q_lat`` ``[hb, 512]`` / ``q_rope`` ``[hb, 64]`` fp16. Piece ``p`` (16 bytes) of the range is
    ``i * n_threads + t``: consecutive threads read consecutive pieces of a head row (coalesced). No barrier: the
    caller syncs its readers (and fences for wgmma)."""
    import tilelang.language as T

    bf16 = "bfloat16"
    per_head = (lat_hi - lat_lo) // 8
    n_lat = hb * per_head // n_threads
    n_rope = hb * ROPE_PIECES // n_threads if rope else 0
    assert hb * per_head % n_threads == 0 and (not rope or hb * ROPE_PIECES % n_threads == 0)

    @T.macro
    def load(Q, q_lat, q_rope, q_row, h0, t):
        regs = T.alloc_local((n_lat + n_rope, 8), bf16)
        for i in T.unroll(n_lat):
            for v in T.vectorized(8):
                regs[i, v] = Q[q_row, h0 + (i * n_threads + t) // per_head,
                               lat_lo + ((i * n_threads + t) % per_head) * 8 + v]
        for i in T.unroll(n_rope):
            for v in T.vectorized(8):
                regs[n_lat + i, v] = Q[q_row, h0 + (i * n_threads + t) // ROPE_PIECES,
                                       D_LATENT + ((i * n_threads + t) % ROPE_PIECES) * 8 + v]
        for i in T.unroll(n_lat):
            T.call_extern("handle", "dsa_store_f16x8",
                          T.access_ptr(q_lat[(i * n_threads + t) // per_head,
                                             lat_lo + ((i * n_threads + t) % per_head) * 8], "w", 8),
                          T.access_ptr(regs[i, 0], "r", 8))
        for i in T.unroll(n_rope):
            T.call_extern("handle", "dsa_store_f16x8",
                          T.access_ptr(q_rope[(i * n_threads + t) // ROPE_PIECES,
                                              ((i * n_threads + t) % ROPE_PIECES) * 8], "w", 8),
                          T.access_ptr(regs[n_lat + i, 0], "r", 8))

    return load
