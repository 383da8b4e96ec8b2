"""KV cache stores and gathers for the ``torch`` backend.

The MLA row packing (``quantize_mla``) is already one vectorised pass in the reference and is inherited.
``store_mla`` writes the packed rows with one ``index_copy_`` into the flattened cache (slot = row), and
``dequantize_mla`` of bf16 rows returns them as they are (the reference round-trips them through fp32).
The index-K cache is read and written through typed views of its pages (``paged.index_k_views``): one
indexed copy for the keys and one for the scales, instead of building ``[N, 128]`` and ``[N, 4]``
byte-column index tensors.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import D_QK, MLALayout, check_mla_cache
from dsa_runtime.reference.fp8 import E4M3
from dsa_runtime.reference.kv_quant import ReferenceKVQuant
from dsa_runtime.torch_kernels.paged import index_k_views, slot_coords


class TorchKVQuant(ReferenceKVQuant):
    """:class:`dsa_runtime.families.KVQuantKernels`; MLA rows as the reference, index-K through views."""

    def dequantize_mla(self, rows: Tensor, *, layout: MLALayout) -> Tensor:
        """Unpack rows into ``[N, 576]`` bf16 (bf16 rows are returned as they are)."""
        if layout == "bf16" and rows.dtype == torch.bfloat16 and rows.dim() == 2 and rows.shape[-1] == D_QK:
            return rows
        return super().dequantize_mla(rows, layout=layout)

    def store_mla(
        self,
        kv_cache: Tensor,
        slots: Tensor,
        c: Tensor,
        k_pe: Tensor,
        *,
        layout: MLALayout,
    ) -> None:
        """Pack and write rows at ``slots`` (``-1`` skipped) of ``kv_cache`` ``[pages, page_size, W]`` in place."""
        check_mla_cache(kv_cache, layout)
        if not kv_cache.is_contiguous():  # a strided cache has no flat row view: the reference's path
            super().store_mla(kv_cache, slots, c, k_pe, layout=layout)
            return
        rows = self.quantize_mla(c, k_pe, layout=layout)
        slots = slots.to(device=kv_cache.device, dtype=torch.int64)
        valid = slots >= 0
        if not bool(valid.all()):
            rows, slots = rows[valid], slots[valid]
        kv_cache.view(-1, kv_cache.shape[-1]).index_copy_(0, slots, rows)

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
