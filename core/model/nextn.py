"""The NextN (multi-token prediction) layer of DeepSeek V3 / V3.2: the draft model of MTP speculative decoding.

Checkpoint layer ``model.layers.{num_hidden_layers}`` holds ``enorm``, ``hnorm`` (RMSNorm ``[D]``), ``eh_proj``
(``[D, 2D]``, bf16), one full decoder layer (MLA, V3.2's indexer, MoE) and ``shared_head.norm``; its
``embed_tokens`` and ``shared_head.head`` equal the main model's, so the main ones are used (a checkpoint may
omit the copies). One draft step at position ``q`` reads the main model's post-final-norm hidden state
``h_q`` (the one that predicts token ``q + 1``) and the embedding of token ``q + 1``, and predicts token
``q + 2``::

    z = eh_proj(concat[enorm(embed(x_{q+1})), hnorm(h_q)])    # embedding half first (the engines' order)
    g = shared_head.norm(decoder_layer(z))                   # RoPE at position q, its own KV / index-K rows
    logits = head(g)

Chained draft steps feed ``g`` back in place of ``h`` (as SGLang and vLLM do). The layer caches its MLA and
index-K rows in the KV cache's extra (draft) pools at the same cache locations as the main stack.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.model.attention import AttnContext
from dsa_runtime.model.config import ModelConfig
from dsa_runtime.model.ops import linear, rms_norm
from dsa_runtime.model.weights import WeightSource


class NextNLayer:
    """One MTP layer. ``layer`` is its checkpoint index (``num_hidden_layers + k``)."""

    def __init__(self, ws: WeightSource, layer: int, config: ModelConfig, tp=None, moe_fp32_sum: bool = False):
        from dsa_runtime.model.deepseek import DecoderLayer

        p = f"model.layers.{layer}"
        self.eps = config.rms_norm_eps
        self.enorm = ws.norm(f"{p}.enorm.weight")
        self.hnorm = ws.norm(f"{p}.hnorm.weight")
        self.eh_proj = ws.plain(f"{p}.eh_proj.weight")
        self.block = DecoderLayer(ws, layer, config, tp, moe_fp32_sum)
        self.norm = ws.norm(f"{p}.shared_head.norm.weight")
        for shared in (f"{p}.embed_tokens.weight", f"{p}.shared_head.head.weight"):
            if ws.has(shared):
                ws.raw(shared)  # the main model's embedding / head serve (identical copies)

    def __call__(self, embedded: Tensor, prev_hidden: Tensor, turn: Tensor, ctx: AttnContext,
                 kv_cache: Tensor, index_cache: Tensor | None) -> Tensor:
        """``embedded`` (the next tokens' embeddings) and ``prev_hidden`` ``[T, D]`` (model dtype) -> the draft's
        post-norm hidden ``[T, D]``; writes the layer's cache rows at the step's cache locations."""
        e = rms_norm(embedded, self.enorm, self.eps)
        h = rms_norm(prev_hidden.to(e.dtype), self.hnorm, self.eps)
        z = linear(torch.cat([e, h], dim=-1), self.eh_proj)
        return rms_norm(self.block(z, turn, ctx, kv_cache, index_cache), self.norm, self.eps)
