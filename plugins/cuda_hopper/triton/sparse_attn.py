"""The ``sparse_attn`` family of the ``triton`` backend: sparse MLA prefill and paged decode.

* :meth:`TritonSparseAttn.prefill`: :func:`.sparse_mla_prefill.sparse_mla_forward` over the flat bf16 buffer.
* :meth:`TritonSparseAttn.decode`: ``fp8_656`` at up to 16 heads or at 32 (two head groups) -> the CUDA C++
  kernel of :mod:`dsa_runtime.plugins.cuda_hopper.cuda.fewhead_fp8` (compiled by NVRTC; 1.8x the Triton kernel at
  16 heads, 1.5x at 32, batch 64 on an H200) when NVRTC is found, else as below; up to :data:`FEWHEAD_MAX_HEADS`
  heads, both layouts -> :func:`.sparse_mla_decode_fewhead.decode_fewhead`; more heads: ``layout="bf16"`` ->
  :func:`.sparse_mla_decode_bf16.decode_bf16` (the same kernel on the flat view of the cache, split-K for small
  batches); ``layout="fp8_656"`` -> ``mla_fp8_decode.decode_fp8_656`` (another module, imported on first use).

This module imports neither torch nor triton at import time: the plugin reads :data:`SPARSE_ATTN_CLAIMS`
while registering backends, which must stay cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsa_runtime.capabilities import MethodClaim, ValueSet
from dsa_runtime.families import D_V, MLALayout

if TYPE_CHECKING:
    from torch import Tensor

    from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_prefill import AttnConfig

# Heads are tiled by 16/32/64 with the rest masked, so any count works; 1..128 is what V3.2 needs (128 heads,
# or 128 / tp per rank). K is walked in masked blocks: any length. Decode reads slots of the flat cache view:
# any page size, any number of queries per request.
# Up to this many heads per query (V3.2 on TP >= 4) decode runs every head of a query in one program, the
# selected rows sliced over several programs per SM (.sparse_mla_decode_fewhead); more heads use head blocks.
FEWHEAD_MAX_HEADS = 32

SPARSE_ATTN_CLAIMS: dict[str, MethodClaim] = {
    "sparse_attn.prefill": MethodClaim(heads=ValueSet.between(1, 128), kv_layouts=ValueSet.one_of("bf16")),
    "sparse_attn.decode": MethodClaim(heads=ValueSet.between(1, 128), kv_layouts=ValueSet.one_of("bf16", "fp8_656")),
}


class TritonSparseAttn:
    """:class:`dsa_runtime.families.SparseAttnKernels` in Triton for SM90.

    Args:
        config: fixed launch shape for every call (default: chosen per head count, see
            :func:`.sparse_mla_prefill.default_config`).
        decode_splits: fixed number of K splits in bf16 decode (default: planned from shapes and SM count).
    """

    def __init__(self, config: AttnConfig | None = None, decode_splits: int | None = None) -> None:
        self.config = config
        self.decode_splits = decode_splits

    def prefill(
        self, q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int = D_V
    ) -> tuple[Tensor, Tensor]:
        """q ``[T, H, 576]`` bf16, kv ``[S, 576]`` bf16, indices ``[T, K]`` int32 -> out ``[T, H, d_v]`` bf16,
        lse ``[T, H]`` fp32 (natural log; ``+inf`` and zeros for a query with no valid index)."""
        from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_prefill import sparse_mla_forward

        return sparse_mla_forward(q, kv, indices, sm_scale, d_v, config=self.config)

    def decode(
        self,
        q: Tensor,
        kv_cache: Tensor,
        indices: Tensor,
        sm_scale: float,
        *,
        layout: MLALayout,
        d_v: int = D_V,
    ) -> tuple[Tensor, Tensor]:
        """q ``[B, Q, H, 576]`` bf16, cache ``[pages, page_size, 576]`` bf16 or ``[..., 656]`` uint8, indices
        ``[B, Q, K]`` int32 slots -> out ``[B, Q, H, d_v]`` bf16, lse ``[B, Q, H]`` fp32."""
        if q.shape[-2] <= FEWHEAD_MAX_HEADS and self.config is None and self.decode_splits is None:
            from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_fewhead import decode_fewhead

            if layout == "fp8_656":
                from dsa_runtime.plugins.cuda_hopper.cuda import fewhead_fp8

                if fewhead_fp8.use_cuda_kernel(q, d_v):
                    return fewhead_fp8.decode_fewhead_fp8_cuda(q, kv_cache, indices, sm_scale, d_v)

            return decode_fewhead(q, kv_cache, indices, sm_scale, d_v, layout=layout)
        if layout == "bf16":
            from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_bf16 import decode_bf16

            return decode_bf16(q, kv_cache, indices, sm_scale, d_v, config=self.config, num_splits=self.decode_splits)
        if layout == "fp8_656":
            from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import decode_fp8_656

            return decode_fp8_656(q, kv_cache, indices, sm_scale, d_v)
        raise ValueError(f"unknown MLA layout {layout!r}; valid: bf16, fp8_656")
