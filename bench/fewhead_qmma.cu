// Probe (bench/fewhead_qmma.py): few-head fp8_656 sparse MLA decode on Hopper's FP8 tensor path (wgmma with e4m3
// operands), the cached e4m3 bytes multiplied as they are stored: no cached value is ever converted. Not a backend
// kernel: checked against the reference by the bench and timed beside the production kernel
// (plugins/cuda_hopper/cuda/fewhead_fp8.cu, which converts every byte twice to fp16 for mma.sync).
//
// One CTA = one query x one group of <= 16 heads x one slice of its rows; 128 threads (one warpgroup); chunks of 64
// whole rows copied (cp.async, as the production kernel) into a 2-stage ring of 656-byte rows; two CTAs per SM.
//   * scores S[64 rows x 16 heads] = K q^T: wgmma m64n16k32 e4m3 with A = the rows from registers (ldmatrix:
//     warp w holds rows 16 w .. 16 w + 15, the bytes as they stand) and B = q in shared memory, split into two
//     e4m3 terms (hi + lo: exact for bf16 q but for values over ~2^10 below their head's largest; each head scaled
//     by a power of two so its largest value is in (224, 448]); rope by wgmma m64n16k16 bf16, A from registers. FP8 wgmma keeps only about 14 bits of its running sum, so the lo
//     products get accumulators of their own and every SCORE_STEPS k-steps a fresh one, summed in fp32 with the
//     row scales (the defaults are the only build that passes the reference: docs/hopper.md).
//   * values O^T[512 columns x 16 heads] += V^T P'^T: wgmma m64n16k32 e4m3 with A = V^T from registers: ldmatrix
//     .trans of byte pairs and one byte permute per register, so a register holds 4 rows of one column. The rows
//     take the order k = 2 g + ri within each 16-row group (row g -> k 2 g, row g + 8 -> k 2 g + 1) and the
//     columns of a warp's 16 the order m = g -> column 2 g, m = g + 8 -> column 2 g + 1; B = P'_b (P x row scale_b
//     / ref_b x P_SCALE, one per 128-column block b) split into hi + lo e4m3 in that row order, so a thread stores
//     its two rows of a head as one 16-bit word.
//   * softmax: the running max moves only when a score passes it by more than RESCALE_SLACK (base 2) or a row
//     scale passes its block's reference by more than REF_SLACK; every warp checks its own rows and raises a flag,
//     and only a chunk that raised it pays the cross-warp maxima, the rescale and a second P' pass.
// Partials as the production kernel: fp16, each 128-column block divided by its reference scale (written beside),
// merged by a second launch; one slice writes the bf16 output and the natural-log lse.

