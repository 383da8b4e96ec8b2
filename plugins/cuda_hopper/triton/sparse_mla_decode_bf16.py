"""Paged sparse MLA decode over a bf16 cache: the forward kernel of :mod:`.sparse_mla_prefill` on the flat
view of the cache, with split-K when the batch is too small to fill the GPU.

The cache ``[pages, page_size, 576]`` is viewed as ``[pages * page_size, 576]`` (no copy): decode indices are
physical slots, i.e. rows of that view. The number of K splits depends only on shapes and the SM count
(:func:`plan_splits`), never on data: no host synchronisation, workspaces sized from shapes, so a CUDA graph
can capture the whole call.
"""

from __future__ import annotations

import functools

import torch
import triton
from torch import Tensor

from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_combine import combine_splits
from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_prefill import (
    D_NOPE,
    AttnConfig,
    default_config,
    sparse_mla_forward,
)

CPU_SM_COUNT = 132  # an H100 SXM's SM count: the interpreter plans as the GPU would
MIN_CHUNK = 128  # fewest indices per split: below this the partial write costs more than the split saves


@functools.cache
def sm_count(device_index: int | None) -> int:
    """Streaming multiprocessors of a CUDA device (queried once per device); 132 for CPU tensors."""
    if device_index is None:
        return CPU_SM_COUNT
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def plan_splits(rows: int, heads: int, top_k: int, sms: int, cfg: AttnConfig, d_v: int = D_NOPE) -> int:
    """K splits for ``rows`` query rows: 1 when ``rows x head blocks`` programs fill the SMs, else enough
    splits to fill them, each at least ``MIN_CHUNK`` indices (and a multiple of the row tile)."""
    programs = rows * triton.cdiv(heads, cfg.block_h) * triton.cdiv(d_v, cfg.block_dv)
    if programs == 0 or top_k <= MIN_CHUNK:
        return 1
    splits = min(max(1, sms // programs), triton.cdiv(top_k, MIN_CHUNK))
    if splits <= 1:
        return 1
    chunk = triton.cdiv(triton.cdiv(top_k, splits), cfg.block_n) * cfg.block_n
    return triton.cdiv(top_k, chunk)  # no split left without indices


def decode_bf16(
    q: Tensor, kv_cache: Tensor, indices: Tensor, sm_scale: float, d_v: int = D_NOPE, *,
    config: AttnConfig | None = None, num_splits: int | None = None,
) -> tuple[Tensor, Tensor]:
    """q ``[B, Q, H, 576]`` bf16, kv_cache ``[pages, page_size, 576]`` bf16, indices ``[B, Q, K]`` int32 slots
    (``-1`` empty) -> out ``[B, Q, H, d_v]`` bf16, lse ``[B, Q, H]`` fp32 (natural log; ``+inf`` when empty).

    ``num_splits`` overrides :func:`plan_splits` (tests compare split and unsplit runs).
    """
    if q.dim() != 4 or indices.dim() != 3 or indices.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"expected q [B, Q, H, 576] and indices [B, Q, K], got {tuple(q.shape)}, {tuple(indices.shape)}"
        )
    if kv_cache.dim() != 3 or kv_cache.shape[-1] != 576 or kv_cache.dtype != torch.bfloat16:
        raise ValueError(f"bf16 cache must be [pages, page_size, 576] bf16, got {tuple(kv_cache.shape)} {kv_cache.dtype}")
    batch, n_q, heads, _ = q.shape
    rows = batch * n_q
    flat = kv_cache.reshape(-1, kv_cache.shape[-1])  # a view for a contiguous cache
    q3 = q.reshape(rows, heads, q.shape[-1])
    idx = indices.reshape(rows, indices.shape[-1])
    cfg = config or default_config(heads, q.dtype, "decode")
    if num_splits is None:
        num_splits = plan_splits(rows, heads, idx.shape[1], sm_count(q.device.index if q.is_cuda else None), cfg, d_v)
    if num_splits <= 1 or idx.shape[1] == 0:
        out, lse = sparse_mla_forward(q3, flat, idx, sm_scale, d_v, config=cfg)
    else:
        part, part_lse = sparse_mla_forward(q3, flat, idx, sm_scale, d_v, config=cfg, num_splits=num_splits)
        out, lse = combine_splits(part, part_lse)
    return out.view(batch, n_q, heads, d_v), lse.view(batch, n_q, heads)
