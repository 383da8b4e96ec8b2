"""Reference lightning indexer: Hadamard + FP8 quantization and ReLU-weighted head-sum logits.

``I[t, s] = k_scale[s] * sum_h w[t, h] * relu(q8[t, h] . k8[s])`` with the e4m3 values upcast to fp32 and
all sums in fp32. Logits are computed in chunks of query rows (and of heads when one row is already large)
so that a long prefill never materialises a ``[T, H, S]`` intermediate; only the ``[T, S]`` output is full.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import INDEX_HEAD_DIM, ScaleFmt
from dsa_runtime.reference.fp8 import quantize_blocks
from dsa_runtime.reference.hadamard import hadamard_rotate
from dsa_runtime.reference.kv_quant import ReferenceKVQuant, index_page_size

# Elements of the per-chunk [rows, heads, keys] score block (fp32): 2**24 = 64 MiB.
CHUNK_ELEMENTS = 1 << 24


def _weighted_relu_sum(q: Tensor, w: Tensor, k: Tensor) -> Tensor:
    """``sum_h w[t, h] * relu(q[t, h] . k[s])`` -> ``[T, S]`` fp32, chunked over rows and heads.

    q: ``[T, H, 128]`` fp32, w: ``[T, H]`` fp32, k: ``[S, 128]`` fp32.
    """
    t_total, heads, _ = q.shape
    s_total = k.shape[0]
    out = torch.zeros(t_total, s_total, dtype=torch.float32, device=q.device)
    if t_total == 0 or s_total == 0:
        return out
    head_chunk = max(1, min(heads, CHUNK_ELEMENTS // s_total))
    row_chunk = max(1, CHUNK_ELEMENTS // (head_chunk * s_total))
    for t0 in range(0, t_total, row_chunk):
        t1 = min(t0 + row_chunk, t_total)
        for h0 in range(0, heads, head_chunk):
            h1 = min(h0 + head_chunk, heads)
            scores = torch.einsum("thd,sd->ths", q[t0:t1, h0:h1], k).relu_()
            out[t0:t1] += torch.einsum("ths,th->ts", scores, w[t0:t1, h0:h1])
    return out


class ReferenceIndexer:
    """Plain-PyTorch implementation of :class:`dsa_runtime.families.IndexerKernels`."""

    def quantize_q(
        self, q: Tensor, head_weights: Tensor, *, scale_fmt: ScaleFmt = "ue8m0"
    ) -> tuple[Tensor, Tensor]:
        """``q`` ``[T, H, 128]`` -> ``q8`` ``[T, H, 128]`` e4m3 and ``w`` ``[T, H]`` fp32.

        The rotation stays in fp32 (no bf16 rounding before the FP8 cast). ``H`` in ``H**-0.5`` is
        ``q.shape[1]``, the head count actually passed.
        """
        if q.dim() != 3 or q.shape[-1] != INDEX_HEAD_DIM:
            raise ValueError(f"q must be [T, H, 128], got {tuple(q.shape)}")
        heads = q.shape[1]
        q8, q_scale = quantize_blocks(hadamard_rotate(q), scale_fmt)  # q_scale [T, H, 1]
        w = head_weights.float() * heads**-0.5 * q_scale.squeeze(-1) * INDEX_HEAD_DIM**-0.5
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
        """``[T, S]`` fp32 logits, ``-inf`` outside ``ks[t] <= s < ke[t]`` (windows are clipped to [0, S])."""
        t_total, s_total = q8.shape[0], k8.shape[0]
        out = torch.full((t_total, s_total), float("-inf"), dtype=torch.float32, device=q8.device)
        ks, ke = ks.long().to(q8.device), ke.long().to(q8.device)
        row_chunk = max(1, CHUNK_ELEMENTS // max(1, q8.shape[1] * s_total))
        for t0 in range(0, t_total, row_chunk):
            t1 = min(t0 + row_chunk, t_total)
            # Only the keys some row of this chunk can see: a ragged batch skips the other requests' keys.
            lo = max(0, int(ks[t0:t1].min()))
            hi = min(s_total, int(ke[t0:t1].max()))
            if hi <= lo:
                continue
            block = _weighted_relu_sum(q8[t0:t1].float(), weights[t0:t1].float(), k8[lo:hi].float())
            block = block * k_scale[lo:hi].float()
            cols = torch.arange(lo, hi, device=q8.device)
            inside = (cols >= ks[t0:t1, None]) & (cols < ke[t0:t1, None])
            out[t0:t1, lo:hi] = torch.where(inside, block, float("-inf"))
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
        """``[B * N, max_context_len]`` fp32 decode logits over the ``index_k_132`` cache.

        Query ``j`` of request ``b`` (output row ``b * N + j``) sees positions ``p < context_lens[b] - N + j + 1``;
        positions ``>= max_context_len`` are not represented (the caller sizes the output).
        """
        batch, n_q, heads, _ = q8.shape
        page_size = index_page_size(index_cache)
        out = torch.full((batch * n_q, max_context_len), float("-inf"), dtype=torch.float32, device=q8.device)
        gather = ReferenceKVQuant().gather_index_k
        lens = context_lens.tolist()
        for b in range(batch):
            length = min(int(lens[b]), max_context_len)
            if length <= 0:
                continue
            pos = torch.arange(length, device=q8.device)
            slots = block_table[b].to(q8.device).long()[pos // page_size] * page_size + pos % page_size
            k8, k_scale = gather(index_cache, slots)
            rows = slice(b * n_q, (b + 1) * n_q)
            block = _weighted_relu_sum(q8[b].float(), weights[rows].float(), k8.float()) * k_scale
            # Causal limit of each query: the last N cache tokens are the N new queries, in order.
            limit = int(lens[b]) - n_q + 1 + torch.arange(n_q, device=q8.device)
            out[rows, :length] = torch.where(pos[None, :] < limit[:, None], block, float("-inf"))
        return out