#define ROW_BYTES 656
#define SCALE_OFFSET 512
#define ROPE_OFFSET 528
#define PIECES 41
#define CHUNK 64
#define PITCH 656  // 656 % 128 = 16: ldmatrix's eight row addresses fall in eight different 16-byte bank groups
#define STAGE_BYTES (CHUNK * PITCH)
#ifndef STAGES
#define STAGES 2
#endif
#ifndef RESCALE_SLACK
#define RESCALE_SLACK 1.0f
#endif
#ifndef REF_SLACK
#define REF_SLACK 2.0f
#endif
#ifndef P_SCALE
#define P_SCALE 64.0f  // P' x P_SCALE <= 2^RESCALE_SLACK x REF_SLACK x P_SCALE = 256 < 448 (e4m3's largest)
#endif
// k-steps (32 columns, hi + lo) per fresh FP8 accumulator of the scores (1, 2 or 4); 0: one accumulator per
// 128-column block, every score wgmma issued at once
#ifndef SCORE_STEPS
#define SCORE_STEPS 1
#endif
// 1: the scores' lo products in accumulators of their own (in one with the hi products they are about 2^-4 of
// its sum, and the FP8 accumulation's ~14 bits truncate them)
#ifndef LO_ACC
#define LO_ACC 1
#endif
// q's lo term is stored times LO_UP (with LO_ACC; |x - hi| <= 2^-4 |x| <= 28, so x 16 stays within 448), further
// from e4m3's subnormals
#if LO_ACC && SCORE_STEPS != 0 && !defined(LO_UP)
#define LO_UP 16.0f
#elif !defined(LO_UP)
#define LO_UP 1.0f
#endif
#ifndef L2_PREFETCH
#define L2_PREFETCH 128
#endif
// shared memory, from a 1024-byte aligned base: q hi / lo (e4m3, 4 panels [16 heads][128 B], 128B swizzle),
// q rope (bf16 [16][128 B]), P' (4 blocks x [16 heads][128 B]: bytes 0-63 hi, 64-127 lo), the ring, row biases,
// the cross-warp exchange and two flags
#define QH_OFF 0
#define QL_OFF 8192
#define QR_OFF 16384
#define PB_OFF 18432
#define RING_OFF 26624
#define BIAS_OFF (RING_OFF + STAGES * STAGE_BYTES)
#define XCHG_OFF (BIAS_OFF + STAGES * CHUNK * 4)
#define FLAG_OFF (XCHG_OFF + 4 * 32 * 4)
#define SMEM_USED (FLAG_OFF + 16)
#if L2_PREFETCH == 128
#define CP_ASYNC_CG "cp.async.cg.shared.global.L2::128B"
#else
#define CP_ASYNC_CG "cp.async.cg.shared.global"
#endif
#define NEG_INF __int_as_float(0xff800000)
#define FULL 0xffffffffu

