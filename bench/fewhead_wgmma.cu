// Probe (bench/fewhead_wgmma.py): few-head fp8_656 sparse MLA decode with the selected rows as wgmma's M side,
// warp-specialised. Not a backend kernel: it is correct (checked against the reference by the bench) and measured
// beside the production one (plugins/cuda_hopper/cuda/fewhead_fp8.cu); docs/benchmarks.md has the figures.
//
// One CTA = one query x one slice of its selected rows, 64 rows a chunk, 384 threads, one CTA per SM (178 KB):
//   * two producer warpgroups load each chunk's 656-byte rows with 16-byte register loads (two chunks in flight),
//     convert the 512 e4m3 values of every row once, exactly, to fp16 (cvt.rn.f16x2.e4m3x2) into one of two tiles:
//     [8 panels of 64 columns][64 rows][128 B], 128-byte swizzle, so that the same bytes are the scores' K-major A
//     (rows as M) and the values' M-major A (columns as M); rope rows (bf16) into a [64][128 B] panel, the row scales
//     and biases (0 or -inf) beside;
//   * one consumer warpgroup: scores S^T[64 rows x 16 heads] by wgmma m64n16k16, one accumulator per 128-column
//     block (its row scales applied after) plus rope (bf16); online softmax over the rows per head (the max across
//     warps through shared memory); values O^T[512 columns x 16 heads] += V^T P'^T, 8 M tiles x 4 k-steps, where
//     P'_b = P * scale[row, b] / ref_b (fp16, one per column block, ref_b the running largest scale).
//   Tiles pass between the roles through named barriers: FULL (the producers stored a tile) and EMPTY (the
//   consumer's values wgmma finished reading it).
// Partials (fp32, base-2 lse) are merged by the Triton merge when a query has several slices, as in the production
// kernel. Heads <= 16; q's latent part is scaled per head by a power of two into fp16's range, as there.
// -DPHASE_TIMES adds clock64() sums per phase and warp into ``times`` ([12 warps][8] u64).

#define ROW_BYTES 656
#define CHUNK 64
// two tiles (fp16 latent 64 KB + bf16 rope 8 KB each), q (fp16 latent, bf16 rope), P' (4 blocks), per-tile scales,
// biases and slots, the cross-warp exchange
#define TILE_BYTES 73728
#define KR_IN_TILE 65536
#define QN_OFF 147456
#define QR_OFF 163840
#define PB_OFF 165888
#define SCALE_OFF 174080
#define BIAS_OFF (SCALE_OFF + 2 * CHUNK * 16)
#define SLOT_OFF (BIAS_OFF + 2 * CHUNK * 4)
#define XCHG_OFF (SLOT_OFF + 2 * CHUNK * 4)
#define SMEM_BYTES 178688  // dynamic shared memory the host asks for (bench/fewhead_wgmma.py reads it)
static_assert(SMEM_BYTES == XCHG_OFF + 512 + 1024, "exchange + 1024: the base is aligned up to the swizzle's 1024 bytes");
#define RESCALE_SLACK 8.0f
#define REF_SLACK 16.0f
#define Q_FP16_MAX 16384.0f
#define NEG_INF __int_as_float(0xff800000)
#define BAR_FULL 1     // + tile: the producers stored it (all threads)
#define BAR_EMPTY 3    // + tile: the consumer's wgmma finished reading it (all threads)
#define BAR_CONS 5     // the consumer warpgroup
#define BAR_PROD 6     // the producer warpgroups
#define PRODUCERS 256
#define ALL_THREADS (128 + PRODUCERS)
#define LOADS 11       // 16-byte pieces a producer thread loads per chunk: 8 latent + up to 3 scale / rope

__device__ __forceinline__ unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void e4m3x4_to_f16(unsigned w, unsigned& lo, unsigned& hi) {
    asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n cvt.rn.f16x2.e4m3x2 %0, l;\n cvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
        : "=r"(lo), "=r"(hi) : "r"(w));
}
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ void sts128(unsigned a, unsigned x, unsigned y, unsigned z, unsigned w) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(x), "r"(y), "r"(z), "r"(w));
}
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

