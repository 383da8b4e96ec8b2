"""The ``indexer`` family of the ``triton`` backend: fused rotate-and-quantize, FP8 ragged and paged logits.

:mod:`.indexer_quant` rotates (Hadamard as a bf16 tensor-core dot) and quantizes q / k per 128-channel row;
:mod:`.indexer_logits` computes ``I[t, s] = k_scale[s] * sum_h w[t, h] * relu(q8[t, h] . k8[s])`` with fp8
``tl.dot`` tiles. :meth:`TritonIndexer.ragged_topk_chunked` runs long prefills in row chunks through
:func:`dsa_runtime.model.index_select.select_topk_ragged` (the engine's chunked path) so a ``[T, S]`` logits
matrix never exists whole.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING

from dsa_runtime.capabilities import MethodClaim, ValueSet
from dsa_runtime.families import INDEX_HEAD_DIM, ScaleFmt

if TYPE_CHECKING:  # the plugin imports INDEXER_CLAIMS while probing: no torch / triton import at module level
    from torch import Tensor

# Heads 1..64 (padded to a power of two >= 16 inside the dot), any page size, 1..4 queries per request
# (the paged kernel pads N to a power of two; MTP uses 1 or 2).
INDEXER_CLAIMS: dict[str, MethodClaim] = {
    "indexer.quantize_q": MethodClaim(index_heads=ValueSet.between(1, 64), scale_fmts=ValueSet.one_of("ue8m0", "float")),
    "indexer.quantize_k": MethodClaim(scale_fmts=ValueSet.one_of("ue8m0", "float")),
    "indexer.logits_ragged": MethodClaim(index_heads=ValueSet.between(1, 64)),
    "indexer.logits_paged": MethodClaim(
        index_heads=ValueSet.between(1, 64), decode_queries=ValueSet.between(1, 4), page_sizes=ValueSet.any()
    ),
}
MAX_HEADS = 64


def _check_heads(heads: int) -> None:
    if not 1 <= heads <= MAX_HEADS:
        raise ValueError(f"the Triton indexer supports 1..{MAX_HEADS} index heads, got {heads}")


class TritonIndexer:
    """:class:`dsa_runtime.families.IndexerKernels` in Triton for SM90.

    Args:
        ragged_config / paged_config: fixed launch shapes (default: the modules' defaults); the GPU bench
            (``bench/indexer_triton.py``) compares the candidates.
    """

    def __init__(self, ragged_config=None, paged_config=None) -> None:
        self.ragged_config = ragged_config
        self.paged_config = paged_config

    def quantize_q(
        self, q: Tensor, head_weights: Tensor, *, scale_fmt: ScaleFmt = "ue8m0"
    ) -> tuple[Tensor, Tensor]:
        """``q`` ``[T, H, 128]`` bf16/fp32 -> ``q8`` ``[T, H, 128]`` e4m3, ``w`` ``[T, H]`` fp32."""
        from dsa_runtime.plugins.cuda_hopper.triton.indexer_quant import rotate_quantize

        if q.dim() != 3 or q.shape[-1] != INDEX_HEAD_DIM:
            raise ValueError(f"q must be [T, H, 128], got {tuple(q.shape)}")
        t, heads = q.shape[0], q.shape[1]
        _check_heads(heads)
        if tuple(head_weights.shape) != (t, heads):
            raise ValueError(f"head_weights must be [{t}, {heads}], got {tuple(head_weights.shape)}")
        q8, _, w = rotate_quantize(q.reshape(t * heads, INDEX_HEAD_DIM), scale_fmt, head_weights, heads)
        assert w is not None
        return q8.view(t, heads, INDEX_HEAD_DIM), w.view(t, heads)

    def quantize_k(self, k: Tensor, *, scale_fmt: ScaleFmt = "ue8m0") -> tuple[Tensor, Tensor]:
        """``k`` ``[S, 128]`` bf16/fp32 -> ``k8`` ``[S, 128]`` e4m3, ``k_scale`` ``[S]`` fp32."""
        from dsa_runtime.plugins.cuda_hopper.triton.indexer_quant import rotate_quantize

        if k.dim() != 2 or k.shape[-1] != INDEX_HEAD_DIM:
            raise ValueError(f"k must be [S, 128], got {tuple(k.shape)}")
        k8, k_scale, _ = rotate_quantize(k, scale_fmt)
        return k8, k_scale

    def logits_ragged(
        self, q8: Tensor, weights: Tensor, k8: Tensor, k_scale: Tensor, ks: Tensor, ke: Tensor
    ) -> Tensor:
        """``[T, S]`` fp32 logits, ``-inf`` outside ``ks[t] <= s < ke[t]``."""
        from dsa_runtime.plugins.cuda_hopper.triton.indexer_logits import logits_ragged

        if q8.dim() != 3 or q8.shape[-1] != INDEX_HEAD_DIM or k8.dim() != 2 or k8.shape[-1] != INDEX_HEAD_DIM:
            raise ValueError(f"expected q8 [T, H, 128] and k8 [S, 128], got {tuple(q8.shape)}, {tuple(k8.shape)}")
        _check_heads(q8.shape[1])
        return logits_ragged(q8, weights, k8, k_scale, ks, ke, self.ragged_config)

    def logits_paged(
        self,
        q8: Tensor,
        weights: Tensor,
        index_cache: Tensor,
        context_lens: Tensor,
        block_table: Tensor,
        max_context_len: int,
    ) -> Tensor:
        """``[B * N, max_context_len]`` fp32; query j of request b sees ``p < context_lens[b] - N + j + 1``."""
        from dsa_runtime.plugins.cuda_hopper.triton.indexer_logits import logits_paged

        if q8.dim() != 4 or q8.shape[-1] != INDEX_HEAD_DIM:
            raise ValueError(f"q8 must be [B, N, H, 128], got {tuple(q8.shape)}")
        if index_cache.shape[1] % (INDEX_HEAD_DIM + 4):
            raise ValueError(f"index_cache rows of {index_cache.shape[1]} bytes are not a multiple of 132")
        _check_heads(q8.shape[2])
        if not 1 <= q8.shape[1] <= 4 and q8.shape[0]:
            raise ValueError(f"the Triton indexer supports 1..4 queries per request, got {q8.shape[1]}")
        return logits_paged(q8, weights, index_cache, context_lens, block_table, max_context_len,
                            self.paged_config)

    def ragged_topk_chunked(
        self, q8: Tensor, w: Tensor, k8: Tensor, k_scale: Tensor, ks: Tensor, ke: Tensor, k: int,
        budget_bytes: int, topk_fn: Callable[[Tensor, Tensor, Tensor, int], Tensor],
    ) -> Tensor:
        """Top-``k`` per query row of a long prefill, logits computed in row chunks within ``budget_bytes``.

        ``topk_fn(logits, row_starts, row_ends, k)`` is the top-k family's ``topk``. Delegates to the
        engine's :func:`~dsa_runtime.model.index_select.select_topk_ragged` (chunk sizing, per-chunk key
        range, one preallocated ``[T, k]`` int32 output), with this indexer's :meth:`logits_ragged`.
        Returns ``[T, k]`` int32 positions relative to ``ks``, ``-1`` padded.
        """
        from dsa_runtime.model.index_select import select_topk_ragged

        kernels = SimpleNamespace(indexer=self, topk=SimpleNamespace(topk=topk_fn))
        return select_topk_ragged(kernels, q8, w, k8, k_scale, ks, ke, k, budget_bytes=budget_bytes)
