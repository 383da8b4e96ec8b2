// The scan step of the sampled-bound top-k (triton/topk_sample.py) in CUDA C++, sm_80 and later. Compiled at run
// time by NVRTC (topk_scan.py); no headers. Same contract as the Triton ``_scan_kernel`` it replaces:
//
//   CTA (s, r) = slice s of row r. For a row whose window [lo, hi) holds more than k columns, slice s covers
//   columns [a, c) with per = ceil((hi - lo) / S), a = min(lo + s per, hi), c = min(a + per, hi) (c = a when the
//   row's bound is SKIP: nothing is read). Every column whose key (radix_key of its fp32 logit) is >= the row's
//   bound t goes, key and column, to [r, s, 0 .. caps) of the candidate buffers in column order (none past caps);
//   the slice's full count goes to cnt[r, s] (0 for a row of at most k columns).
//
// Why CUDA: Triton's scan holds one key per thread and ranks each chunk with tl.cumsum, a chain of dependent
// shuffles and shared-memory round trips per 2048 columns (ncu: 0.6 instructions per cycle, a quarter of copy
// speed). Here each thread owns 4 consecutive columns of every STEP-column step (one 16-byte load) and a round
// of ROUND steps: the loads of the next round are issued before this round is ranked, the steps' counts are
// ranked in pairs (two 16-bit counts packed per word: one warp scan ranks two steps) and the warps meet once per
// round in shared memory. The host checks the alignment this needs (rows 16-byte aligned, width % 4 == 0).
//
// Launched as a programmatic dependent on Hopper: it first lets the finish kernel be scheduled, then waits for the
// sample kernel (whose own wait covered everything before it) before touching memory.

#ifndef THREADS
#define THREADS 256
#endif
#define WARPS (THREADS / 32)
#define STEP (THREADS * 4)   // columns per step: 4 per thread
#ifndef ROUND
#define ROUND 2              // steps per round (16-byte loads in flight per thread, twice with the next round's)
#endif
static_assert(ROUND % 2 == 0, "steps are ranked in pairs");
#define PAIRS (ROUND / 2)
#define SKIP_BOUND 2147483647
#define KEY_MIN (-2147483647 - 1)

// fp32 -> int32 key with the fp32 order; NaN -> key(-inf), -0.0 -> key(+0.0) (topk_radix.radix_key).
__device__ __forceinline__ int radix_key(float x) {
    int bits = __float_as_int(x);
    if (x != x) bits = (int)0xFF800000u;
    if (bits == KEY_MIN) bits = 0;
    return bits ^ ((bits >> 31) & 0x7FFFFFFF);
}

// Each logit is read once: no L1 allocation.
__device__ __forceinline__ float4 load_once(const float* p) {
    float4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
}