// Shared-memory matrix descriptor, 128-byte swizzle; a later operand adds its byte offset / 16 to the start field.
__device__ __forceinline__ unsigned long long sw128_desc(unsigned addr, unsigned lbo, unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
           ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

#define WG_ACC8(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])

template <int TRANS_A>
__device__ __forceinline__ void wgmma_f16(float* d, unsigned long long da, unsigned long long db, int acc) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
        : WG_ACC8(d) : "l"(da), "l"(db), "r"(acc), "n"(TRANS_A));
}
__device__ __forceinline__ void wgmma_bf16(float* d, unsigned long long da, unsigned long long db, int acc) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %10, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
        : WG_ACC8(d) : "l"(da), "l"(db), "r"(acc));
}

// Byte offset of 16-byte chunk ``c`` (0..7) of 128-byte row ``r`` in a 128B-swizzled panel.
__device__ __forceinline__ unsigned swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// Producer: the slots of chunk c (already in ``pre``) into the slot buffer (c % 2); ``pre`` then loads chunk c + 1's.
__device__ __forceinline__ void stage_slots(const int* idx_row, int lo, int hi, int c, int ptid, int* slot_s, int& pre) {
    if (ptid < CHUNK) {
        slot_s[(c & 1) * CHUNK + ptid] = pre;
        const int r = lo + (c + 1) * CHUNK + ptid;
        pre = r < hi ? idx_row[r] : -1;
    }
}

// Producer work of a chunk, LOADS 16-byte pieces a thread: i < 8: latent pieces, a warp instruction covering rows
// 2 rp and 2 rp + 1 (lanes 0-15, 16-31), 16 pieces each (rows of both parities: the swizzled fp16 stores of the 32
// lanes fall on all eight 16-byte bank groups); i >= 8: the 64 rows' scale and rope pieces, 576 of them.
__device__ __forceinline__ void piece_of(int ptid, int i, int& r, int& piece, bool& live) {
    const int lane = ptid & 31, pw = ptid >> 5;
    if (i < 8) {
        const int u = pw + 8 * i;
        r = 2 * (u >> 1) + (lane >> 4);
        piece = 16 * (u & 1) + (lane & 15);
        live = true;
    } else {
        const int p = ptid + PRODUCERS * (i - 8);
        r = p / 9;
        piece = 32 + (p - 9 * r);
        live = p < CHUNK * 9;
        if (!live) r = 0;
    }
}

__device__ __forceinline__ void load_chunk(const unsigned char* kv, const int* slot_c, int ptid, uint4 (&buf)[LOADS]) {
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        int r, piece;
        bool live;
        piece_of(ptid, i, r, piece, live);
        const int sl = live ? slot_c[r] : -1;
        const unsigned char* src = kv + (long long)(sl >= 0 ? sl : 0) * ROW_BYTES + 16 * piece;
        // zero, then a predicated load into the same registers: nothing waits for the load here
        asm volatile("{\n .reg .pred p;\n setp.ge.s32 p, %5, 0;\n mov.b32 %0, 0;\n mov.b32 %1, 0;\n mov.b32 %2, 0;\n"
                     " mov.b32 %3, 0;\n @p ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n}\n"
                     : "=r"(buf[i].x), "=r"(buf[i].y), "=r"(buf[i].z), "=r"(buf[i].w) : "l"(src), "r"(sl));
    }
}

