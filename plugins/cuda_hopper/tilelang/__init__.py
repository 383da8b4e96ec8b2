"""TileLang kernels of the cuda_hopper ``tilelang`` backend (our own programs, compiled on first use).

* :mod:`.sparse_mla`: the sparse MLA forward program (absorbed form, 64 heads per block, gathered KV rows in
  shared memory, wgmma GEMMs, online softmax in fp32) and its per-shape compile cache;
* :mod:`.sparse_mla_ws`: its warp-specialised schedule (a producer warpgroup gathering with cp.async into an
  mbarrier-guarded ring, two consumer warpgroups sharing the scores and splitting the 512 output columns);
* :mod:`.sparse_attn`: :class:`~.sparse_attn.TileLangSparseAttn` (``sparse_attn.prefill`` / bf16 ``decode``),
  its claims and its availability check.

Nothing here imports tilelang (or torch) at import time: plugin discovery reads only the claims.
"""
