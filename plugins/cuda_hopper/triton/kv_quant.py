"""The ``kv_quant`` family of the ``triton`` backend: fused quantize-and-store of MLA rows, index-K pages.

Layouts (``dsa_runtime.families`` docstring): an ``fp8_656`` row is 512 e4m3 of ``c``, four fp32 ue8m0 scales,
64 bf16 of ``k_pe``; a ``bf16`` row is 576 bf16 ``[c | k_pe]``; an ``index_k_132`` page is ``page_size * 128``
e4m3 bytes (token-major) then ``page_size`` fp32 scales. The kernels (:mod:`.kv_quant_kernels`) address one byte buffer
through typed views of it (e4m3 / fp32 / bf16). Scales are computed exactly as the reference: ``s = max(amax, 1e-4) / 448`` correctly
rounded, then rounded *up* to a power of two on the exponent bits (an exact power of two stays itself, so
``amax == 448 * 2**k`` gives ``2**k``); ``c8 = e4m3(clamp(c / s, +-448))``. Every launch is sized from shapes
only (no host synchronisation): slot ``-1`` rows are masked out inside the kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsa_runtime.capabilities import MethodClaim, ValueSet
from dsa_runtime.families import (
    D_LATENT,
    D_QK,
    D_ROPE,
    INDEX_HEAD_DIM,
    INDEX_K_ROW_BYTES,
    MLALayout,
    check_mla_cache,
    mla_row_format,
)

if TYPE_CHECKING:
    from torch import Tensor

_CUDA = ValueSet.one_of("cuda")
# Importing this module loads neither torch nor triton (the plugin may read the claims at registration);
# the kernels live in :mod:`.kv_quant_kernels`, imported on first call.
# Every layout, page size and row count; CUDA only (the interpreter runs them on CPU in tests).
KV_QUANT_CLAIMS: dict[str, MethodClaim] = {
    "kv_quant.quantize_mla": MethodClaim(devices=_CUDA, kv_layouts=ValueSet.one_of("bf16", "fp8_656")),
    "kv_quant.dequantize_mla": MethodClaim(devices=_CUDA, kv_layouts=ValueSet.one_of("bf16", "fp8_656")),
    "kv_quant.store_mla": MethodClaim(devices=_CUDA, kv_layouts=ValueSet.one_of("bf16", "fp8_656")),
    "kv_quant.store_index_k": MethodClaim(devices=_CUDA),
    "kv_quant.gather_index_k": MethodClaim(devices=_CUDA),
}


def _check_rows(c: Tensor, k_pe: Tensor) -> None:
    if c.dim() != 2 or k_pe.dim() != 2 or c.shape[1] != D_LATENT or k_pe.shape[1] != D_ROPE \
            or c.shape[0] != k_pe.shape[0]:
        raise ValueError(f"expected c [N, 512] and k_pe [N, 64], got {tuple(c.shape)}, {tuple(k_pe.shape)}")


class TritonKVQuant:
    """:class:`dsa_runtime.families.KVQuantKernels` in Triton: one launch per call, no host synchronisation."""

    def quantize_mla(self, c: Tensor, k_pe: Tensor, *, layout: MLALayout) -> Tensor:
        """c ``[N, 512]``, k_pe ``[N, 64]`` -> ``[N, 656]`` uint8 (fp8_656) or ``[N, 576]`` bf16 rows."""
        import torch

        from dsa_runtime.plugins.cuda_hopper.triton.kv_quant_kernels import pack_rows

        _check_rows(c, k_pe)
        width, dtype = mla_row_format(layout)
        out = torch.empty(c.shape[0], width, dtype=dtype, device=c.device)
        pack_rows(c, k_pe, None, out, layout)
        return out

    def dequantize_mla(self, rows: Tensor, *, layout: MLALayout) -> Tensor:
        """``[N, 656]`` uint8 (any row stride, e.g. rows gathered from pages) or ``[N, 576]`` bf16 -> ``[N, 576]`` bf16."""
        import torch

        from dsa_runtime.plugins.cuda_hopper.triton.kv_quant_kernels import unpack_fp8

        width, dtype = mla_row_format(layout)
        if rows.dim() != 2 or rows.shape[1] != width or rows.dtype != dtype:
            raise ValueError(f"{layout} rows must be [N, {width}] {dtype}, got {tuple(rows.shape)} {rows.dtype}")
        if layout == "bf16":
            return rows if rows.stride(1) == 1 else rows.contiguous()
        n = rows.shape[0]
        out = torch.empty(n, D_QK, dtype=torch.bfloat16, device=rows.device)
        if n == 0:
            return out
        if rows.stride(1) != 1 or rows.stride(0) % 16 or rows.storage_offset() % 16:
            rows = rows.contiguous()  # the typed views need 16-byte aligned rows
        unpack_fp8(rows, out)
        return out

    def store_mla(self, kv_cache: Tensor, slots: Tensor, c: Tensor, k_pe: Tensor, *, layout: MLALayout) -> None:
        """Quantize and write rows at ``slots`` (``-1`` skipped) of ``kv_cache`` ``[pages, page_size, W]`` in place."""
        check_mla_cache(kv_cache, layout)
        if not kv_cache.is_contiguous():
            raise ValueError("store_mla: the cache must be contiguous (slot = page * page_size + offset)")
        _check_rows(c, k_pe)
        if slots.shape != (c.shape[0],):
            raise ValueError(f"slots must be [N] = [{c.shape[0]}], got {tuple(slots.shape)}")
        from dsa_runtime.plugins.cuda_hopper.triton.kv_quant_kernels import pack_rows

        pack_rows(c, k_pe, slots, kv_cache, layout)

    def store_index_k(self, index_cache: Tensor, slots: Tensor, k8: Tensor, k_scale: Tensor) -> None:
        """Write ``k8`` ``[N, 128]`` e4m3 and ``k_scale`` ``[N]`` fp32 at ``slots`` (``-1`` skipped) in place."""
        import torch

        from dsa_runtime.plugins.cuda_hopper.triton.kv_quant_kernels import index_k

        page = _index_page(index_cache)
        n = slots.shape[0]
        if k8.shape != (n, INDEX_HEAD_DIM) or k_scale.shape != (n,):
            raise ValueError(f"expected k8 [{n}, 128] and k_scale [{n}], got {tuple(k8.shape)}, {tuple(k_scale.shape)}")
        if n == 0:
            return
        k8 = k8.contiguous().view(torch.uint8)
        k_scale = k_scale.to(torch.float32).contiguous()
        slots = slots.to(device=index_cache.device, dtype=torch.int64).contiguous()
        index_k(index_cache, slots, k8, k_scale, page, store=True)

    def gather_index_k(self, index_cache: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Read ``[N]`` slots back as ``k8`` ``[N, 128]`` e4m3 and ``k_scale`` ``[N]`` fp32.

        A negative slot reads as zeros (no host check, so that the call stays free of synchronisation).
        """
        import torch

        from dsa_runtime.plugins.cuda_hopper.triton.kv_quant_kernels import index_k

        page = _index_page(index_cache)
        n = slots.shape[0]
        k8 = torch.empty(n, INDEX_HEAD_DIM, dtype=torch.uint8, device=index_cache.device)
        ks = torch.empty(n, dtype=torch.float32, device=index_cache.device)
        if n:
            slots = slots.to(device=index_cache.device, dtype=torch.int64).contiguous()
            index_k(index_cache, slots, k8, ks, page, store=False)
        return k8.view(torch.float8_e4m3fn), ks


def _index_page(index_cache: Tensor) -> int:
    """Tokens per page of a contiguous ``index_k_132`` cache ``[pages, page_size * 132]`` uint8."""
    import torch

    if index_cache.dim() != 2 or index_cache.dtype != torch.uint8 or index_cache.shape[1] % INDEX_K_ROW_BYTES \
            or not index_cache.is_contiguous():
        raise ValueError(f"index cache must be a contiguous [pages, page_size * 132] uint8, got "
                         f"{tuple(index_cache.shape)} {index_cache.dtype}")
    return index_cache.shape[1] // INDEX_K_ROW_BYTES