__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int bytes) {
    asm volatile(CP_ASYNC_CG " [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

__device__ __forceinline__ void ldsm4(unsigned addr, unsigned (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm4t(unsigned addr, unsigned (&r)[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void sts128(unsigned a, unsigned x, unsigned y, unsigned z, unsigned w) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(x), "r"(y), "r"(z), "r"(w));
}
__device__ __forceinline__ void sts16(unsigned a, unsigned short v) {
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(a), "h"(v));
}
__device__ __forceinline__ float4 lds128f(unsigned a) {
    float4 v;
    asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
    return v;
}
// Two fp32 as e4m3x2 (``lo`` in the low byte), rounded to nearest, saturating at 448.
__device__ __forceinline__ unsigned short e4m3x2(float lo, float hi) {
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}
// e4m3x2 back to two fp32 (exact).
__device__ __forceinline__ float2 e4m3x2_to_f32(unsigned short v) {
    float2 r;
    asm("{\n .reg .b16 l, h;\n .reg .b32 x;\n cvt.rn.f16x2.e4m3x2 x, %2;\n mov.b32 {l, h}, x;\n"
        " cvt.f32.f16 %0, l;\n cvt.f32.f16 %1, h;\n}\n" : "=f"(r.x), "=f"(r.y) : "h"(v));
    return r;
}
// x rounded to 4 significant bits (e4m3's precision; exact in e4m3 for x in [2^-6, 448]).
__device__ __forceinline__ float round4(float x) { return __uint_as_float((__float_as_uint(x) + 0x80000u) & 0xfff00000u); }

// Shared-memory matrix descriptor, 128-byte swizzle; an operand inside the atom adds its byte offset / 16.
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
__device__ __forceinline__ unsigned swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// wgmma with A from registers (four .b32 a thread) and B from shared memory; ``acc`` 0 overwrites d.
#define WGMMA_RS(NAME, SHAPE_AND_TYPES, TAIL)                                                                   \
    __device__ __forceinline__ void NAME(float* d, const unsigned (&a)[4], unsigned long long db, int acc) {    \
        asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %13, 0;\n wgmma.mma_async.sync.aligned." SHAPE_AND_TYPES \
                     " {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1" TAIL ";\n}\n"          \
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]) \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));                         \
    }
WGMMA_RS(wgmma_e4m3, "m64n16k32.f32.e4m3.e4m3", "")
WGMMA_RS(wgmma_bf16, "m64n16k16.f32.bf16.bf16", ", 0")  // ", 0": B not transposed (16-bit types only)

// Copy chunk rows (slot of row r: lane r & 31's ``pend0`` for r < 32, ``pend1`` after) into ``stage`` and write
// their score biases (0 or -inf). Consecutive 16-byte pieces across the CTA, as the production kernel.
__device__ __forceinline__ void issue_chunk(const unsigned char* kv, int pend0, int pend1, unsigned stage,
                                            float* bias_c, int w, int lane) {
#pragma unroll
    for (int i = 0; i < (CHUNK * PIECES + 127) / 128; ++i) {
        const int p = threadIdx.x + 128 * i;
        const int r = p / PIECES;
        const int piece = p - r * PIECES;
        int sl;
        if (128 * i + 127 < 32 * PIECES) {
            sl = __shfl_sync(FULL, pend0, r & 31);
        } else if (128 * i >= 32 * PIECES) {
            sl = __shfl_sync(FULL, pend1, r & 31);
        } else {
            const int a = __shfl_sync(FULL, pend0, r & 31), b = __shfl_sync(FULL, pend1, r & 31);
            sl = r < 32 ? a : b;
        }
        if (p < CHUNK * PIECES)
            cp_async16(stage + r * PITCH + 16 * piece, kv + (long long)(sl >= 0 ? sl : 0) * ROW_BYTES + 16 * piece,
                       sl >= 0 ? 16 : 0);
    }
    if (w == 0) {
        bias_c[lane] = pend0 >= 0 ? 0.0f : NEG_INF;
        bias_c[32 + lane] = pend1 >= 0 ? 0.0f : NEG_INF;
    }
}

extern "C" __global__ void __launch_bounds__(128, 2)
fewhead_qmma_decode(const unsigned short* __restrict__ q, const unsigned char* __restrict__ kv,
                    const int* __restrict__ idx, unsigned short* __restrict__ part, float* __restrict__ plse,
                    float* __restrict__ pscale, unsigned short* __restrict__ out, float* __restrict__ lse, int heads,
                    int top_k, int rows_per_split, int splits, float qk_scale_log2, long long stride_qm,
                    long long stride_qh, long long stride_im, int head_groups) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<size_t>(smem_raw) + 1023) & ~size_t(1023));
    const unsigned sbase = smem_addr(smem);
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const long long m = blockIdx.y;
    const int hg = blockIdx.x % head_groups;
    const int sp = blockIdx.x / head_groups;
    const long long mo = m * head_groups + hg;
    const int lo = sp * rows_per_split;
    const int hi = min(lo + rows_per_split, top_k);
    const int chunks = hi > lo ? (hi - lo + CHUNK - 1) / CHUNK : 0;
    const int* idx_row = idx + m * stride_im;
    float* bias_s = reinterpret_cast<float*>(smem + BIAS_OFF);
    float* xchg = reinterpret_cast<float*>(smem + XCHG_OFF);
    volatile int* flag = reinterpret_cast<volatile int*>(smem + FLAG_OFF);
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    // First chunk's copies before anything else.
    int pend0 = lo + lane < hi ? idx_row[lo + lane] : -1;
    int pend1 = lo + 32 + lane < hi ? idx_row[lo + 32 + lane] : -1;
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < chunks) issue_chunk(kv, pend0, pend1, sbase + RING_OFF + s * STAGE_BYTES, bias_s + s * CHUNK, w, lane);
        cp_async_commit();
        const int r = lo + (s + 1) * CHUNK + lane;
        pend0 = r < hi ? idx_row[r] : -1;
        pend1 = r + 32 < hi ? idx_row[r + 32] : -1;
    }

    // q: head h = tid / 8 takes latent columns [64 j, 64 j + 64) and rope columns [8 j, 8 j + 8) for j = tid % 8.
    // Latent: x = q x 2^k (k per head: the largest |x| in (224, 448]), hi = e4m3(x), lo = e4m3(x - hi).
    {
        const int h = tid >> 3, j = tid & 7;
        const bool live = h < heads;
        const unsigned short* q_head = q + m * stride_qm + (hg * heads + h) * stride_qh;
        uint4 raw[8];
        float top = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            raw[i] = live ? *reinterpret_cast<const uint4*>(q_head + 64 * j + 8 * i) : make_uint4(0, 0, 0, 0);
            const unsigned wv[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
#pragma unroll
            for (int e = 0; e < 4; ++e)
                top = fmaxf(top, fmaxf(fabsf(__uint_as_float(wv[e] << 16)), fabsf(__uint_as_float(wv[e] & 0xffff0000u))));
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) top = fmaxf(top, __shfl_xor_sync(FULL, top, o));
        int k = 0;
        if (top > 0.0f) {
            int ex;
            const float mant = frexpf(top, &ex);  // top = mant x 2^ex, mant in [0.5, 1); 448 = 0.875 x 2^9
            k = (mant <= 0.875f ? 9 : 8) - ex;
        }
        const float down = ldexpf(1.0f, k);
        if (j == 0) xchg[h] = ldexpf(1.0f, -k);
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
            // 16 columns 64 j + 8 i .. + 15: one 16-byte chunk of hi and of lo
            unsigned hw[4], lw[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const unsigned a = u < 2 ? (&raw[i].x)[2 * u] : (&raw[i + 1].x)[2 * (u - 2)];
                const unsigned b = u < 2 ? (&raw[i].x)[2 * u + 1] : (&raw[i + 1].x)[2 * (u - 2) + 1];
                const float x0 = __uint_as_float(a << 16) * down, x1 = __uint_as_float(a & 0xffff0000u) * down;
                const float x2 = __uint_as_float(b << 16) * down, x3 = __uint_as_float(b & 0xffff0000u) * down;
                const unsigned short h01 = e4m3x2(x0, x1), h23 = e4m3x2(x2, x3);
                const float2 f01 = e4m3x2_to_f32(h01), f23 = e4m3x2_to_f32(h23);
                const unsigned short l01 = e4m3x2((x0 - f01.x) * LO_UP, (x1 - f01.y) * LO_UP);
                const unsigned short l23 = e4m3x2((x2 - f23.x) * LO_UP, (x3 - f23.y) * LO_UP);
                hw[u] = (unsigned)h01 | ((unsigned)h23 << 16);
                lw[u] = (unsigned)l01 | ((unsigned)l23 << 16);
            }
            const int col = 64 * j + 8 * i;  // panel col / 128, byte (col % 128) in the head's row
            const unsigned off = (col >> 7) * 2048 + swz(h, (col & 127) >> 4);
            sts128(sbase + QH_OFF + off, hw[0], hw[1], hw[2], hw[3]);
            sts128(sbase + QL_OFF + off, lw[0], lw[1], lw[2], lw[3]);
        }
        const uint4 pe = live ? *reinterpret_cast<const uint4*>(q_head + 512 + 8 * j) : make_uint4(0, 0, 0, 0);
        sts128(sbase + QR_OFF + swz(h, j), pe.x, pe.y, pe.z, pe.w);
    }
    if (tid == 0) flag[0] = flag[1] = 0;
    fence_async_smem();
    __syncthreads();
    // this thread's heads in the accumulators: e = 0..3 -> 2t, 2t+1, 8+2t, 9+2t
    float q_up[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) q_up[e] = xchg[8 * (e >> 1) + 2 * t + (e & 1)];

    float acc[8][8];  // O^T: m tile mt, d[a]: column 64 mt + 16 w + 2 g + ((a >> 1) & 1), head e = 2 (a >> 2) + (a & 1)
