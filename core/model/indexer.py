"""The lightning indexer of one layer: index keys for the cache, queries for top-k.

Every new token's key is rotated, FP8-quantised and written to the index-K cache (even when the sequence is
short enough to attend densely). Queries are quantised only when some sequence of the step
needs a sparse selection.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dsa_runtime.model.ops import layer_norm, linear
from dsa_runtime.model.rope import apply_neox
from dsa_runtime.model.weights import WeightSource


@dataclass
class IndexerQuery:
    """Per-token indexer queries of a step: q8 ``[T, n_heads, 128]`` e4m3, weights ``[T, n_heads]`` fp32."""

    q8: Tensor
    weights: Tensor


class Indexer:
    """Weights: wq_b ``[n*128, q_lora]``, wk ``[128, D]`` (model dtype), k_norm (LayerNorm, fp32 weight
    and bias), weights_proj ``[n, D]`` fp32. Rope turns the FIRST rope_dim dims of q and k, half-split pairs
    (i, i + rope_dim / 2): the opposite of MLA's."""

    def __init__(self, ws: WeightSource, prefix: str, n_heads: int, head_dim: int, rope_dim: int, eps: float):
        self.n_heads, self.head_dim, self.rope_dim, self.eps = n_heads, head_dim, rope_dim, eps
        self.wq_b = ws.linear(f"{prefix}.wq_b")
        self.wk = ws.linear(f"{prefix}.wk")
        self.k_norm_w = ws.plain(f"{prefix}.k_norm.weight", torch.float32)
        self.k_norm_b = ws.plain(f"{prefix}.k_norm.bias", torch.float32)
        self.weights_proj = ws.plain(f"{prefix}.weights_proj.weight", torch.float32)

    def write_keys(self, x: Tensor, turn: Tensor, kernels, index_cache: Tensor, locs: Tensor,
                   scale_fmt: str) -> None:
        """Compute ``k = rope(k_norm(wk x))``, quantise (Hadamard + FP8) and store it at the cache locations ``locs``."""
        k = layer_norm(linear(x, self.wk), self.k_norm_w, self.k_norm_b, self.eps).to(x.dtype)
        k8, k_scale = kernels.indexer.quantize_k(apply_neox(k, turn), scale_fmt=scale_fmt)
        kernels.kv_quant.store_index_k(index_cache, locs, k8, k_scale)

    def queries(self, x: Tensor, qr: Tensor, turn: Tensor, kernels, scale_fmt: str) -> IndexerQuery:
        """Queries from MLA's ``q_norm`` output ``qr`` ``[T, q_lora]``; head weights from ``x`` in fp32."""
        q = linear(qr, self.wq_b).view(qr.shape[0], self.n_heads, self.head_dim)
        head_w = x.float() @ self.weights_proj.T
        q8, w = kernels.indexer.quantize_q(apply_neox(q, turn), head_w, scale_fmt=scale_fmt)
        return IndexerQuery(q8, w)
