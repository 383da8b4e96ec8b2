"""Chunked indexer logits and top-k for ragged prefill, within a memory budget.

A pure-TP batch can hold tens of thousands of query rows; their full ``[rows, keys]`` fp32 logits matrix
(64K x 64K = 16 GiB) must never exist. :func:`select_topk_ragged` walks the rows in chunks sized so that a
chunk's logits plus the top-k workspace stay within ``budget_bytes``; each chunk reads only the keys its
rows can see (``[min ks, max ke)``) and writes its indices into one preallocated ``[rows, k]`` buffer at
the chunk's global row offset. A row's logits and its top-k depend only on that row and its window, so
no chunking changes a selected index (tested against the unchunked call). Rows of several sequences (a
batched prefill: each row's window lies in its own sequence's part of ``k8``) are chunked apart.

Rows past the real query rows (``rows_total > T``: token counts padded to a TP multiple) stay ``-1``, so
the index tensor always has one row per (padded) query row.
"""

from __future__ import annotations

import torch
from torch import Tensor

# Per logit element alive at once: the fp32 logits and the top-k workspace (the reference top-k keeps a
# value copy, two stable sorts' values + int64 orders, gathers and masks; measured live peak ~50 bytes on
# CPU, 96 leaves room for allocator slack) plus the indexer's fp32 score block (4 bytes per head).
TOPK_BYTES_PER_LOGIT = 96
DEFAULT_CPU_BUDGET = 256 << 20
# A row chunk's key window may span at most this many times its widest row's window (see _chunk_rows).
SPAN_FACTOR = 1.5


def bytes_per_logit(index_heads: int) -> int:
    return TOPK_BYTES_PER_LOGIT + 4 * index_heads


def default_budget(device: torch.device) -> int:
    """CPU: 256 MiB. CUDA: a quarter of the free device memory (at most 4 GiB), read once per call."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(min(free // 4, 4 << 30))
    return DEFAULT_CPU_BUDGET


def _chunk_rows(ks, ke, r0: int, limit_elems: int) -> int:
    """Largest ``n >= 1`` (greedy) with ``n * (max ke - min ks over rows r0 .. r0+n-1) <= limit_elems`` and
    that union of windows at most ``SPAN_FACTOR`` times the widest window of one of the rows.

    The second bound keeps rows of different sequences of a batched prefill (disjoint windows in one
    concatenated key buffer) out of one chunk, whose logits would span every sequence's keys; the rows of
    one causal chunk (windows nested in the widest) stay together. ks, ke: int64 numpy arrays (no Python
    int per row: 64K rows would cost megabytes of lists)."""
    lo, hi, n, widest = int(ks[r0]), int(ke[r0]), 0, 0
    for r in range(r0, len(ks)):
        lo2, hi2 = min(lo, int(ks[r])), max(hi, int(ke[r]))
        widest2 = max(widest, int(ke[r]) - int(ks[r]))
        span = max(hi2 - lo2, 1)
        if n and ((n + 1) * span > limit_elems or span > SPAN_FACTOR * max(widest2, 1)):
            break
        lo, hi, n, widest = lo2, hi2, n + 1, widest2
    return n


def select_topk_ragged(
    kernels, q8: Tensor, weights: Tensor, k8: Tensor, k_scale: Tensor, ks: Tensor, ke: Tensor, k: int, *,
    budget_bytes: int, rows_total: int | None = None,
) -> Tensor:
    """Top-``k`` key positions per query row, computed in row chunks.

    Args:
        kernels: resolved kernels (``indexer.logits_ragged``, ``topk.topk``).
        q8 ``[T, H, 128]`` e4m3, weights ``[T, H]`` fp32: the rows' indexer queries.
        k8 ``[S, 128]`` e4m3, k_scale ``[S]`` fp32: keys of all sequences, concatenated (global offsets).
        ks, ke: ``[T]`` int: row t sees keys ``ks[t] <= s < ke[t]``.
        k: entries per row; budget_bytes: most bytes of logits + workspace alive at once.
        rows_total: rows of the output (>= T); rows past T are ``-1``.
    Returns:
        ``[rows_total, k]`` int32 positions relative to each row's ``ks`` (``topk.topk``'s contract), best
        first, ``-1`` padded.
    """
    t_total = q8.shape[0]
    rows_total = t_total if rows_total is None else rows_total
    if rows_total < t_total:
        raise ValueError(f"rows_total {rows_total} < {t_total} query rows")
    out = torch.full((rows_total, k), -1, dtype=torch.int32, device=q8.device)
    if t_total == 0:
        return out
    limit = max(1, budget_bytes // bytes_per_logit(q8.shape[1]))
    ks_l, ke_l = ks.detach().to("cpu", torch.int64).numpy(), ke.detach().to("cpu", torch.int64).numpy()
    r0 = 0
    while r0 < t_total:
        n = _chunk_rows(ks_l, ke_l, r0, limit)
        r1 = r0 + n
        lo, hi = int(ks_l[r0:r1].min()), int(ke_l[r0:r1].max())
        c_ks, c_ke = ks[r0:r1] - lo, ke[r0:r1] - lo
        logits = kernels.indexer.logits_ragged(q8[r0:r1], weights[r0:r1], k8[lo:hi], k_scale[lo:hi], c_ks, c_ke)
        out[r0:r1] = kernels.topk.topk(logits, c_ks, c_ke, k)
        del logits
        r0 = r1
    return out
