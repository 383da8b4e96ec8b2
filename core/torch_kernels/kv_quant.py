"""KV cache stores and gathers for the ``torch`` backend.

The MLA row packing (``quantize_mla`` / ``dequantize_mla`` / ``store_mla``) is already one vectorised pass in
the reference and is inherited unchanged. The index-K cache is read and written through typed views of its
pages (``paged.index_k_views``): one indexed copy for the keys and one for the scales, instead of building
``[N, 128]`` and ``[N, 4]`` byte-column index tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.reference.fp8 import E4M3
from dsa_runtime.reference.kv_quant import ReferenceKVQuant
from dsa_runtime.torch_kernels.paged import index_k_views, slot_coords


class TorchKVQuant(ReferenceKVQuant):
    """:class:`dsa_runtime.families.KVQuantKernels`; MLA rows as the reference, index-K through views."""

    def store_index_k(self, index_cache: Tensor, slots: Tensor, k8: Tensor, k_scale: Tensor) -> None:
        """Write ``k8`` ``[N, 128]`` e4m3 and ``k_scale`` ``[N]`` fp32 at ``slots`` (``-1`` skipped) in place."""
        keys, scales = index_k_views(index_cache)
        valid, page, offset = slot_coords(slots.to(index_cache.device), keys.shape[1])
        keys[page, offset] = k8[valid].view(torch.uint8)
        scales[page, offset] = k_scale[valid].float()

    def gather_index_k(self, index_cache: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Read ``[N]`` valid slots back as ``k8`` ``[N, 128]`` e4m3 and ``k_scale`` ``[N]`` fp32."""
        keys, scales = index_k_views(index_cache)
        slots = slots.to(device=index_cache.device, dtype=torch.int64)
        if slots.numel() and int(slots.min()) < 0:
            raise ValueError("gather_index_k: slots must be >= 0")
        page, offset = slots // keys.shape[1], slots % keys.shape[1]
        return keys[page, offset].view(E4M3), scales[page, offset]
