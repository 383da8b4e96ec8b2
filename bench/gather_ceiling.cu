// Pure gathers of selected 656-byte fp8_656 rows, no arithmetic: the read ceiling a sparse decode over those
// rows can reach (bench/gather_ceiling.py). Compiled by NVRTC with -DCHUNK, -DSTAGES, -DUNROLL as the bench asks.
// Each CTA reads the rows [lo, hi) of one request's selected slots (blockIdx.y = request, blockIdx.x = slice) and
// folds a few of the bytes it received into one word, written to ``sink`` so that nothing is optimised away.

#define ROW_BYTES 656
#define PIECES 41  // 16-byte pieces per row
#ifndef CHUNK
#define CHUNK 32
#endif
#ifndef STAGES
#define STAGES 2
#endif
#ifndef UNROLL
#define UNROLL 8
#endif
#define MAX_SLICE 2048

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// The slice's slots into shared memory (one read of the index list, before any row is asked for).
__device__ __forceinline__ int load_slots(const int* idx, int top_k, int rows_per_split, int* slots, int& lo) {
    lo = blockIdx.x * rows_per_split;
    const int hi = min(lo + rows_per_split, top_k);
    const int* row = idx + (long long)blockIdx.y * top_k;
    for (int r = threadIdx.x; r < hi - lo; r += blockDim.x) slots[r] = row[lo + r];
    __syncthreads();
    return hi > lo ? hi - lo : 0;
}

// cp.async of 16-byte pieces into a shared ring of STAGES x CHUNK rows (the few-head kernel's way of reading).
extern "C" __global__ void __launch_bounds__(128) gather_cp_async(const unsigned char* __restrict__ kv,
                                                                  const int* __restrict__ idx, int top_k,
                                                                  int rows_per_split, unsigned* __restrict__ sink) {
    extern __shared__ __align__(16) unsigned char smem[];
    int* slots = reinterpret_cast<int*>(smem + STAGES * CHUNK * ROW_BYTES);
    int lo;
    const int n = load_slots(idx, top_k, rows_per_split, slots, lo);
    const int chunks = (n + CHUNK - 1) / CHUNK;
    auto issue = [&](int c) {
        unsigned char* st = smem + (c % STAGES) * CHUNK * ROW_BYTES;
        for (int p = threadIdx.x; p < CHUNK * PIECES; p += 128) {
            const int r = p / PIECES;
            const int piece = p - r * PIECES;
            const int i = c * CHUNK + r;
            const int sl = i < n ? slots[i] : -1;
            const unsigned char* src = kv + (long long)(sl >= 0 ? sl : 0) * ROW_BYTES + 16 * piece;
            asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n"
                         ::"r"(smem_addr(st + r * ROW_BYTES + 16 * piece)), "l"(src), "r"(sl >= 0 ? 16 : 0));
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < chunks) issue(s);
        else asm volatile("cp.async.commit_group;\n" ::);
    }
    unsigned acc = 0;
    for (int c = 0; c < chunks; ++c) {
        if (c + STAGES - 1 < chunks) issue(c + STAGES - 1);
        else asm volatile("cp.async.commit_group;\n" ::);
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 1));
        __syncthreads();
        acc ^= reinterpret_cast<const unsigned*>(smem + (c % STAGES) * CHUNK * ROW_BYTES)[threadIdx.x];
        __syncthreads();
    }
    if (acc == 0x9e3779b9u) sink[blockIdx.y * gridDim.x + blockIdx.x] = acc;
}

// 16-byte loads straight into registers, UNROLL of them in flight per thread.
extern "C" __global__ void __launch_bounds__(128) gather_ldg(const unsigned char* __restrict__ kv,
                                                             const int* __restrict__ idx, int top_k,
                                                             int rows_per_split, unsigned* __restrict__ sink) {
    __shared__ int slots[MAX_SLICE];
    int lo;
    const int n = load_slots(idx, top_k, rows_per_split, slots, lo);
    const int pieces = n * PIECES;
    unsigned acc = 0;
    for (int base = threadIdx.x; base < pieces; base += 128 * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int p = base + 128 * u;
            const int r = p / PIECES;
            const int sl = p < pieces ? slots[r] : -1;
            if (sl >= 0) {
                const unsigned char* src = kv + (long long)sl * ROW_BYTES + 16 * (p - r * PIECES);
                asm volatile("ld.global.nc.L1::no_allocate.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                             : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(src));
            } else {
                v[u] = make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) acc ^= v[u].x ^ v[u].w;
    }
    if (acc == 0x9e3779b9u) sink[blockIdx.y * gridDim.x + blockIdx.x] = acc;
}

// One bulk (TMA) copy per row into a ring of STAGES x 32 rows, one mbarrier per stage; one warp per CTA.
extern "C" __global__ void __launch_bounds__(32) gather_bulk(const unsigned char* __restrict__ kv,
                                                             const int* __restrict__ idx, int top_k,
                                                             int rows_per_split, unsigned* __restrict__ sink) {
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem);
    unsigned char* ring = smem + 128;
    int* slots = reinterpret_cast<int*>(ring + STAGES * 32 * ROW_BYTES);
    const int lane = threadIdx.x;
    if (lane < STAGES) asm volatile("mbarrier.init.shared.b64 [%0], 1;\n" ::"r"(smem_addr(bars + lane)));
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    int lo;
    const int n = load_slots(idx, top_k, rows_per_split, slots, lo);
    const int chunks = (n + 31) / 32;
    auto issue = [&](int c) {
        const int s = c % STAGES;
        const int i = c * 32 + lane;
        const int sl = i < n ? slots[i] : -1;
        const unsigned valid = __ballot_sync(0xffffffffu, sl >= 0);
        const unsigned bar = smem_addr(bars + s);
        if (lane == 0)
            asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;\n" ::"r"(bar), "r"(__popc(valid) * ROW_BYTES)
                         : "memory");
        __syncwarp();
        if (sl >= 0)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                         ::"r"(smem_addr(ring + (s * 32 + lane) * ROW_BYTES)), "l"(kv + (long long)sl * ROW_BYTES),
                         "r"(ROW_BYTES), "r"(bar) : "memory");
    };
    for (int s = 0; s < STAGES && s < chunks; ++s) issue(s);
    unsigned acc = 0;
    for (int c = 0; c < chunks; ++c) {
        const int s = c % STAGES;
        const unsigned bar = smem_addr(bars + s);
        const unsigned parity = (c / STAGES) & 1;
        unsigned done = 0;
        while (!done)
            asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                         : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        acc ^= reinterpret_cast<const unsigned*>(ring + s * 32 * ROW_BYTES)[lane];
        __syncwarp();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // our reads before the next async writes
        if (c + STAGES < chunks) issue(c + STAGES);
    }
    if (acc == 0x9e3779b9u) sink[blockIdx.y * gridDim.x + blockIdx.x] = acc;
}