#pragma unroll
    for (int a = 0; a < 8; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b) acc[a][b] = 0.0f;
    float m_run[4] = {NEG_INF, NEG_INF, NEG_INF, NEG_INF};
    float l_run[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float ref[4] = {0.0f, 0.0f, 0.0f, 0.0f};      // per 128-column block: the reference row scale
    float pmul[4] = {0.0f, 0.0f, 0.0f, 0.0f};     // P_SCALE / ref
    const unsigned long long d_qh = sw128_desc(sbase + QH_OFF), d_ql = sw128_desc(sbase + QL_OFF);
    const unsigned long long d_qr = sw128_desc(sbase + QR_OFF), d_pb = sw128_desc(sbase + PB_OFF);
    // ldmatrix lane addresses: scores (no trans) row 16 w + 8 ((lane >> 3) & 1) + (lane & 7), + 16 (lane >> 4) bytes;
    // values (trans) row 8 (lane >> 3) + (lane & 7) of each 32-row step, column 16 w of each 64-column tile
    const unsigned sc_lane = (16 * w + 8 * ((lane >> 3) & 1) + (lane & 7)) * PITCH + 16 * (lane >> 4);
    const unsigned va_lane = (lane) * PITCH + 16 * w;
    // P' stores: head h's row of block b, bytes 16 w + 2 g (hi) and 64 + 16 w + 2 g (lo), swizzled
    unsigned pb_addr[4], pl_addr[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const int h = 8 * (e >> 1) + 2 * t + (e & 1);
        pb_addr[e] = sbase + PB_OFF + swz(h, w) + 2 * g;
        pl_addr[e] = sbase + PB_OFF + swz(h, 4 + w) + 2 * g;
    }

    for (int c = 0; c < chunks; ++c) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // chunk c landed; chunk c - 1's stage is free
        if (tid == 0) flag[(c + 1) & 1] = 0;
        {
            const int nc = c + STAGES - 1;
            if (nc < chunks)
                issue_chunk(kv, pend0, pend1, sbase + RING_OFF + (nc % STAGES) * STAGE_BYTES,
                            bias_s + (nc % STAGES) * CHUNK, w, lane);
            cp_async_commit();
            const int r = lo + (nc + 1) * CHUNK + lane;
            pend0 = r < hi ? idx_row[r] : -1;
            pend1 = r + 32 < hi ? idx_row[r + 32] : -1;
        }
        const unsigned st = sbase + RING_OFF + (c % STAGES) * STAGE_BYTES;
        const float* bias_c = bias_s + (c % STAGES) * CHUNK;
#ifdef NO_MATH  // diagnostic: the copy loop alone (output garbage)
        if (c >= 0) continue;
#endif

        // ---- scores ----
        const int r0 = 16 * w + g;
        const float4 sc0 = lds128f(st + r0 * PITCH + SCALE_OFFSET);
        const float4 sc1 = lds128f(st + (r0 + 8) * PITCH + SCALE_OFFSET);
        const float bias[2] = {bias_c[r0], bias_c[r0 + 8]};
        const float sc[2][4] = {{sc0.x, sc0.y, sc0.z, sc0.w}, {sc1.x, sc1.y, sc1.z, sc1.w}};
        float lat[8], racc[8];  // latent part with the row scales applied; rope part
#if SCORE_STEPS == 0
        {
            unsigned ka[4][4][4], ra[4][4];
#pragma unroll
            for (int b = 0; b < 4; ++b)
#pragma unroll
                for (int s = 0; s < 4; ++s) ldsm4(st + sc_lane + 128 * b + 32 * s, ka[b][s]);
#pragma unroll
            for (int s = 0; s < 4; ++s) ldsm4(st + sc_lane + ROPE_OFFSET + 32 * s, ra[s]);
            float sacc[4][8];
            wg_fence();
#pragma unroll
            for (int b = 0; b < 4; ++b)
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    wgmma_e4m3(sacc[b], ka[b][s], d_qh + b * 128 + 2 * s, s);
                    wgmma_e4m3(sacc[b], ka[b][s], d_ql + b * 128 + 2 * s, 1);
                }
#pragma unroll
            for (int s = 0; s < 4; ++s) wgmma_bf16(racc, ra[s], d_qr + 2 * s, s);
            wg_commit();
            wg_wait<0>();
#pragma unroll
            for (int a = 0; a < 8; ++a) {
                const int ri = (a >> 1) & 1;
                lat[a] = sacc[0][a] * sc[ri][0];
#pragma unroll
                for (int b = 1; b < 4; ++b) lat[a] = fmaf(sacc[b][a], sc[ri][b], lat[a]);
            }
        }
