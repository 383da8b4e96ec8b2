"""Reference KV cache layouts: the 656-byte FP8 MLA row, the bf16 MLA row and the 132-byte index-K pages.

Byte layouts (``dsa_runtime.families`` module docstring), little-endian as on every
supported device:

* ``fp8_656`` row: ``[0, 512)`` e4m3 of ``c``; ``[512, 528)`` four fp32 power-of-two scales (scale j covers
  ``c[128j:128j+128]``); ``[528, 656)`` 64 bf16 of ``k_pe``.
* ``bf16`` row: 576 bf16 ``[c | k_pe]``.
* ``index_k_132`` page (``page_size`` tokens): ``page_size * 128`` e4m3 bytes, token-major, then
  ``page_size`` fp32 scales. Token ``o`` of a page has its key at bytes ``[128 o, 128 o + 128)`` and its scale
  at ``[128 P + 4 o, 128 P + 4 o + 4)`` (P = page_size).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import (
    D_LATENT,
    D_ROPE,
    FP8_MLA_ROW_BYTES,
    INDEX_HEAD_DIM,
    INDEX_K_ROW_BYTES,
    QUANT_BLOCK,
    MLALayout,
    check_mla_cache,
    mla_row_format,
)
from dsa_runtime.reference.fp8 import E4M3, quantize_blocks

_SCALES_AT = D_LATENT  # 512
_ROPE_AT = D_LATENT + 4 * (D_LATENT // QUANT_BLOCK)  # 528
_N_TILES = D_LATENT // QUANT_BLOCK  # 4


def unpack_mla_fp32(rows: Tensor, layout: MLALayout) -> Tensor:
    """``[N, 656]`` uint8 or ``[N, 576]`` bf16 rows -> ``[N, 576]`` fp32 (``x = fp32(x8) * s``; k_pe copied).

    Used by sparse attention so that FP8 rows are dequantized exactly, without a bf16 rounding step.
    """
    width, dtype = mla_row_format(layout)
    if rows.dtype != dtype or rows.shape[-1] != width:
        raise ValueError(f"{layout} rows must be [N, {width}] {dtype}, got {tuple(rows.shape)} {rows.dtype}")
    if layout == "bf16":
        return rows.float()
    n = rows.shape[0]
    c8 = rows[:, :_SCALES_AT].contiguous().view(E4M3)
    scales = rows[:, _SCALES_AT:_ROPE_AT].contiguous().view(torch.float32)  # [N, 4]
    c = (c8.float().view(n, _N_TILES, QUANT_BLOCK) * scales.unsqueeze(-1)).view(n, D_LATENT)
    k_pe = rows[:, _ROPE_AT:].contiguous().view(torch.bfloat16).float()
    return torch.cat([c, k_pe], dim=-1)


def _slot_coords(slots: Tensor, page_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """Valid-slot mask, page and in-page offset (int64) of ``slots``; negative slots are padding."""
    slots = slots.long()
    valid = slots >= 0
    s = slots[valid]
    return valid, s // page_size, s % page_size


class ReferenceKVQuant:
    """Plain-PyTorch implementation of :class:`dsa_runtime.families.KVQuantKernels`."""

    def quantize_mla(self, c: Tensor, k_pe: Tensor, *, layout: MLALayout) -> Tensor:
        """Pack ``c`` ``[N, 512]`` and ``k_pe`` ``[N, 64]`` into ``[N, 656]`` uint8 or ``[N, 576]`` bf16 rows.

        FP8 rows always get power-of-two (ue8m0) scales: the cache's scale rule is not the checkpoint's.
        """
        if c.shape[-1] != D_LATENT or k_pe.shape[-1] != D_ROPE or c.shape[0] != k_pe.shape[0]:
            raise ValueError(
                f"expected c [N, 512] and k_pe [N, 64], got {tuple(c.shape)}, {tuple(k_pe.shape)}"
            )
        if layout == "bf16":
            return torch.cat([c.to(torch.bfloat16), k_pe.to(torch.bfloat16)], dim=-1)
        mla_row_format(layout)  # rejects unknown layouts
        n = c.shape[0]
        c8, scales = quantize_blocks(c, "ue8m0")  # [N, 512] e4m3, [N, 4] fp32
        rows = torch.empty(n, FP8_MLA_ROW_BYTES, dtype=torch.uint8, device=c.device)
        rows[:, :_SCALES_AT] = c8.view(torch.uint8)
        rows[:, _SCALES_AT:_ROPE_AT] = scales.contiguous().view(torch.uint8)  # 4 x fp32 = 16 bytes
        rows[:, _ROPE_AT:] = k_pe.to(torch.bfloat16).contiguous().view(torch.uint8)  # 64 x bf16 = 128 bytes
        return rows

    def dequantize_mla(self, rows: Tensor, *, layout: MLALayout) -> Tensor:
        """Unpack rows into ``[N, 576]`` bf16 (``c`` dequantized in fp32, then rounded once to bf16)."""
        return unpack_mla_fp32(rows, layout).to(torch.bfloat16)

    def store_mla(
        self,
        kv_cache: Tensor,
        slots: Tensor,
        c: Tensor,
        k_pe: Tensor,
        *,
        layout: MLALayout,
    ) -> None:
        """Write rows of ``c``/``k_pe`` at ``slots`` of ``kv_cache`` ``[pages, page_size, W]`` in place.

        Negative slots (``-1``) are skipped; no other byte of the cache is written. Duplicate valid slots are
        not allowed (which one lands is unspecified).
        """
        check_mla_cache(kv_cache, layout)
        rows = self.quantize_mla(c, k_pe, layout=layout)
        valid, page, offset = _slot_coords(slots.to(kv_cache.device), kv_cache.shape[1])
        kv_cache[page, offset] = rows[valid]

    def store_index_k(self, index_cache: Tensor, slots: Tensor, k8: Tensor, k_scale: Tensor) -> None:
        """Write ``k8`` ``[N, 128]`` e4m3 and ``k_scale`` ``[N]`` fp32 into ``index_k_132`` pages in place.

        Negative slots are skipped; bytes of other tokens are left untouched.
        """
        page_size = index_page_size(index_cache)
        valid, page, offset = _slot_coords(slots.to(index_cache.device), page_size)
        key_cols, scale_cols = _index_k_columns(offset, page_size)
        index_cache[page.unsqueeze(1), key_cols] = k8[valid].contiguous().view(torch.uint8)
        scale_bytes = k_scale[valid].float().contiguous().view(-1, 1).view(torch.uint8)  # [n, 4]
        index_cache[page.unsqueeze(1), scale_cols] = scale_bytes

    def gather_index_k(self, index_cache: Tensor, slots: Tensor) -> tuple[Tensor, Tensor]:
        """Read ``[N]`` slots back as ``k8`` ``[N, 128]`` e4m3 and ``k_scale`` ``[N]`` fp32.

        Every slot must be a valid slot (no ``-1``): callers pass real positions only.
        """
        page_size = index_page_size(index_cache)
        slots = slots.long().to(index_cache.device)
        if slots.numel() and int(slots.min()) < 0:
            raise ValueError("gather_index_k: slots must be >= 0")
        page, offset = slots // page_size, slots % page_size
        key_cols, scale_cols = _index_k_columns(offset, page_size)
        k8 = index_cache[page.unsqueeze(1), key_cols].contiguous().view(E4M3)
        k_scale = index_cache[page.unsqueeze(1), scale_cols].contiguous().view(torch.float32).view(-1)
        return k8, k_scale


def index_page_size(index_cache: Tensor) -> int:
    """Tokens per page of an ``index_k_132`` cache ``[pages, page_size * 132]`` uint8."""
    if index_cache.dim() != 2 or index_cache.dtype != torch.uint8 or index_cache.shape[1] % INDEX_K_ROW_BYTES:
        raise ValueError(
            f"index cache must be [pages, page_size * 132] uint8, got {tuple(index_cache.shape)}"
        )
    return index_cache.shape[1] // INDEX_K_ROW_BYTES


def _index_k_columns(offset: Tensor, page_size: int) -> tuple[Tensor, Tensor]:
    """Byte columns inside a page: ``[n, 128]`` for each token's key and ``[n, 4]`` for its scale."""
    key_cols = offset.unsqueeze(1) * INDEX_HEAD_DIM + torch.arange(INDEX_HEAD_DIM, device=offset.device)
    scale_cols = page_size * INDEX_HEAD_DIM + offset.unsqueeze(1) * 4 + torch.arange(4, device=offset.device)
    return key_cols, scale_cols