__device__ __forceinline__ void store_chunk(unsigned tile, float* scale_t, float* bias_t, const int* slot_c, int ptid,
                                            const uint4 (&buf)[LOADS]) {
    if (ptid < CHUNK) bias_t[ptid] = slot_c[ptid] >= 0 ? 0.0f : NEG_INF;
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        int r, piece;
        bool live;
        piece_of(ptid, i, r, piece, live);
        const uint4 x = buf[i];
        if (i < 8) {
            unsigned f[8];
            e4m3x4_to_f16(x.x, f[0], f[1]);
            e4m3x4_to_f16(x.y, f[2], f[3]);
            e4m3x4_to_f16(x.z, f[4], f[5]);
            e4m3x4_to_f16(x.w, f[6], f[7]);
            const unsigned pan = tile + (piece >> 2) * 8192;
            sts128(pan + swz(r, 2 * (piece & 3)), f[0], f[1], f[2], f[3]);
            sts128(pan + swz(r, 2 * (piece & 3) + 1), f[4], f[5], f[6], f[7]);
        } else if (live) {
            if (piece == 32)
                reinterpret_cast<uint4*>(scale_t)[r] = x;
            else
                sts128(tile + KR_IN_TILE + swz(r, piece - 33), x.x, x.y, x.z, x.w);
        }
    }
}