#else
        {
            // FP8 wgmma keeps only about 14 bits of its running sum (DeepSeek-V3's report; DeepGEMM promotes every
            // 128 columns): each SCORE_STEPS k-steps (hi + lo) get a fresh accumulator, summed here in fp32. One
            // 128-column block a round; round b + 1 is issued before round b is summed.
            constexpr int NACC = 4 / SCORE_STEPS;
            unsigned ka[2][4][4], ra[4][4];
            float sa[2][NACC][8];
#if LO_ACC
            float sl[2][NACC][8];  // the lo products' own accumulators
#endif
#pragma unroll
            for (int s = 0; s < 4; ++s) ldsm4(st + sc_lane + 32 * s, ka[0][s]);
#pragma unroll
            for (int s = 0; s < 4; ++s) ldsm4(st + sc_lane + ROPE_OFFSET + 32 * s, ra[s]);
            auto fold = [&](int bb) {
#pragma unroll
                for (int a = 0; a < 8; ++a) {
                    float v = sa[bb & 1][0][a];
#pragma unroll
                    for (int i = 1; i < NACC; ++i) v += sa[bb & 1][i][a];
#if LO_ACC
#pragma unroll
                    for (int i = 0; i < NACC; ++i) v = fmaf(sl[bb & 1][i][a], 1.0f / LO_UP, v);
#endif
                    lat[a] = bb == 0 ? v * sc[(a >> 1) & 1][0] : fmaf(v, sc[(a >> 1) & 1][bb], lat[a]);
                }
            };
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                wg_fence();
#pragma unroll
                for (int s = 0; s < 4; ++s) {
                    wgmma_e4m3(sa[b & 1][s / SCORE_STEPS], ka[b & 1][s], d_qh + b * 128 + 2 * s, s % SCORE_STEPS);
#if LO_ACC
                    wgmma_e4m3(sl[b & 1][s / SCORE_STEPS], ka[b & 1][s], d_ql + b * 128 + 2 * s, s % SCORE_STEPS);
#else
                    wgmma_e4m3(sa[b & 1][s / SCORE_STEPS], ka[b & 1][s], d_ql + b * 128 + 2 * s, 1);
#endif
                }
                if (b == 0) {
#pragma unroll
                    for (int s = 0; s < 4; ++s) wgmma_bf16(racc, ra[s], d_qr + 2 * s, s);
                }
                wg_commit();
                if (b > 0) {
                    wg_wait<1>();
                    fold(b - 1);
                }
                if (b < 3) {
#pragma unroll
                    for (int s = 0; s < 4; ++s) ldsm4(st + sc_lane + 128 * (b + 1) + 32 * s, ka[(b + 1) & 1][s]);
                }
            }
            wg_wait<0>();
            fold(3);
        }