__device__ __forceinline__ void load_round(const float* row, int c0, int c, float4 (&v)[ROUND]) {
#pragma unroll
    for (int j = 0; j < ROUND; ++j) {
        const int col = c0 + j * STEP + 4 * (int)threadIdx.x;
        v[j] = col < c ? load_once(row + col) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
}

__device__ __forceinline__ float lane_of(const float4& v, int e) {
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}

// Programmatic dependent launch (Hopper): schedule the next kernel, then wait for the previous grid's memory.
// Without the launch attribute both are no-ops.
__device__ __forceinline__ void pdl_prologue() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS)
topk_scan(const float* __restrict__ logits, long long stride_row, const int* __restrict__ starts,
          const int* __restrict__ ends, const int* __restrict__ bound, int* __restrict__ cnt, int* __restrict__ ckey,
          int* __restrict__ ccol, int k, int S, int caps) {
    pdl_prologue();
    __shared__ unsigned warp_total[2][PAIRS][WARPS];  // double-buffered: one barrier per round
    const int s = blockIdx.x;
    const int r = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int lo = starts[r];
    const int hi = ends[r];
    int count = 0;  // candidates of the slice so far (uniform across the CTA)
    if (hi - lo > k) {
        const int t = bound[r];
        const int per = (hi - lo + S - 1) / S;
        const int a = min(lo + s * per, hi);
        const int c = t == SKIP_BOUND ? a : min(a + per, hi);
        const long long base = ((long long)r * S + s) * caps;
        // key(x) >= t as a float compare, x >= ft (ft: the float whose key is t; NaN compares false, and its key,
        // key(-inf), is below every t > key(-inf)); t <= key(-inf): every column passes, NaN too.
        const bool every = t <= (int)0x807FFFFF;
        const float ft = __int_as_float(t >= 0 ? t : t ^ 0x7FFFFFFF);
        const float* row = logits + (long long)r * stride_row;
        int c0 = a & ~3;  // 16-byte aligned; the columns below a are masked
        float4 cur[ROUND];
        if (c0 < c) load_round(row, c0, c, cur);
        for (int buf = 0; c0 < c; c0 += ROUND * STEP, buf ^= 1) {
            float4 nxt[ROUND];
            if (c0 + ROUND * STEP < c) load_round(row, c0 + ROUND * STEP, c, nxt);
            // This thread's selected columns per step (bit e = column 4 tid + e) and their counts, packed in pairs.
            unsigned sel[ROUND];
            unsigned packed[PAIRS];
#pragma unroll
            for (int j = 0; j < ROUND; ++j) {
                const int col = c0 + j * STEP + 4 * (int)threadIdx.x;
                const float4 x = cur[j];
                unsigned m = every ? 0xFu
                                   : (unsigned)(x.x >= ft) | (unsigned)(x.y >= ft) << 1 | (unsigned)(x.z >= ft) << 2
                                         | (unsigned)(x.w >= ft) << 3;
                // Columns outside [a, c) (the first and last steps only): bits [lo_e, hi_e) stay.
                const int lo_e = min(max(a - col, 0), 4);
                const int hi_e = min(max(c - col, 0), 4);
                sel[j] = m & (0xFu >> (4 - hi_e)) & (0xFu << lo_e);
            }
#pragma unroll
            for (int p = 0; p < PAIRS; ++p) packed[p] = __popc(sel[2 * p]) | (__popc(sel[2 * p + 1]) << 16);
            // Inclusive warp scans of the packed counts (a warp holds at most 128 per step: no carry between halves).
            unsigned incl[PAIRS];
#pragma unroll
            for (int p = 0; p < PAIRS; ++p) {
                unsigned x = packed[p];
#pragma unroll
                for (int off = 1; off < 32; off <<= 1) {
                    const unsigned y = __shfl_up_sync(0xffffffffu, x, off);
                    if (lane >= off) x += y;
                }
                incl[p] = x;
                if (lane == 31) warp_total[buf][p][warp] = x;
            }
            __syncthreads();
            // Before this warp (the earlier warps' totals) and the whole CTA, per step pair (a step's total <= 1024).
            unsigned before[PAIRS], total[PAIRS];
#pragma unroll
            for (int p = 0; p < PAIRS; ++p) {
                before[p] = 0;
                total[p] = 0;
#pragma unroll
                for (int w = 0; w < WARPS; ++w) {
                    const unsigned x = warp_total[buf][p][w];
                    before[p] += w < warp ? x : 0u;
                    total[p] += x;
                }
            }
#pragma unroll
            for (int j = 0; j < ROUND; ++j) {
                const int p = j >> 1;
                const int sh = (j & 1) * 16;
                int dest = count + (int)(((before[p] + incl[p] - packed[p]) >> sh) & 0xffffu);
                const int col = c0 + j * STEP + 4 * (int)threadIdx.x;
                unsigned m = sel[j];
                while (m) {
                    const int e = __ffs(m) - 1;
                    m &= m - 1;
                    if (dest < caps) {
                        ckey[base + dest] = radix_key(lane_of(cur[j], e));
                        ccol[base + dest] = col + e;
                    }
                    ++dest;
                }
                count += (int)((total[p] >> sh) & 0xffffu);
            }
#pragma unroll
            for (int j = 0; j < ROUND; ++j) cur[j] = nxt[j];
        }
    }
    if (threadIdx.x == 0) cnt[r * S + s] = count;
}
