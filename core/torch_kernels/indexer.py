"""Lightning indexer for the ``torch`` backend: batched GEMMs instead of per-request loops.

``I[t, s] = k_scale[s] * sum_h w[t, h] * relu(q8[t, h] . k8[s])``: the e4m3 values are upcast to fp32 (exact)
and the ``q . k`` products summed by an fp32 GEMM, then the head sum is a batched ``[1, H] @ [H, S]``
product per query row. Row chunks bound the ``[rows, H, S]`` intermediate (64 MiB fp32) on long prefills.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import INDEX_HEAD_DIM, ScaleFmt
from dsa_runtime.torch_kernels import e4m3
from dsa_runtime.torch_kernels.paged import index_k_views
from dsa_runtime.torch_kernels.quant import quantize_blocks
from dsa_runtime.torch_kernels.rotate import hadamard_rotate

CHUNK_ELEMENTS = 1 << 24  # fp32 elements of one [rows, H, S] score block


def _head_sum(q: Tensor, w: Tensor, k: Tensor) -> Tensor:
    """q ``[T, H, 128]`` fp32, w ``[T, H]`` fp32, k ``[S, 128]`` fp32 -> ``[T, S]`` fp32."""
    t, h, d = q.shape
    scores = (q.reshape(t * h, d) @ k.T).relu_().view(t, h, -1)  # [T, H, S]
    return torch.bmm(w.unsqueeze(1), scores).squeeze(1)


class TorchIndexer:
    """:class:`dsa_runtime.families.IndexerKernels` in vectorised PyTorch."""

    def quantize_q(
        self, q: Tensor, head_weights: Tensor, *, scale_fmt: ScaleFmt = "ue8m0"
    ) -> tuple[Tensor, Tensor]:
        """``q`` ``[T, H, 128]`` -> ``q8`` ``[T, H, 128]`` e4m3 and ``w`` ``[T, H]`` fp32."""
        if q.dim() != 3 or q.shape[-1] != INDEX_HEAD_DIM:
            raise ValueError(f"q must be [T, H, 128], got {tuple(q.shape)}")
        heads = q.shape[1]
        q8, q_scale = quantize_blocks(hadamard_rotate(q), scale_fmt)
        w = head_weights.float() * q_scale.squeeze(-1) * (heads**-0.5 * INDEX_HEAD_DIM**-0.5)
        return q8, w

    def quantize_k(self, k: Tensor, *, scale_fmt: ScaleFmt = "ue8m0") -> tuple[Tensor, Tensor]:
        """``k`` ``[S, 128]`` -> ``k8`` ``[S, 128]`` e4m3 and ``k_scale`` ``[S]`` fp32."""
        if k.dim() != 2 or k.shape[-1] != INDEX_HEAD_DIM:
            raise ValueError(f"k must be [S, 128], got {tuple(k.shape)}")
        k8, k_scale = quantize_blocks(hadamard_rotate(k), scale_fmt)
        return k8, k_scale.squeeze(-1)

    def logits_ragged(
        self, q8: Tensor, weights: Tensor, k8: Tensor, k_scale: Tensor, ks: Tensor, ke: Tensor
    ) -> Tensor:
        """``[T, S]`` fp32 logits, ``-inf`` outside ``ks[t] <= s < ke[t]``."""
        t_total, heads = q8.shape[0], q8.shape[1]
        s_total = k8.shape[0]
        device = q8.device
        out = torch.full((t_total, s_total), float("-inf"), dtype=torch.float32, device=device)
        if t_total == 0 or s_total == 0:
            return out
        ks, ke = ks.to(device=device, dtype=torch.int64), ke.to(device=device, dtype=torch.int64)
        qf, wf, kf = e4m3.to_float(q8), weights.float(), e4m3.to_float(k8)
        scale = k_scale.float().to(device)
        cols = torch.arange(s_total, device=device)
        row_chunk = max(1, CHUNK_ELEMENTS // max(1, heads * s_total))
        for t0 in range(0, t_total, row_chunk):
            t1 = min(t0 + row_chunk, t_total)
            # Only the keys some row of this chunk can see (a ragged batch skips other requests' keys).
            lo = max(0, int(ks[t0:t1].min()))
            hi = min(s_total, int(ke[t0:t1].max()))
            if hi <= lo:
                continue
            block = _head_sum(qf[t0:t1], wf[t0:t1], kf[lo:hi]) * scale[lo:hi]
            c = cols[lo:hi]
            inside = (c >= ks[t0:t1, None]) & (c < ke[t0:t1, None])
            out[t0:t1, lo:hi] = block.masked_fill_(~inside, float("-inf"))
        return out

    def logits_paged(
        self,
        q8: Tensor,
        weights: Tensor,
        index_cache: Tensor,
        context_lens: Tensor,
        block_table: Tensor,
        max_context_len: int,
    ) -> Tensor:
        """``[B * N, max_context_len]`` fp32 decode logits, every request in one batched GEMM."""
        batch, n_q, heads, d = q8.shape
        device = q8.device
        width = max_context_len
        if batch == 0 or width <= 0:
            return torch.full((batch * n_q, max(width, 0)), float("-inf"), dtype=torch.float32, device=device)
        keys, scales = index_k_views(index_cache)  # [pages, P, 128] uint8, [pages, P] fp32
        out = torch.empty(batch, n_q, width, dtype=torch.float32, device=device)
        # Requests per chunk: bounds the gathered [b, W, 128] keys and [b, N * H, W] scores (fp32).
        per_request = width * (d + n_q * heads)
        step = max(1, CHUNK_ELEMENTS // per_request)
        q = e4m3.to_float(q8).reshape(batch, n_q * heads, d)
        w = weights.float().view(batch, n_q, heads)
        lens = context_lens.to(device=device, dtype=torch.int64)
        for b0 in range(0, batch, step):
            b1 = min(b0 + step, batch)
            out[b0:b1] = _paged_block(q[b0:b1], w[b0:b1], keys, scales, lens[b0:b1],
                                      block_table[b0:b1], width)
        return out.view(batch * n_q, width)


def _paged_block(q: Tensor, w: Tensor, keys: Tensor, scales: Tensor, lens: Tensor, block_table: Tensor,
                 width: int) -> Tensor:
    """Logits of a few requests: q ``[b, N * H, 128]`` fp32, w ``[b, N, H]`` -> ``[b, N, W]`` fp32.

    Whole pages are copied with ``index_select`` (one contiguous block per page, much faster than indexing
    by (page, offset) pairs), then cut to the first ``W`` positions.
    """
    batch, n_q, heads = w.shape
    device = q.device
    page_size = keys.shape[1]
    n_pages = -(-width // page_size)
    table = block_table.to(device=device, dtype=torch.int64)[:, :n_pages]
    if table.shape[1] < n_pages:  # positions past the table are never visible; pad with page 0
        table = torch.nn.functional.pad(table, (0, n_pages - table.shape[1]))
    # Entries past a request's length may be anything: clamp them into range, they are masked below.
    pages = table.clamp(0, keys.shape[0] - 1).reshape(-1)
    k8 = keys.index_select(0, pages).view(batch, n_pages * page_size, -1)[:, :width]  # [b, W, 128] uint8
    k_scale = scales.index_select(0, pages).view(batch, n_pages * page_size)[:, :width]
    scores = torch.bmm(q, e4m3.to_float(k8).transpose(1, 2)).relu_().view(batch * n_q, heads, width)
    logits = torch.bmm(w.reshape(batch * n_q, 1, heads), scores).view(batch, n_q, width)
    logits.mul_(k_scale.unsqueeze(1))
    # Query j of request b sees p < len_b - N + j + 1 (the last N cache tokens are the new queries).
    pos = torch.arange(width, device=device)
    limit = lens[:, None] - n_q + 1 + torch.arange(n_q, device=device)[None, :]  # [b, N]
    visible = pos[None, None, :] < limit[:, :, None]
    return logits.masked_fill_(~visible, float("-inf"))