#endif

        // ---- softmax ----
        float s[8];  // a: row r0 + 8 ((a >> 1) & 1), head e = 2 (a >> 2) + (a & 1)
        bool over = false;
#pragma unroll
        for (int a = 0; a < 8; ++a) {
            const int ri = (a >> 1) & 1, e = 2 * (a >> 2) + (a & 1);
            const float v = fmaf(lat[a], q_up[e], racc[a]);
            s[a] = fmaf(v, qk_scale_log2, bias[ri]);
            over |= s[a] > m_run[e] + RESCALE_SLACK;
        }
#pragma unroll
        for (int b = 0; b < 4; ++b) over |= fmaxf(sc[0][b], sc[1][b]) > ref[b] * REF_SLACK;
        if (__any_sync(FULL, over) && lane == 0) flag[c & 1] = 1;

        float psum[4];
        // P' of this thread's rows into the P tiles (hi, lo), relative to the running max; psum: its sums per head
        auto store_p = [&]() {
            float m_use[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) m_use[e] = m_run[e] == NEG_INF ? 0.0f : m_run[e];
            float p[8];
#pragma unroll
            for (int a = 0; a < 8; ++a) p[a] = fast_exp2(s[a] - m_use[2 * (a >> 2) + (a & 1)]);
#pragma unroll
            for (int e = 0; e < 4; ++e) psum[e] = p[4 * (e >> 1) + (e & 1)] + p[4 * (e >> 1) + (e & 1) + 2];
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const float f0 = sc[0][b] * pmul[b], f1 = sc[1][b] * pmul[b];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int a0 = 4 * (e >> 1) + (e & 1);  // row r0; a0 + 2: row r0 + 8
                    const float x0 = p[a0] * f0, x1 = p[a0 + 2] * f1;
                    const float h0 = round4(x0), h1 = round4(x1);
                    sts16(pb_addr[e] + b * 2048, e4m3x2(h0, h1));
                    sts16(pl_addr[e] + b * 2048, e4m3x2(x0 - h0, x1 - h1));
                }
            }
        };
        store_p();
        fence_async_smem();
        __syncthreads();
        if (flag[c & 1]) {  // CTA-uniform: some row passed the running max or its block's reference scale
            float mx[4], stp[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) mx[e] = fmaxf(s[4 * (e >> 1) + (e & 1)], s[4 * (e >> 1) + (e & 1) + 2]);
#pragma unroll
            for (int b = 0; b < 4; ++b) stp[b] = fmaxf(sc[0][b], sc[1][b]);
#pragma unroll
            for (int o = 4; o < 32; o <<= 1)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    mx[e] = fmaxf(mx[e], __shfl_xor_sync(FULL, mx[e], o));
                    stp[e] = fmaxf(stp[e], __shfl_xor_sync(FULL, stp[e], o));
                }
            if (g == 0) {
#pragma unroll
                for (int e = 0; e < 4; ++e) xchg[w * 32 + 4 * t + e] = mx[e];
            }
            if (lane == 0) {
#pragma unroll
                for (int b = 0; b < 4; ++b) xchg[w * 32 + 16 + b] = stp[b];
            }
            __syncthreads();
            float alpha[4], ratio[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float gm = xchg[4 * t + e];
#pragma unroll
                for (int ow = 1; ow < 4; ++ow) gm = fmaxf(gm, xchg[ow * 32 + 4 * t + e]);
                const float m_new = fmaxf(m_run[e], gm);
                alpha[e] = m_new == NEG_INF ? 1.0f : fast_exp2(m_run[e] - m_new);  // 0 while nothing was seen
                m_run[e] = m_new;
                l_run[e] *= alpha[e];
            }
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                float gs = xchg[16 + b];
#pragma unroll
                for (int ow = 1; ow < 4; ++ow) gs = fmaxf(gs, xchg[ow * 32 + 16 + b]);
                const float r_new = fmaxf(ref[b], gs);
                ratio[b] = r_new > 0.0f ? ref[b] / r_new : 1.0f;
                ref[b] = r_new;
                pmul[b] = r_new > 0.0f ? P_SCALE / r_new : 0.0f;
            }
