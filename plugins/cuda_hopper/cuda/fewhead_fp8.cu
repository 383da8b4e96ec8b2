// Sparse MLA decode over an fp8_656 cache, 16 heads or fewer per CTA (V3.2 under TP 8 / 16; TP 4's 32 heads as two
// groups of 16), sm_89 and later. Compiled at run time by NVRTC (fewhead_fp8.py); no headers. Every shape below is
// fixed by the layout: a row is 656 bytes: 512 e4m3 latent values, four fp32 scales (one per 128 columns), 64 bf16
// rope values.
//
// One CTA = one query (blockIdx.y) x one group of ``heads`` of its heads x one slice of its selected rows (blockIdx.x
// = slice x head_groups + group: a query's head groups run side by side, so a row that one group brings from DRAM
// is in the L2 for the others). Its outputs are those of query x head_groups + group, as if each head group were a
// query of its own. Four warps, warp w owning latent columns [128 w, 128 w + 128) and rope columns [16 w, 16 w + 16):
//   * the CTA copies whole rows, 32 a chunk, into a shared ring STAGES deep (cp.async, consecutive 16-byte pieces
//     across the CTA, zero-filled for a slot -1); STAGES - 1 chunks are in flight while one is multiplied;
//   * scores: mma.sync m16n8k16 with the 16 heads as M and rows as N; the e4m3 values are converted to fp16
//     exactly (cvt.rn.f16x2.e4m3x2) in registers, q runs in fp16 (each head's block divided by a power of two
//     when it would leave fp16's range); each warp's partial is multiplied by its column block's row scales,
//     the rope product (bf16 MMA) is accumulated on top, and the four partials meet through shared memory;
//   * values: the transposed product O^T[128 cols x heads] += V^T P'^T with the warp's columns as M, rows as K
//     and heads as N, so the score registers are the B operand as they stand (P' = P * row scale / running
//     largest scale, fp16 in [0, 1]); V^T's fragments come from 16-byte shared loads of four rows and one byte
//     permute per register: every stored byte is converted twice (once per product) and never written back.
// Slices write a normalised partial (fp16 scaled per column block, or fp32: PARTIAL_F16) and its base-2
// log-sum-exp, or, with one slice, the bf16 output and the natural-log lse (+inf for a query without a valid slot);
// the host merges the partials with a second launch, which may be scheduled (programmatic dependent launch) as soon
// as every CTA of this one has started.
//
// The host sizes shared memory (STAGES x CHUNK x PITCH + XCHG_BYTES) from the values defined here (fewhead_fp8.py
// reads them).

#define ROW_BYTES 656
#define SCALE_OFFSET 512
#define ROPE_OFFSET 528
#define BIAS_OFFSET 656              // in the ring: the row's score bias (0 or -inf) after its 656 bytes
#define PIECES 41                    // 16-byte pieces per row
#define CHUNK 32                     // rows per step
#define PITCH 688                    // ring bytes per row; 688 % 128 = 48 keeps the fragment loads' banks apart
#define CTA_STAGE (CHUNK * PITCH)
#define XCHG_BYTES (4 * 4 * 32 * 16)  // 4 warps x 4 row tiles x 32 lanes x float4
#ifndef STAGES
#define STAGES 2
#endif
static_assert(STAGES >= 2, "the chunk in use and one in flight");
#ifndef RESCALE_SLACK
#define RESCALE_SLACK 8.0f
#endif
#ifndef REF_SLACK
#define REF_SLACK 16.0f
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 2
#endif
// L2_PREFETCH (0, 64, 128 or 256): the prefetch size the row copies ask the L2 for (cp.async's .L2::<n>B).
#ifndef L2_PREFETCH
#define L2_PREFETCH 0
#endif
// PARTIAL_F16 1: a slice's partial is written in fp16, each 128-column block divided by the warp's reference row
// scale (``pscale``, one fp32 per slice and block; the merge multiplies it back), so every stored value is at most
// 448 x REF_SLACK in magnitude: half the bytes of fp32 for this launch to write and the merge to read, and 11
// significant bits (bf16's 8 doubled the worst error against the reference). 0: fp32 partials, pscale unwritten.
#ifndef PARTIAL_F16
#define PARTIAL_F16 1
#endif
#if L2_PREFETCH == 256
#define CP_ASYNC_CG "cp.async.cg.shared.global.L2::256B"
#elif L2_PREFETCH == 128
#define CP_ASYNC_CG "cp.async.cg.shared.global.L2::128B"
#elif L2_PREFETCH == 64
#define CP_ASYNC_CG "cp.async.cg.shared.global.L2::64B"
#elif L2_PREFETCH == 0
#define CP_ASYNC_CG "cp.async.cg.shared.global"
#else
#error "L2_PREFETCH must be 0, 64, 128 or 256"
#endif
#define Q_FP16_MAX 16384.0f
#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
    asm volatile(CP_ASYNC_CG " [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Two e4m3 pairs (the low and high halves of ``w``) as two fp16x2 registers; exact.
__device__ __forceinline__ void e4m3x4_to_f16(unsigned w, unsigned& lo, unsigned& hi) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi) : "r"(w));
}

