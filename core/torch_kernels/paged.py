"""Typed views of the paged caches, so stores and gathers are plain indexing instead of byte arithmetic.

``index_k_132`` page ``[P * 132]`` uint8 = ``P * 128`` key bytes (token-major) then ``P`` fp32 scales; the
views below alias the cache (no copy): writing through them writes the cache.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import INDEX_HEAD_DIM
from dsa_runtime.reference.kv_quant import index_page_size


def index_k_views(index_cache: Tensor) -> tuple[Tensor, Tensor]:
    """``[pages, P * 132]`` uint8 -> keys ``[pages, P, 128]`` uint8 and scales ``[pages, P]`` fp32 (views)."""
    page_size = index_page_size(index_cache)
    pages = index_cache.shape[0]
    split = page_size * INDEX_HEAD_DIM
    keys = index_cache[:, :split].view(pages, page_size, INDEX_HEAD_DIM)
    scales = index_cache[:, split:].view(torch.float32)  # 4-byte aligned: 128 * P and 132 * P are
    return keys, scales


def slot_coords(slots: Tensor, page_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """``valid`` mask and the page / in-page offset (int64) of the valid ``slots`` (negative = padding)."""
    slots = slots.long()
    valid = slots >= 0
    s = slots[valid]
    return valid, s // page_size, s % page_size