#pragma unroll
            for (int mt = 0; mt < 8; ++mt)
#pragma unroll
                for (int a = 0; a < 8; ++a) acc[mt][a] *= alpha[2 * (a >> 2) + (a & 1)] * ratio[mt >> 1];
            store_p();
            fence_async_smem();
            __syncthreads();
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) l_run[e] += psum[e];

        // ---- values ----
        unsigned va[8][2][4];
#pragma unroll
        for (int mt = 0; mt < 8; ++mt)
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                unsigned rr[4];
                ldsm4t(st + va_lane + 32 * ks * PITCH + 64 * mt, rr);
                va[mt][ks][0] = __byte_perm(rr[0], rr[1], 0x6240);
                va[mt][ks][1] = __byte_perm(rr[0], rr[1], 0x7351);
                va[mt][ks][2] = __byte_perm(rr[2], rr[3], 0x6240);
                va[mt][ks][3] = __byte_perm(rr[2], rr[3], 0x7351);
            }
        wg_fence();
#pragma unroll
        for (int mt = 0; mt < 8; ++mt)
#pragma unroll
            for (int ks = 0; ks < 2; ++ks) {
                wgmma_e4m3(acc[mt], va[mt][ks], d_pb + (mt >> 1) * 128 + 2 * ks, 1);
                wgmma_e4m3(acc[mt], va[mt][ks], d_pb + (mt >> 1) * 128 + 4 + 2 * ks, 1);
            }
        wg_commit();
        wg_wait<0>();
    }
    cp_async_wait<0>();

    // l over the CTA's rows: lanes (over g), then warps.