__device__ __forceinline__ unsigned pack_f16(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ void mma_f16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint4 lds128(unsigned addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

__device__ __forceinline__ uint2 lds64(unsigned addr) {
    uint2 v;
    asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
    return v;
}

__device__ __forceinline__ float lds32f(unsigned addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr));
    return v;
}

__device__ __forceinline__ unsigned word(const uint4& v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Copy the chunk's whole rows (``slot``: lane r's row r's slot, -1 = none; every warp holds the same 32) into
// ``stage`` and write the rows' score biases (0 or -inf). The CTA's 128 threads take consecutive 16-byte pieces, so
// a warp's request covers 512 contiguous bytes of one or two rows: whole rows ask the L2 for about half as many
// requests as each warp copying its own columns (9 requests per row and warp, and 4-byte scale reads).
__device__ __forceinline__ void issue_chunk(const unsigned char* kv, int slot, int w, int lane, unsigned char* stage) {
    const unsigned d = smem_addr(stage);
#pragma unroll
    for (int i = 0; i < (CHUNK * PIECES + 127) / 128; ++i) {
        const int p = threadIdx.x + 128 * i;
        const int r = p / PIECES;
        const int piece = p - r * PIECES;
        const int sl = __shfl_sync(0xffffffffu, slot, r & 31);
        if (p < CHUNK * PIECES)
            cp_async16(d + r * PITCH + 16 * piece, kv + (long long)(sl >= 0 ? sl : 0) * ROW_BYTES + 16 * piece,
                       sl >= 0 ? 16 : 0);
    }
    if (w == 0) *reinterpret_cast<float*>(stage + lane * PITCH + BIAS_OFFSET) = slot >= 0 ? 0.0f : NEG_INF;
}

extern "C" __global__ void __launch_bounds__(128, MIN_BLOCKS)
fewhead_fp8_decode(const unsigned short* __restrict__ q, const unsigned char* __restrict__ kv,
                   const int* __restrict__ idx, float* __restrict__ part, float* __restrict__ plse,
                   float* __restrict__ pscale,
                   unsigned short* __restrict__ out, float* __restrict__ lse, int heads, int top_k,
                   int rows_per_split, int splits, float qk_scale_log2, long long stride_qm, long long stride_qh,
                   long long stride_im, int head_groups) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int w = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const int g = lane >> 2;
    const int t = lane & 3;
    const long long m = blockIdx.y;             // the query: its q row and selected slots
    const int hg = blockIdx.x % head_groups;    // its group of ``heads`` heads
    const int sp = blockIdx.x / head_groups;    // the slice of its rows
    const long long mo = m * head_groups + hg;  // the output row of (query, head group)
    const int lo = sp * rows_per_split;
    const int hi = min(lo + rows_per_split, top_k);
    const int chunks = hi > lo ? (hi - lo + CHUNK - 1) / CHUNK : 0;
    unsigned char* ring = smem;  // + stage * CTA_STAGE
    float4* xchg = reinterpret_cast<float4*>(smem + STAGES * CTA_STAGE);
    const int* idx_row = idx + m * stride_im;
#if __CUDA_ARCH__ >= 900
    // The merge launch (launched as a programmatic dependent, waiting for this grid's completion before it reads
    // anything) may be scheduled once every CTA of this grid has started. Launched as a programmatic dependent
    // itself (``pdl_main``), this grid waits here, before its first read or write, for the kernels before it to
    // complete; launched plainly, the wait returns at once.
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif

    // Start the first STAGES - 1 chunks' copies before anything else.
    int pending = lo + lane < hi ? idx_row[lo + lane] : -1;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < chunks) issue_chunk(kv, pending, w, lane, ring + s * CTA_STAGE);
        cp_async_commit();
        const int r = lo + (s + 1) * CHUNK + lane;
        pending = r < hi ? idx_row[r] : -1;
    }

    // q fragments of heads g and g + 8: the warp's 128 latent columns in fp16 (k-step s = 4 hh + i holds
    // columns 64 hh + 16 t + 4 i + {0, 1} as k = 2t, 2t+1 and + {2, 3} as k = 2t+8, 2t+9) and its 16 rope columns
    // in bf16 (4 t + {0, 1}, 4 t + {2, 3}). Heads past ``heads`` are zero.
    unsigned qa[8][4];
    unsigned qpe[4];
    float q_up[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        const int h = g + 8 * e;
        uint4 raw[2][2];
        uint2 pe = make_uint2(0, 0);
        float top = 0.0f;
        if (h < heads) {
            const unsigned short* q_head = q + m * stride_qm + (hg * heads + h) * stride_qh;
            const uint4* src = reinterpret_cast<const uint4*>(q_head + 128 * w + 16 * t);
            raw[0][0] = src[0];
            raw[0][1] = src[1];
            raw[1][0] = src[8];   // + 64 columns
            raw[1][1] = src[9];
            pe = *reinterpret_cast<const uint2*>(q_head + 512 + 16 * w + 4 * t);
        } else {
            raw[0][0] = raw[0][1] = raw[1][0] = raw[1][1] = make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int k = 0; k < 2; ++k)
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const unsigned v = word(raw[hh][k], i);
                    top = fmaxf(top, fmaxf(fabsf(bf16_lo(v)), fabsf(bf16_hi(v))));
                }
        top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
        top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
        const float up = exp2f(fmaxf(ceilf(log2f(fmaxf(top, 1.0f) / Q_FP16_MAX)), 0.0f));
        const float down = 1.0f / up;
        q_up[e] = up;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                // 4 columns 64 hh + 16 t + 4 i + {0..3}: word pair (2 bf16 each) at raw[hh][i / 2], words
                // 2 (i % 2) + {0, 1}
                const unsigned v0 = word(raw[hh][i >> 1], 2 * (i & 1));
                const unsigned v1 = word(raw[hh][i >> 1], 2 * (i & 1) + 1);
                qa[4 * hh + i][e] = pack_f16(bf16_lo(v0) * down, bf16_hi(v0) * down);
                qa[4 * hh + i][2 + e] = pack_f16(bf16_lo(v1) * down, bf16_hi(v1) * down);
            }
        qpe[e] = pe.x;
        qpe[2 + e] = pe.y;
    }

    float acc[8][2][4];