extern "C" __global__ void __launch_bounds__(ALL_THREADS, 1)
fewhead_wgmma_decode(const unsigned short* __restrict__ q, const unsigned char* __restrict__ kv,
                     const int* __restrict__ idx, float* __restrict__ part, float* __restrict__ plse,
                     unsigned short* __restrict__ out, float* __restrict__ lse, int heads, int top_k,
                     int rows_per_split, int splits, float qk_scale_log2, long long stride_qm, long long stride_qh,
                     long long stride_im, unsigned long long* __restrict__ times) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<size_t>(smem_raw) + 1023) & ~size_t(1023));
    const unsigned sbase = smem_addr(smem);
    const int tid = threadIdx.x;
    const long long m = blockIdx.y;
    const int sp = blockIdx.x;
    const int lo = sp * rows_per_split;
    const int hi = min(lo + rows_per_split, top_k);
    const int chunks = hi > lo ? (hi - lo + CHUNK - 1) / CHUNK : 0;
    const int* idx_row = idx + m * stride_im;
    float* scale_s = reinterpret_cast<float*>(smem + SCALE_OFF);  // [tile][64 rows][4]
    float* bias_s = reinterpret_cast<float*>(smem + BIAS_OFF);    // [tile][64]
    int* slot_s = reinterpret_cast<int*>(smem + SLOT_OFF);        // [c % 2][64]
    float* xchg = reinterpret_cast<float*>(smem + XCHG_OFF);
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
    if (tid >= 128) {
        // ---------------- producer warpgroup ----------------
        const int ptid = tid - 128;
        if (chunks == 0) return;
        int pre = ptid < CHUNK && lo + ptid < hi ? idx_row[lo + ptid] : -1;
        // two chunks of rows in flight (a: even chunks, tile 0; b: odd, tile 1): chunk c + 2's loads are issued as
        // soon as chunk c is stored
        uint4 a[LOADS], b[LOADS];
        stage_slots(idx_row, lo, hi, 0, ptid, slot_s, pre);
        bar_sync(BAR_PROD, PRODUCERS);
        load_chunk(kv, slot_s, ptid, a);
        if (chunks > 1) {
            stage_slots(idx_row, lo, hi, 1, ptid, slot_s, pre);
            bar_sync(BAR_PROD, PRODUCERS);
            load_chunk(kv, slot_s + CHUNK, ptid, b);
        }
#ifdef PHASE_TIMES
        unsigned long long pt[4] = {0, 0, 0, 0};
        unsigned long long ptk = clock64();
#define PTICK(i) do { __syncwarp(); const unsigned long long nw = clock64(); pt[i] += nw - ptk; ptk = nw; } while (0)
#else
#define PTICK(i) do {} while (0)
#endif
        for (int c = 0; c < chunks; c += 2) {
            PTICK(3);
            if (c >= 2) bar_sync(BAR_EMPTY + 0, ALL_THREADS);
            PTICK(0);
            store_chunk(sbase, scale_s, bias_s, slot_s, ptid, a);
            PTICK(1);
            fence_async_smem();
            bar_arrive(BAR_FULL + 0, ALL_THREADS);
            PTICK(2);
            if (c + 1 >= chunks) break;
            if (c + 2 < chunks) {
                bar_sync(BAR_PROD, PRODUCERS);  // slot buffer 0 (chunk c) read by every thread
                stage_slots(idx_row, lo, hi, c + 2, ptid, slot_s, pre);
                bar_sync(BAR_PROD, PRODUCERS);
                load_chunk(kv, slot_s, ptid, a);
            }
            PTICK(3);
            if (c + 1 >= 2) bar_sync(BAR_EMPTY + 1, ALL_THREADS);
            PTICK(0);
            store_chunk(sbase + TILE_BYTES, scale_s + CHUNK * 4, bias_s + CHUNK, slot_s + CHUNK, ptid, b);
            PTICK(1);
            fence_async_smem();
            bar_arrive(BAR_FULL + 1, ALL_THREADS);
            PTICK(2);
            if (c + 3 < chunks) {
                bar_sync(BAR_PROD, PRODUCERS);  // slot buffer 1 (chunk c + 1) read by every thread
                stage_slots(idx_row, lo, hi, c + 3, ptid, slot_s, pre);
                bar_sync(BAR_PROD, PRODUCERS);
                load_chunk(kv, slot_s + CHUNK, ptid, b);
            }
        }
        PTICK(3);
#ifdef PHASE_TIMES
        if ((tid & 31) == 0)
            for (int i = 0; i < 4; ++i) atomicAdd(times + (tid >> 5) * 8 + i, pt[i]);
#endif
        return;
    }
    // ---------------- consumer warpgroup ----------------
    const int w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    // q: per-head power-of-two scale-down so the latent part fits fp16; QN (fp16) and QR (bf16) as swizzled K-major B.
    // Thread tid: head h = tid / 8, columns [72 j, 72 j + 72) of 576 for j = tid % 8 (9 pieces of 8 columns).
    float q_up_mine;
    {
        const int h = tid >> 3, j = tid & 7;
        float top = 0.0f;
        uint4 raw[9];
#pragma unroll
        for (int i = 0; i < 9; ++i) {
            const int col = 72 * j + 8 * i;
            raw[i] = h < heads ? *reinterpret_cast<const uint4*>(q + m * stride_qm + h * stride_qh + col)
                               : make_uint4(0, 0, 0, 0);
            if (col < 512) {
                const unsigned wv[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    top = fmaxf(top, fmaxf(fabsf(__uint_as_float(wv[e] << 16)), fabsf(__uint_as_float(wv[e] & 0xffff0000u))));
            }
        }
#pragma unroll
        for (int o = 1; o < 8; o <<= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
        const float up = exp2f(fmaxf(ceilf(log2f(fmaxf(top, 1.0f) / Q_FP16_MAX)), 0.0f));
        const float down = 1.0f / up;
        q_up_mine = up;
#pragma unroll
        for (int i = 0; i < 9; ++i) {
            const int col = 72 * j + 8 * i;
            const unsigned wv[4] = {raw[i].x, raw[i].y, raw[i].z, raw[i].w};
            if (col < 512) {
                unsigned f[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float a = __uint_as_float(wv[e] << 16) * down, b = __uint_as_float(wv[e] & 0xffff0000u) * down;
                    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(f[e]) : "f"(b), "f"(a));
                }
                // panel col / 64, head row h (16 rows of 128 B a panel), chunk (col % 64) / 8
                sts128(sbase + QN_OFF + (col >> 6) * 2048 + swz(h, (col & 63) >> 3), f[0], f[1], f[2], f[3]);
            } else {
                sts128(sbase + QR_OFF + swz(h, (col - 512) >> 3), wv[0], wv[1], wv[2], wv[3]);
            }
        }
    }
    // q_up of this thread's four heads (2t, 2t+1, 8+2t, 9+2t), from the threads tid = 8 h.
    float q_up[4];
    if ((tid & 7) == 0) xchg[tid >> 3] = q_up_mine;
    fence_async_smem();
    bar_sync(BAR_CONS, 128);
#pragma unroll
    for (int e = 0; e < 4; ++e) q_up[e] = xchg[(e >> 1) * 8 + 2 * t + (e & 1)];
    bar_sync(BAR_CONS, 128);

    float acc[8][8];  // O^T tiles: cols 64 mt + 16 w + g (+8), heads 2t, 2t+1, 8+2t, 9+2t
#pragma unroll
    for (int a = 0; a < 8; ++a)
#pragma unroll
        for (int b = 0; b < 8; ++b) acc[a][b] = 0.0f;
    float m_run[4] = {NEG_INF, NEG_INF, NEG_INF, NEG_INF};
    float l_run[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float ref[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // per 128-column block: reference row scale
    float inv_ref[4] = {0.0f, 0.0f, 0.0f, 0.0f};

#ifdef PHASE_TIMES
    unsigned long long ph[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    unsigned long long tk = clock64();
#define TICK(i) do { __syncwarp(); const unsigned long long nw = clock64(); ph[i] += nw - tk; tk = nw; } while (0)
#else
#define TICK(i) do {} while (0)
#endif
    const unsigned long long d_qn = sw128_desc(sbase + QN_OFF, 16, 1024), d_qr = sw128_desc(sbase + QR_OFF, 16, 1024);
    const unsigned long long d_pb = sw128_desc(sbase + PB_OFF, 16, 1024);
    unsigned pb_addr[2][4];  // P'_0 address of (row 16 w + g + 8 ri, head e); block b at + 2048 b
#pragma unroll
    for (int ri = 0; ri < 2; ++ri)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = 16 * w + g + 8 * ri, h = (e >> 1) * 8 + 2 * t + (e & 1);
            pb_addr[ri][e] = sbase + PB_OFF + swz(h, r >> 3) + (r & 7) * 2;
        }
    for (int c = 0; c < chunks; ++c) {
        const int tl = c & 1;
        const unsigned tile = sbase + tl * TILE_BYTES;
        const float* scale_c = scale_s + tl * CHUNK * 4;
        const float* bias_c = bias_s + tl * CHUNK;
        // descriptors: a base per operand, constant offsets added in 16-byte units (start address field)
        const unsigned long long dt_k = sw128_desc(tile, 16, 1024), dt_m = sw128_desc(tile, 8192, 1024);
        bar_sync(BAR_FULL + tl, ALL_THREADS);
        TICK(0);
        // Scores: 4 column blocks + rope.
        float sb[4][8], sr[8];
        wg_fence();
#pragma unroll
        for (int b = 0; b < 4; ++b)
#pragma unroll
            for (int s = 0; s < 8; ++s) {
                const int ks = 8 * b + s;
                const unsigned long long da = dt_k + (((ks >> 2) * 8192 + (ks & 3) * 32) >> 4);
                const unsigned long long db = d_qn + (((ks >> 2) * 2048 + (ks & 3) * 32) >> 4);
                wgmma_f16<0>(sb[b], da, db, s);
            }
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const unsigned long long da = dt_k + ((KR_IN_TILE + s * 32) >> 4);
            const unsigned long long db = d_qr + ((s * 32) >> 4);
            wgmma_bf16(sr, da, db, s);
        }
        wg_commit();
        // Row scales and biases of rows r0 = 16 w + g and r0 + 8 while the scores run.
        float sc[2][4], bi[2];
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
            const int r = 16 * w + g + 8 * ri;
#pragma unroll
            for (int b = 0; b < 4; ++b) sc[ri][b] = scale_c[4 * r + b];
            bi[ri] = bias_c[r];
        }
        wg_wait<0>();
        TICK(4);
        // s[ri][e]: row r0 + 8 ri, head e (2t, 2t+1, 8+2t, 9+2t); accumulator index: 4 (e / 2) + 2 ri + e % 2.
        float s[2][4];
        float mx[4] = {NEG_INF, NEG_INF, NEG_INF, NEG_INF};
#pragma unroll
        for (int ri = 0; ri < 2; ++ri)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int a = 4 * (e >> 1) + 2 * ri + (e & 1);
                float v = sb[0][a] * sc[ri][0] + sb[1][a] * sc[ri][1] + sb[2][a] * sc[ri][2] + sb[3][a] * sc[ri][3];
                v = fmaf(v, q_up[e], sr[a]);
                s[ri][e] = fmaf(v, qk_scale_log2, bi[ri]);
                mx[e] = fmaxf(mx[e], s[ri][e]);
            }
        float stop[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) stop[b] = fmaxf(sc[0][b], sc[1][b]);
#pragma unroll
        for (int o = 4; o < 32; o <<= 1)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                mx[e] = fmaxf(mx[e], __shfl_xor_sync(0xffffffffu, mx[e], o));
                stop[e] = fmaxf(stop[e], __shfl_xor_sync(0xffffffffu, stop[e], o));
            }
        // stop: every lane's max over the warp's rows (the xor over g covers all rows; t only picks heads)
        if (g == 0) {
#pragma unroll
            for (int e = 0; e < 4; ++e) xchg[w * 32 + 4 * t + e] = mx[e];
        }
        if (lane == 0) {
#pragma unroll
            for (int b = 0; b < 4; ++b) xchg[w * 32 + 16 + b] = stop[b];
        }
        bar_sync(BAR_CONS, 128);
        {
            const float4* x4 = reinterpret_cast<const float4*>(xchg);
            const float4 m0 = x4[t], m1 = x4[8 + t], m2 = x4[16 + t], m3 = x4[24 + t];
            const float4 s0 = x4[4], s1 = x4[12], s2 = x4[20], s3 = x4[28];
            mx[0] = fmaxf(fmaxf(m0.x, m1.x), fmaxf(m2.x, m3.x));
            mx[1] = fmaxf(fmaxf(m0.y, m1.y), fmaxf(m2.y, m3.y));
            mx[2] = fmaxf(fmaxf(m0.z, m1.z), fmaxf(m2.z, m3.z));
            mx[3] = fmaxf(fmaxf(m0.w, m1.w), fmaxf(m2.w, m3.w));
            stop[0] = fmaxf(fmaxf(s0.x, s1.x), fmaxf(s2.x, s3.x));
            stop[1] = fmaxf(fmaxf(s0.y, s1.y), fmaxf(s2.y, s3.y));
            stop[2] = fmaxf(fmaxf(s0.z, s1.z), fmaxf(s2.z, s3.z));
            stop[3] = fmaxf(fmaxf(s0.w, s1.w), fmaxf(s2.w, s3.w));
        }
        float alpha[4], m_use[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const bool grow = mx[e] > m_run[e] + RESCALE_SLACK;
            const float m_new = grow ? fmaxf(m_run[e], mx[e]) : m_run[e];
            m_use[e] = m_new == NEG_INF ? 0.0f : m_new;
            alpha[e] = grow ? fast_exp2(m_run[e] - m_use[e]) : 1.0f;
            m_run[e] = m_new;
            l_run[e] *= alpha[e];
        }
        float ratio[4];
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            ratio[b] = 1.0f;
            if (stop[b] > ref[b] * REF_SLACK) {
                ratio[b] = __fdividef(ref[b], stop[b]);
                ref[b] = stop[b];
                inv_ref[b] = __fdividef(1.0f, stop[b]);
            }
        }
        // Rescale O (tiles 2b, 2b+1 belong to block b); the accumulator index a -> head e = 2 (a / 4) + a % 2.
        const bool same = alpha[0] == 1.0f && alpha[1] == 1.0f && alpha[2] == 1.0f && alpha[3] == 1.0f &&
                          ratio[0] == 1.0f && ratio[1] == 1.0f && ratio[2] == 1.0f && ratio[3] == 1.0f;
        if (!__all_sync(0xffffffffu, same)) {
#pragma unroll
            for (int mt = 0; mt < 8; ++mt)
#pragma unroll
                for (int a = 0; a < 8; ++a) acc[mt][a] *= alpha[2 * (a >> 2) + (a & 1)] * ratio[mt >> 1];
        }
        // P'_b = p * scale[row, b] / ref_b in fp16, stored as K-major B: [block b][head h][64 rows], 128B swizzle.
