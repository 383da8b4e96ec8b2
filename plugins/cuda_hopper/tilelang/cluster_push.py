"""Device helpers of ``wsf8c``: the two head-block CTAs of one query row share the FP8 gather through a cluster.

Both CTAs of a token (heads 0-63 and 64-127) read the same 2048 cache rows, and in ``wsf8`` each dequantises all
of them: the gather warpgroup is the bottleneck (ncu, H200: its warps never wait for a free stage while both
consumer warpgroups wait for rows). In ``wsf8c`` the pair runs as a cluster of two along ``blockIdx.y``: CTA
``r`` converts rows ``32 r .. 32 r + 32`` of every 64-row chunk into its own stage and pushes them into the same
offsets of the peer's stage with bulk shared-to-shared copies (``cp.async.bulk.shared::cluster.shared::cta``),
completing on the peer's ``ready`` barrier as transaction bytes; each CTA converts half the rows.

Stage layout (the one TileLang gives the f16 ``[2, 64, 512]`` latent ring and the ``[2, 64, 64]`` rope ring,
checked in the generated source by :func:`.sparse_mla.source_problems`): per stage eight 64-column atoms of
``64 rows x 64`` elements (rows contiguous, 128 bytes each, swizzled inside the row), then the rope rows. Rows
``32 r .. 32 r + 32`` of an atom are one contiguous 4 KB block, so a half stage is nine 4 KB copies.

Protocol per chunk and stage ``s``: ``free[s]`` counts 512 arrivals, the 256 consumer threads of both CTAs (the
peer's arrive remotely), so a gather writes its half, locally and into the peer, only when both CTAs are done
with the stage; ``ready[s]`` counts the 128 local gather arrivals, one of which also expects the 36 KB the peer
pushes. A cluster barrier after the barriers' initialisation (TileLang's own, checked in the source) and one
before exit keep every remote access inside both CTAs' lifetimes.
"""

import re

PUSH_BYTES = 9 * 4096  # 8 latent atoms + the rope block, 32 rows each
# The gather's stores of a ring stage in the generated source: stage stride 32768 f16 elements, 64-column atom
# (the gather's unrolled 16-byte part ``d``) stride 4096, then the CTA's half (blockIdx.y) at 2048 = 32 rows of 64;
# the rope stage stride 4096 with the half at 2048. dsa_push_half_stage copies exactly these blocks.
_LAT_STORE = re.compile(r"\(half_t\*\)kv_lat\) \+ \(+\(st_\d+ \* 32768\) \+ \(d_\d+ \* 4096\)\) "
                        r"\+ \(\(\(int\)blockIdx\.y\) \* 2048\)\)")
_ROPE_STORE = re.compile(r"\(half_t\*\)kv_rope\) \+ \(+\(st_\d+ \* 4096\) \+ \(\(\(int\)blockIdx\.y\) \* 2048\)\)")

CLUSTER_SRC = r"""
__device__ __forceinline__ void dsa_cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;\n" ::: "memory");
}

__device__ __forceinline__ unsigned dsa_peer_addr(const void* local, int peer) {
  unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(local)), r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(peer));
  return r;
}

// Rows 32 rank .. +32 of the eight latent atoms and of the rope block of one stage, into the same offsets of the
// peer CTA's stage; the peer's barrier (same offset as ours) counts the bytes.
__device__ __forceinline__ void dsa_push_half_stage(const void* lat, const void* rope, const void* bar, int rank,
                                                    int peer) {
  unsigned rbar = dsa_peer_addr(bar, peer);
  const char* lat_half = static_cast<const char*>(lat) + rank * 32 * 64 * 2;
  #pragma unroll
  for (int a = 0; a < 9; ++a) {
    const char* src = a < 8 ? lat_half + a * 64 * 64 * 2 : static_cast<const char*>(rope) + rank * 32 * 64 * 2;
    unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(src));
    asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], 4096, [%2];"
                 :: "r"(dsa_peer_addr(src, peer)), "r"(s), "r"(rbar) : "memory");
  }
}
"""


def push_layout_problems(src: str) -> list[str]:
    """What breaks the layout :data:`CLUSTER_SRC` assumes in a ``wsf8c`` source (empty for other kernels)."""
    if "dsa_push_half_stage(" not in src:
        return []
    out = []
    if not _LAT_STORE.search(src):
        out.append("wsf8c: the latent stage is not [stage 32768][atom 4096][half 2048 = 32 rows x 64] f16 elements")
    if not _ROPE_STORE.search(src):
        out.append("wsf8c: the rope stage is not [stage 4096][half 2048] f16 elements")
    # TileLang syncs the cluster after initialising a cluster barrier (``free``): no remote arrival or push may
    # reach a peer whose barriers are not initialised yet; the program adds only the sync before exit.
    init, sync = src.find(".init("), src.find("tl::cluster_sync();")
    if init < 0 or sync < init:
        out.append("wsf8c: no cluster sync after the barriers are initialised")
    return out