#pragma unroll
    for (int a = 0; a < 8; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;
    float m_run[2] = {NEG_INF, NEG_INF};  // heads g, g + 8 (base 2, scaled)
    float l_run[2] = {0.0f, 0.0f};        // this thread's rows only; summed over t at the end
    float ref = 0.0f;                     // reference row scale of this warp's columns (see the loop)
    float inv_ref = 0.0f;

    // One chunk's steps. scores: this warp's partial scores of the chunk in ``base`` (its columns only);
    // publish: hand them to the other warps; softmax: sum the four partials (after the barrier), update the
    // running max / sum, rescale the accumulators and turn the chunk's probabilities into ``pb``; values: add
    // the chunk's P V to the accumulators.
    auto scores = [&](unsigned base, float (&s)[4][4], float (&sc)[4][2], float (&bias)[4][2]) {
        // Scores of this warp's columns: 4 row tiles of 8.
#pragma unroll
        for (int j = 0; j < 4; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
            const unsigned row = base + (8 * j + g) * PITCH;
            const uint4 x0 = lds128(row + 128 * w + 16 * t);
            const uint4 x1 = lds128(row + 128 * w + 64 + 16 * t);
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                unsigned b0, b1;
                e4m3x4_to_f16(word(i < 4 ? x0 : x1, i & 3), b0, b1);
                mma_f16(s[j], qa[i], b0, b1);
            }
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const unsigned r = base + (8 * j + 2 * t + e) * PITCH;
                sc[j][e] = lds32f(r + SCALE_OFFSET + 4 * w);
                bias[j][e] = lds32f(r + BIAS_OFFSET);
            }
            s[j][0] *= q_up[0] * sc[j][0];
            s[j][1] *= q_up[0] * sc[j][1];
            s[j][2] *= q_up[1] * sc[j][0];
            s[j][3] *= q_up[1] * sc[j][1];
            const uint2 pe = lds64(row + ROPE_OFFSET + 32 * w + 8 * t);
            mma_bf16(s[j], qpe, pe.x, pe.y);
        }
    };
    auto publish = [&](const float (&s)[4][4]) {
        // The four warps' partials meet in shared memory.
#pragma unroll
        for (int j = 0; j < 4; ++j) xchg[(w * 4 + j) * 32 + lane] = make_float4(s[j][0], s[j][1], s[j][2], s[j][3]);
    };
    auto softmax = [&](float (&s)[4][4], const float (&sc)[4][2], const float (&bias)[4][2], unsigned (&pb)[4][2]) {
        __syncthreads();
#pragma unroll
        for (int o = 1; o < 4; ++o) {
            const int ow = (w + o) & 3;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float4 v = xchg[(ow * 4 + j) * 32 + lane];
                s[j][0] += v.x;
                s[j][1] += v.y;
                s[j][2] += v.z;
                s[j][3] += v.w;
            }
        }
        // Online softmax (base 2) for heads g, g + 8 over this thread's 8 rows, then across the t quad.
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            s[j][0] = fmaf(s[j][0], qk_scale_log2, bias[j][0]);
            s[j][1] = fmaf(s[j][1], qk_scale_log2, bias[j][1]);
            s[j][2] = fmaf(s[j][2], qk_scale_log2, bias[j][0]);
            s[j][3] = fmaf(s[j][3], qk_scale_log2, bias[j][1]);
            mx[0] = fmaxf(mx[0], fmaxf(s[j][0], s[j][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[j][2], s[j][3]));
        }
        // The running max moves only when some head of this warp outgrows it by more than RESCALE_SLACK (base 2):
        // probabilities then stay below 2^RESCALE_SLACK and most chunks skip rescaling the accumulators.
        float alpha[2] = {1.0f, 1.0f};
        float m_use[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 1));
            mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], 2));
        }
        const bool grow = __any_sync(0xffffffffu, mx[0] > m_run[0] + RESCALE_SLACK || mx[1] > m_run[1] + RESCALE_SLACK);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const float m_new = grow ? fmaxf(m_run[e], mx[e]) : m_run[e];
            m_use[e] = m_new == NEG_INF ? 0.0f : m_new;
            if (grow) alpha[e] = fast_exp2(m_run[e] - m_use[e]);  // 0 while nothing was seen (-inf - x)
            m_run[e] = m_new;
        }
        // The values' probabilities are taken relative to a reference row scale (fp16): the largest seen, moved
        // only when a row's scale passes it by more than REF_SLACK times.
        float ref_ratio = 1.0f;
        float row_top = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) row_top = fmaxf(row_top, fmaxf(sc[j][0], sc[j][1]));
        if (__any_sync(0xffffffffu, row_top > ref * REF_SLACK)) {
            float top = row_top;
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 1));
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 2));
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 4));
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 8));
            top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 16));
            ref_ratio = ref / top;
            ref = top;
            inv_ref = 1.0f / top;
        }
        l_run[0] *= alpha[0];
        l_run[1] *= alpha[1];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float p0 = fast_exp2(s[j][0] - m_use[0]);
            const float p1 = fast_exp2(s[j][1] - m_use[0]);
            const float p2 = fast_exp2(s[j][2] - m_use[1]);
            const float p3 = fast_exp2(s[j][3] - m_use[1]);
            l_run[0] += p0 + p1;
            l_run[1] += p2 + p3;
            const float r0 = sc[j][0] * inv_ref;
            const float r1 = sc[j][1] * inv_ref;
            pb[j][0] = pack_f16(p0 * r0, p1 * r1);
            pb[j][1] = pack_f16(p2 * r0, p3 * r1);
        }
        if (grow || ref_ratio != 1.0f) {  // warp-uniform
            // alpha of the heads this thread's value accumulators hold: 2t, 2t+1 (head tile 0), 8+2t, 9+2t (tile 1).
            const float a00 = __shfl_sync(0xffffffffu, alpha[0], 8 * t) * ref_ratio;
            const float a01 = __shfl_sync(0xffffffffu, alpha[0], 8 * t + 4) * ref_ratio;
            const float a10 = __shfl_sync(0xffffffffu, alpha[1], 8 * t) * ref_ratio;
            const float a11 = __shfl_sync(0xffffffffu, alpha[1], 8 * t + 4) * ref_ratio;
#pragma unroll
        for (int a = 0; a < 8; ++a) {
            acc[a][0][0] *= a00;
            acc[a][0][1] *= a01;
            acc[a][0][2] *= a00;
            acc[a][0][3] *= a01;
            acc[a][1][0] *= a10;
            acc[a][1][1] *= a11;
            acc[a][1][2] *= a10;
            acc[a][1][3] *= a11;
        }
        }
    };
    auto values = [&](unsigned base, const unsigned (&pb)[4][2]) {
        // Values: two k-steps of 16 rows; rows 16 ks + 2t, +1 (k = 2t, 2t+1) and 16 ks + 8 + 2t, +1 (k = 2t+8, 2t+9);
        // this thread's 16 columns 16 g .. 16 g + 15: column 16 g + 4 i + {0, 1} in M tile 2 i (m = g, g + 8),
        // + {2, 3} in M tile 2 i + 1.
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            const unsigned r0 = base + (16 * ks + 2 * t) * PITCH + 128 * w + 16 * g;
            const uint4 v0 = lds128(r0);
            const uint4 v1 = lds128(r0 + PITCH);
            const uint4 v2 = lds128(r0 + 8 * PITCH);
            const uint4 v3 = lds128(r0 + 9 * PITCH);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const unsigned ab_lo = __byte_perm(word(v0, i), word(v1, i), 0x5140);
                const unsigned ab_hi = __byte_perm(word(v0, i), word(v1, i), 0x7362);
                const unsigned cd_lo = __byte_perm(word(v2, i), word(v3, i), 0x5140);
                const unsigned cd_hi = __byte_perm(word(v2, i), word(v3, i), 0x7362);
                unsigned a_even[4];
                unsigned a_odd[4];
                e4m3x4_to_f16(ab_lo, a_even[0], a_even[1]);
                e4m3x4_to_f16(cd_lo, a_even[2], a_even[3]);
                e4m3x4_to_f16(ab_hi, a_odd[0], a_odd[1]);
                e4m3x4_to_f16(cd_hi, a_odd[2], a_odd[3]);
#pragma unroll
                for (int nt = 0; nt < 2; ++nt) {
                    mma_f16(acc[2 * i][nt], a_even, pb[2 * ks][nt], pb[2 * ks + 1][nt]);
                    mma_f16(acc[2 * i + 1][nt], a_odd, pb[2 * ks][nt], pb[2 * ks + 1][nt]);
                }
            }
        }
    };
    auto stage = [&](int c) { return smem_addr(ring + (c % STAGES) * CTA_STAGE); };

    // Two barriers a chunk: the first hands chunk c to every warp (each thread has waited for its own copies) and
    // frees chunk c - 1's stage for chunk c + STAGES - 1, so STAGES - 1 chunks are in flight while one is
    // multiplied; the second (softmax's) publishes the score exchange, which the next first barrier frees again.
    for (int c = 0; c < chunks; ++c) {
        cp_async_wait<STAGES - 2>();  // this thread's copies of chunk c
        __syncthreads();
        const int nc = c + STAGES - 1;
        if (nc < chunks) issue_chunk(kv, pending, w, lane, ring + (nc % STAGES) * CTA_STAGE);
        cp_async_commit();
        {
            const int r = lo + (nc + 1) * CHUNK + lane;
            pending = r < hi ? idx_row[r] : -1;
        }
        float s[4][4], sc[4][2], bias[4][2];
        unsigned pb[4][2];  // [row tile][head tile]: fp16x2 probabilities x scale / ref of rows 2t, 2t+1
        scores(stage(c), s, sc, bias);
        publish(s);
        softmax(s, sc, bias, pb);  // (its barrier)
        values(stage(c), pb);
    }
    cp_async_wait<0>();

    // Epilogue: l over the quad, then each thread's 4 heads (2t, 2t+1, 8+2t, 9+2t) x 16 columns.
    float lse2[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
        l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 1);
        l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], 2);
        lse2[e] = l_run[e] > 0.0f ? m_run[e] + log2f(l_run[e]) : NEG_INF;
    }
    const float norm0 = l_run[0] > 0.0f ? ref / l_run[0] : 0.0f;
    const float norm1 = l_run[1] > 0.0f ? ref / l_run[1] : 0.0f;
    const float nh[2][2] = {{__shfl_sync(0xffffffffu, norm0, 8 * t), __shfl_sync(0xffffffffu, norm0, 8 * t + 4)},
                            {__shfl_sync(0xffffffffu, norm1, 8 * t), __shfl_sync(0xffffffffu, norm1, 8 * t + 4)}};
    const int col = 128 * w + 16 * g;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int ee = 0; ee < 2; ++ee) {
            const int h = 8 * nt + 2 * t + ee;
            if (h >= heads) continue;
            const float f = nh[nt][ee];
            float v[16];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                v[4 * i + 0] = acc[2 * i][nt][ee] * f;
                v[4 * i + 1] = acc[2 * i][nt][2 + ee] * f;
                v[4 * i + 2] = acc[2 * i + 1][nt][ee] * f;
                v[4 * i + 3] = acc[2 * i + 1][nt][2 + ee] * f;
            }
            if (splits > 1) {
#if PARTIAL_F16
                unsigned b[8];
#pragma unroll
                for (int i = 0; i < 8; ++i) b[i] = pack_f16(v[2 * i] * inv_ref, v[2 * i + 1] * inv_ref);
                uint4* dst = reinterpret_cast<uint4*>(reinterpret_cast<unsigned short*>(part) +
                                                      ((mo * splits + sp) * heads + h) * 512 + col);
                dst[0] = make_uint4(b[0], b[1], b[2], b[3]);
                dst[1] = make_uint4(b[4], b[5], b[6], b[7]);
#else
                float4* dst = reinterpret_cast<float4*>(part + ((mo * splits + sp) * heads + h) * 512 + col);
#pragma unroll
                for (int i = 0; i < 4; ++i) dst[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
#endif
            } else {
                unsigned b[8];
#pragma unroll
                for (int i = 0; i < 8; ++i)
                    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(b[i]) : "f"(v[2 * i + 1]), "f"(v[2 * i]));
                uint4* dst = reinterpret_cast<uint4*>(out + (mo * heads + h) * 512 + col);
                dst[0] = make_uint4(b[0], b[1], b[2], b[3]);
                dst[1] = make_uint4(b[4], b[5], b[6], b[7]);
            }
        }
    if (w == 0 && t == 0) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int h = g + 8 * e;
            if (h >= heads) continue;
            if (splits > 1)
                plse[(mo * splits + sp) * heads + h] = lse2[e];
            else
                lse[mo * heads + h] = lse2[e] == NEG_INF ? __int_as_float(0x7f800000) : lse2[e] * 0.6931471805599453f;
        }
    }
#if PARTIAL_F16
    if (splits > 1 && lane == 0) pscale[(mo * splits + sp) * 4 + w] = ref;  // the scale of this warp's column block
#endif
}