#pragma unroll
        for (int ri = 0; ri < 2; ++ri) {
            float scl[4];
#pragma unroll
            for (int b = 0; b < 4; ++b) scl[b] = sc[ri][b] * inv_ref[b];
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                p[e] = fast_exp2(s[ri][e] - m_use[e]);
                l_run[e] += p[e];
            }
#pragma unroll
            for (int b = 0; b < 4; ++b)
#pragma unroll
                for (int e = 0; e < 4; e += 2) {
                    unsigned pk;
                    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(pk) : "f"(p[e + 1] * scl[b]), "f"(p[e] * scl[b]));
                    asm volatile("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %2;\n st.shared.b16 [%0], l;\n st.shared.b16 [%1], h;\n}\n"
                                 ::"r"(pb_addr[ri][e] + b * 2048), "r"(pb_addr[ri][e + 1] + b * 2048), "r"(pk));
                }
        }
        TICK(5);
        fence_async_smem();
        bar_sync(BAR_CONS, 128);
        TICK(6);
        wg_fence();
#pragma unroll
        for (int mt = 0; mt < 8; ++mt)
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                // A = V^T (M = 64 columns of panel mt, K = rows 16 s .. 16 s + 15), M-major; B = P'_(mt / 2)^T.
                const unsigned long long da = dt_m + ((mt * 8192 + s * 2048) >> 4);
                const unsigned long long db = d_pb + (((mt >> 1) * 2048 + s * 32) >> 4);
                wgmma_f16<1>(acc[mt], da, db, 1);
            }
        wg_commit();
        // Waiting here keeps ptxas from serialising the wgmmas (C7514: a wait for the previous chunk's values after
        // this chunk's scores are issued reads as accumulators in use), and frees the tile a chunk earlier.
        wg_wait<0>();
        if (c + 2 < chunks) bar_arrive(BAR_EMPTY + tl, ALL_THREADS);
        TICK(7);
    }
