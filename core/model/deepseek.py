"""The DeepSeek V3 / V3.2 decoder stack: embedding, decoder layers (MLA + dense FFN or MoE), norm, head.

Weights come from a dict of HF-named tensors (see ``weights.py`` for what stays FP8). The MTP layer
(``model.layers.{num_hidden_layers}.*``) is kept aside in ``mtp_tensors``; it is not run for generation.
The dense V3 family attends through the same absorbed kernels with every visible slot as its index set
(and dense MHA for prefill chunks up to ``mha_max_keys`` keys), so one code path serves both families.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.model.attention import AttnContext
from dsa_runtime.model.config import ModelConfig
from dsa_runtime.model.mla import MLA
from dsa_runtime.model.moe import DenseFFN, MoE
from dsa_runtime.model.ops import linear, rms_norm
from dsa_runtime.model.rope import Rope
from dsa_runtime.model.weights import WeightSource


class DecoderLayer:
    def __init__(self, ws: WeightSource, layer: int, config: ModelConfig):
        p = f"model.layers.{layer}"
        self.index = layer
        self.eps = config.rms_norm_eps
        self.attn_norm = ws.plain(f"{p}.input_layernorm.weight")
        self.ffn_norm = ws.plain(f"{p}.post_attention_layernorm.weight")
        self.attn = MLA(ws, f"{p}.self_attn", config)
        self.ffn = MoE(ws, f"{p}.mlp", config) if config.is_moe_layer(layer) else DenseFFN(ws, f"{p}.mlp")

    def __call__(self, h: Tensor, cos: Tensor, sin: Tensor, ctx: AttnContext, kv_cache: Tensor,
                 index_cache: Tensor | None) -> Tensor:
        """h ``[T, D]`` residual stream (model dtype) -> ``[T, D]``."""
        h = h + self.attn(rms_norm(h, self.attn_norm, self.eps), cos, sin, ctx, kv_cache, index_cache)
        return h + self.ffn(rms_norm(h, self.ffn_norm, self.eps), ctx.kernels)


class DeepseekModel:
    """The main stack. ``layers[l]`` is callable (tests may wrap it to observe a layer's input/output)."""

    def __init__(self, config: ModelConfig, tensors: dict[str, Tensor], *, dtype: torch.dtype,
                 device: torch.device):
        self.config, self.dtype, self.device = config, dtype, device
        n = config.num_hidden_layers
        mtp_prefix = f"model.layers.{n}."
        self.mtp_tensors = {k: v for k, v in tensors.items() if k.startswith(mtp_prefix)}
        main = {k: v for k, v in tensors.items() if not k.startswith(mtp_prefix)}
        ws = WeightSource(main, device, dtype)
        self.embed = ws.plain("model.embed_tokens.weight")
        self.layers = [DecoderLayer(ws, layer, config) for layer in range(n)]
        self.norm = ws.plain("model.norm.weight")
        if ws.has("lm_head.weight"):
            self.head = ws.plain("lm_head.weight")
        elif config.tie_word_embeddings:
            self.head = self.embed
        else:
            raise KeyError("checkpoint tensor 'lm_head.weight' is missing")
        unused = sorted(set(main) - ws.used)
        if unused:
            raise ValueError(f"unexpected checkpoint tensor {unused[0]!r} ({len(unused)} unused in all)")
        self.rope = Rope(config, device)

    def hidden_states(self, ctx: AttnContext, kv_pools: list[Tensor], index_pools: list[Tensor]) -> Tensor:
        """Run every layer over the step's tokens; returns the post-final-norm hidden ``[T, D]``."""
        step = ctx.step
        h = self.embed[step.token_ids]
        cos, sin = self.rope.cos_sin(step.positions)
        for i, layer in enumerate(self.layers):
            h = layer(h, cos, sin, ctx, kv_pools[i], index_pools[i] if index_pools else None)
        return rms_norm(h, self.norm, self.config.rms_norm_eps)

    def logits(self, hidden: Tensor) -> Tensor:
        """``[n, D]`` -> float32 ``[n, vocab]``."""
        return linear(hidden, self.head).float()
