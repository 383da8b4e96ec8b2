"""Reference sparse MLA attention (absorbed / MQA form) over top-k selected latent rows.

``score[h, i] = (q[h] . kv[idx_i, :576]) * sm_scale`` over the valid selected rows; ``out[h] = softmax(score[h])
@ kv[idx, :d_v]``; ``lse[h] = ln(sum_i exp(score[h, i]))``. Everything after the gather is fp32 (FP8 cache
rows are dequantized exactly in fp32); ``out`` is rounded once to bf16 at the end. A query with no valid
index outputs zeros and ``lse = +inf``. Indices are ``-1`` or a valid row (prefill: ``< S``; decode:
``< pages * page_size``); anything else is a caller error, which the reference reports (``ValueError``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from dsa_runtime.families import D_QK, D_V, MLALayout
from dsa_runtime.reference.kv_quant import unpack_mla_fp32

# Elements of the gathered [queries, K, 576] block per chunk (fp32): 2**23 = 32 MiB.
CHUNK_ELEMENTS = 1 << 23


def _attend(q: Tensor, kv: Tensor, valid: Tensor, sm_scale: float, d_v: int) -> tuple[Tensor, Tensor]:
    """q ``[M, H, 576]`` fp32, kv ``[M, K, 576]`` fp32 (gathered rows), valid ``[M, K]`` bool.

    Returns out ``[M, H, d_v]`` fp32 and lse ``[M, H]`` fp32.
    """
    # One head at a time: a head's products then never depend on how many heads share the call (a batched
    # GEMM over 4 or 64 heads may block its fp32 sums differently), so padded heads leave the others' results
    # bit-identical, as the padding contract says.
    kv_t = kv.transpose(1, 2)
    scores = torch.stack([torch.bmm(q[:, h:h + 1], kv_t)[:, 0] for h in range(q.shape[1])], dim=1) * sm_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # -inf when the row has no valid key
    empty = ~valid.any(dim=-1)[:, None].expand_as(lse)
    # exp(score - lse) is the softmax; guard the empty rows, where it would be exp(-inf - -inf) = nan.
    probs = torch.exp(scores - torch.where(empty, 0.0, lse)[..., None])
    values = kv[..., :d_v]
    out = torch.stack([torch.bmm(probs[:, h:h + 1], values)[:, 0] for h in range(probs.shape[1])], dim=1)
    return out, torch.where(empty, float("inf"), lse)


def _chunked(
    q: Tensor, indices: Tensor, n_rows: int, fetch: Callable[[Tensor], Tensor], sm_scale: float, d_v: int
) -> tuple[Tensor, Tensor]:
    """Run :func:`_attend` over chunks of queries. q ``[M, H, 576]``, indices ``[M, K]``.

    ``fetch(idx)`` maps a tensor of valid row numbers to their ``[..., 576]`` fp32 rows.
    """
    m_total, heads, _ = q.shape
    top_k = indices.shape[1]
    out = torch.zeros(m_total, heads, d_v, dtype=torch.float32, device=q.device)
    lse = torch.full((m_total, heads), float("inf"), dtype=torch.float32, device=q.device)
    if top_k == 0 or n_rows == 0:  # nothing can be valid
        return out, lse
    idx_all = indices.long().to(q.device)
    if idx_all.numel() and (int(idx_all.min()) < -1 or int(idx_all.max()) >= n_rows):
        raise ValueError(
            f"sparse attention indices must be -1 or in [0, {n_rows}), got values in "
            f"[{int(idx_all.min())}, {int(idx_all.max())}]"
        )
    chunk = max(1, CHUNK_ELEMENTS // (top_k * max(D_QK, heads)))
    for m0 in range(0, m_total, chunk):
        m1 = min(m0 + chunk, m_total)
        idx = idx_all[m0:m1]
        valid = idx >= 0
        # Row 0 stands in for invalid indices; zero it out so that a poisoned (NaN) row 0 cannot leak
        # through 0 * NaN in the weighted sum.
        kv = torch.where(valid[..., None], fetch(torch.where(valid, idx, 0)), 0.0)
        out[m0:m1], lse[m0:m1] = _attend(q[m0:m1].float(), kv, valid, sm_scale, d_v)
    return out, lse


class ReferenceSparseAttn:
    """Plain-PyTorch implementation of :class:`dsa_runtime.families.SparseAttnKernels`."""

    def prefill(
        self, q: Tensor, kv: Tensor, indices: Tensor, sm_scale: float, d_v: int = D_V
    ) -> tuple[Tensor, Tensor]:
        """q ``[T, H, 576]`` bf16, kv ``[S, 576]`` bf16, indices ``[T, K]`` -> out ``[T, H, d_v]`` bf16, lse ``[T, H]``."""
        if q.dim() != 3 or q.shape[-1] != D_QK or kv.dim() != 2 or kv.shape[-1] != D_QK:
            raise ValueError(
                f"expected q [T, H, 576] and kv [S, 576], got {tuple(q.shape)}, {tuple(kv.shape)}"
            )
        out, lse = _chunked(q, indices, kv.shape[0], lambda idx: kv[idx].float(), sm_scale, d_v)
        return out.to(torch.bfloat16), lse

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
        """q ``[B, Q, H, 576]``, paged cache, indices ``[B, Q, K]`` slots -> out ``[B, Q, H, d_v]`` bf16, lse ``[B, Q, H]``."""
        if q.dim() != 4 or q.shape[-1] != D_QK or indices.shape[:2] != q.shape[:2]:
            raise ValueError(
                f"expected q [B, Q, H, 576] and indices [B, Q, K], got {tuple(q.shape)}, {tuple(indices.shape)}"
            )
        batch, n_q, heads, _ = q.shape
        flat = kv_cache.reshape(-1, kv_cache.shape[-1])  # slot = page * page_size + offset
        n_rows = flat.shape[0]

        def fetch(idx: Tensor) -> Tensor:
            rows = flat[idx.reshape(-1)]
            return unpack_mla_fp32(rows, layout).reshape(*idx.shape, D_QK)

        out, lse = _chunked(
            q.reshape(batch * n_q, heads, D_QK),
            indices.reshape(batch * n_q, -1),
            n_rows,
            fetch,
            sm_scale,
            d_v,
        )
        return out.reshape(batch, n_q, heads, d_v).to(torch.bfloat16), lse.reshape(batch, n_q, heads)