#ifdef PHASE_TIMES
    if (lane == 0)
        for (int i = 0; i < 8; ++i) atomicAdd(times + w * 8 + i, ph[i]);
#endif
    wg_wait<0>();

    // l over the CTA's rows: lanes (over g), then warps.
#pragma unroll
    for (int o = 4; o < 32; o <<= 1)
#pragma unroll
        for (int e = 0; e < 4; ++e) l_run[e] += __shfl_xor_sync(0xffffffffu, l_run[e], o);
    bar_sync(BAR_CONS, 128);
    if (g == 0) {
#pragma unroll
        for (int e = 0; e < 4; ++e) xchg[w * 32 + 4 * t + e] = l_run[e];
    }
    bar_sync(BAR_CONS, 128);
    float lsum[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) lsum[e] = xchg[4 * t + e] + xchg[32 + 4 * t + e] + xchg[64 + 4 * t + e] + xchg[96 + 4 * t + e];
    float inv_l[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) inv_l[e] = lsum[e] > 0.0f ? __fdividef(1.0f, lsum[e]) : 0.0f;
#pragma unroll
    for (int mt = 0; mt < 8; ++mt)
#pragma unroll
        for (int a = 0; a < 8; ++a) {
            const int e = 2 * (a >> 2) + (a & 1);
            const int h = (e >> 1) * 8 + 2 * t + (e & 1);
            if (h >= heads) continue;
            const int col = 64 * mt + 16 * w + g + 8 * ((a >> 1) & 1);
            const float v = acc[mt][a] * ref[mt >> 1] * inv_l[e];
            if (splits > 1)
                part[((m * splits + sp) * heads + h) * 512 + col] = v;
            else {
                unsigned short b;
                asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(b) : "f"(v));
                out[(m * heads + h) * 512 + col] = b;
            }
        }
    if (w == 0 && g == 0) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int h = (e >> 1) * 8 + 2 * t + (e & 1);
            if (h >= heads) continue;
            const float l2 = lsum[e] > 0.0f ? m_run[e] + log2f(lsum[e]) : NEG_INF;
            if (splits > 1)
                plse[(m * splits + sp) * heads + h] = l2;
            else
                lse[m * heads + h] = l2 == NEG_INF ? __int_as_float(0x7f800000) : l2 * 0.6931471805599453f;
        }
    }
}
