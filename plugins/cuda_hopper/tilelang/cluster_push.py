"""Device helpers of ``wsf8c``: the two head-block CTAs of one query row share the FP8 gather through a cluster.

Both CTAs of a token (heads 0-63 and 64-127) read the same 2048 cache rows, and in ``wsf8`` each dequantises all
of them: the gather warpgroup is the bottleneck (ncu, H200: its warps never wait for a free stage while both
consumer warpgroups wait for rows). In ``wsf8c`` the pair runs as a cluster of two along ``blockIdx.y``: CTA
``r`` converts rows ``32 r .. 32 r + 32`` of every 64-row chunk, and each gather thread writes every converted
16-byte piece twice from its registers: into its own stage (``st.shared``) and into the same offset of the peer's
(``st.async``, completing on the peer's ``ready`` barrier as transaction bytes: :data:`CLUSTER_SRC`). The peer's
offset is ours plus one constant (``mapa`` of the stage base, once), so whatever layout TileLang gives the stage,
the two copies match. Eight lanes write one row's 128 bytes of a 64-column atom, so a warp's remote stores are four
contiguous 128-byte rows (:func:`.gather_fp8.fp8_half_gather_macros`).

The first version pushed each half with nine 4 KB bulk shared-to-shared copies after a warpgroup barrier: about
1.2 us a chunk on the rows' path, the push starting only once the last warp had stored (H200, batch 64 x 32K, one
call: 0.1007 ms against 0.0955 with the direct stores, same run; in runs of their own, per-warp 1 KB bulk copies
took 0.1108 against 0.1007, and ``st.async`` of pieces read back from shared memory, eight rows to a warp's
instruction, 0.120 against 0.102).

Protocol per chunk and stage ``s``: ``free[s]`` counts 512 arrivals, the 256 consumer threads of both CTAs (the
peer's arrive remotely), so a gather writes its half, locally and into the peer, only when both CTAs are done
with the stage; ``ready[s]`` counts the 128 local gather arrivals, one of which also expects the 36 KB the peer
sends. A cluster barrier after the barriers' initialisation (TileLang's own, checked in the source by
:func:`cluster_problems`) and one before exit keep every remote access inside both CTAs' lifetimes.
"""

PEER_BYTES = 32 * 576 * 2  # the peer's half of a stage: 32 rows of 512 latent + 64 rope fp16 values

CLUSTER_SRC = r"""
__device__ __forceinline__ void dsa_cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;\n" ::: "memory");
}

// The peer CTA's copy of the shared object at `local` (same offset), as a shared::cluster address (mapa).
__device__ __forceinline__ unsigned dsa_peer_addr(const void* local, int peer) {
  unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(local)), r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(peer));
  return r;
}

// The peer CTA's shared::cluster address of `local` is `local`'s shared address plus this (one mapa).
__device__ __forceinline__ unsigned dsa_peer_delta(const void* local, int peer) {
  return dsa_peer_addr(local, peer) - static_cast<unsigned>(__cvta_generic_to_shared(local));
}

// 16 bytes into this CTA's shared memory at `dst` and into the peer's at the same offset (`delta`: dsa_peer_delta),
// the latter completing on the peer's barrier `rbar` as 16 transaction bytes.
__device__ __forceinline__ void dsa_store_both(void* dst, unsigned delta, unsigned rbar, uint4 v) {
  unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" :: "r"(s), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];"
               :: "r"(s + delta), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"(rbar) : "memory");
}
"""


def cluster_problems(src: str) -> list[str]:
    """What breaks the cluster protocol in a ``wsf8c`` source (empty for kernels that store into no peer)."""
    if "_both((" not in src:  # no call of the gather's two-CTA stores (the prelude defines them regardless)
        return []
    # TileLang syncs the cluster after initialising a cluster barrier (``free``): no remote arrival or store may
    # reach a peer whose barriers are not initialised yet; the program adds only the sync before exit.
    init, sync = src.find(".init("), src.find("tl::cluster_sync();")
    if init < 0 or sync < init:
        return ["wsf8c: no cluster sync after the barriers are initialised"]
    return []