#pragma unroll
    for (int o = 4; o < 32; o <<= 1)
#pragma unroll
        for (int e = 0; e < 4; ++e) l_run[e] += __shfl_xor_sync(FULL, l_run[e], o);
    __syncthreads();
    if (g == 0) {
#pragma unroll
        for (int e = 0; e < 4; ++e) xchg[w * 32 + 4 * t + e] = l_run[e];
    }
    __syncthreads();
    float lsum[4], inv[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        lsum[e] = xchg[4 * t + e] + xchg[32 + 4 * t + e] + xchg[64 + 4 * t + e] + xchg[96 + 4 * t + e];
        inv[e] = lsum[e] > 0.0f ? 1.0f / (lsum[e] * P_SCALE) : 0.0f;
    }
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
        const int col = 64 * mt + 16 * w + 2 * g;
        const float rb = splits > 1 ? 1.0f : ref[mt >> 1];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int h = 8 * (e >> 1) + 2 * t + (e & 1);
            if (h >= heads) continue;
            const int a0 = 4 * (e >> 1) + (e & 1);
            const float v0 = acc[mt][a0] * inv[e] * rb, v1 = acc[mt][a0 + 2] * inv[e] * rb;
            unsigned pk;
            if (splits > 1) {
                asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(pk) : "f"(v1), "f"(v0));
                *reinterpret_cast<unsigned*>(part + ((mo * splits + sp) * heads + h) * 512 + col) = pk;
            } else {
                asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(pk) : "f"(v1), "f"(v0));
                *reinterpret_cast<unsigned*>(out + (mo * heads + h) * 512 + col) = pk;
            }
        }
    }
    if (w == 0 && g == 0) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int h = 8 * (e >> 1) + 2 * t + (e & 1);
            if (h >= heads) continue;
            const float l2 = lsum[e] > 0.0f ? m_run[e] + log2f(lsum[e]) : NEG_INF;
            if (splits > 1)
                plse[(mo * splits + sp) * heads + h] = l2;
            else
                lse[mo * heads + h] = l2 == NEG_INF ? __int_as_float(0x7f800000) : l2 * 0.6931471805599453f;
        }
    }
    if (splits > 1 && tid < 4) pscale[(mo * splits + sp) * 4 + tid] = ref[tid];
}
