"""The DeepSeek V3 / V3.2 decoder stack: embedding, decoder layers (MLA + dense FFN or MoE), norm, head.

Weights come from a dict of HF-named tensors (see ``weights.py`` for what stays FP8). The MTP layer
(``model.layers.{num_hidden_layers}.*``) is kept aside in ``mtp_tensors``, and built as :attr:`DeepseekModel.nextn`
(the draft model of MTP speculative decoding, ``nextn.py``) when asked for.
The dense V3 family attends through the same absorbed kernels with every visible slot as its index set
(and dense MHA for prefill chunks up to ``mha_max_keys`` keys), so one code path serves both families.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.distributed.dp import run_ffn
from dsa_runtime.model.attention import AttnContext
from dsa_runtime.model.config import ModelConfig
from dsa_runtime.model.mla import MLA
from dsa_runtime.model.moe import DenseFFN, MoE
from dsa_runtime.model.nextn import NextNLayer
from dsa_runtime.model.ops import linear, rms_norm
from dsa_runtime.model.rope import Rope
from dsa_runtime.model.weights import WeightSource


class DecoderLayer:
    def __init__(self, ws: WeightSource, layer: int, config: ModelConfig, tp=None, moe_fp32_sum: bool = False):
        p = f"model.layers.{layer}"
        self.tp = tp
        self.index = layer
        self.eps = config.rms_norm_eps
        self.attn_norm = ws.norm(f"{p}.input_layernorm.weight")
        self.ffn_norm = ws.norm(f"{p}.post_attention_layernorm.weight")
        self.attn = MLA(ws, f"{p}.self_attn", config, tp)
        self.attn.reuse_topk = config.reuses_topk(layer)  # IndexCache "S" layer (never the MTP layer's)
        self.ffn = (MoE(ws, f"{p}.mlp", config, moe_fp32_sum, tp) if config.is_moe_layer(layer)
                    else DenseFFN(ws, f"{p}.mlp"))

    def __call__(self, h: Tensor, turn: Tensor, ctx: AttnContext, kv_cache: Tensor,
                 index_cache: Tensor | None) -> Tensor:
        """h ``[T, D]`` residual stream (model dtype) -> ``[T, D]``. Under TP the FFN / MoE weights are
        intermediate-split: :func:`run_ffn` all-reduces (and, with DP attention, gathers the groups' rows)."""
        h = h + self.attn(rms_norm(h, self.attn_norm, self.eps), turn, ctx, kv_cache, index_cache)
        return h + run_ffn(self.ffn, rms_norm(h, self.ffn_norm, self.eps), ctx.kernels, self.tp)


class DeepseekModel:
    """The main stack. ``layers[l]`` is callable (tests may wrap it to observe a layer's input/output).

    ``tp`` (a :class:`~dsa_runtime.distributed.comm.TPContext`, None on one process): the tensors are this
    rank's slices (``dsa_runtime.distributed.sharding``): local heads, intermediate and vocabulary rows.
    ``moe_fp32_sum``: the MoE rounds its experts' fp32 sum once (see :class:`MoE`), the single-process
    counterpart of TP's fp32 partial sums (``ParallelConfig.reduce_dtype``).
    ``nextn``: also build the checkpoint's first MTP layer as :attr:`nextn` (``KeyError`` when it is missing).
    ``release_tensors``: empty ``tensors`` and free each source tensor once it is built (see ``WeightSource``).
    """

    def __init__(self, config: ModelConfig, tensors: dict[str, Tensor], *, dtype: torch.dtype,
                 device: torch.device, tp=None, moe_fp32_sum: bool = False, nextn: bool = False,
                 release_tensors: bool = False):
        self.config, self.dtype, self.device, self.tp = config, dtype, device, tp
        n = config.num_hidden_layers
        mtp_prefix = f"model.layers.{n}."
        self.mtp_tensors = {k: v for k, v in tensors.items() if k.startswith(mtp_prefix)}
        main = {k: v for k, v in tensors.items() if not k.startswith(mtp_prefix)}
        if release_tensors:  # the caller gave its dict away: each source tensor is freed once built
            tensors.clear()
        ws = WeightSource(main, device, dtype, release=release_tensors)
        self.embed = ws.plain("model.embed_tokens.weight")
        self.layers = [DecoderLayer(ws, layer, config, tp, moe_fp32_sum) for layer in range(n)]
        self.norm = ws.norm("model.norm.weight")
        if ws.has("lm_head.weight"):
            self.head = ws.plain("lm_head.weight")
        elif config.tie_word_embeddings:
            self.head = self.embed
        else:
            raise KeyError("checkpoint tensor 'lm_head.weight' is missing")
        unused = sorted(set(main) - ws.used)
        if unused:
            raise ValueError(f"unexpected checkpoint tensor {unused[0]!r} ({len(unused)} unused in all)")
        self.nextn: NextNLayer | None = None
        if nextn:
            if not config.num_nextn_predict_layers or not self.mtp_tensors:
                raise KeyError("the checkpoint has no MTP (NextN) layer (num_nextn_predict_layers is 0 or its "
                               f"tensors model.layers.{n}.* are missing): speculative decoding needs one")
            self.nextn = NextNLayer(WeightSource(self.mtp_tensors, device, dtype), n, config, tp, moe_fp32_sum)
        self.rope = Rope(config, device)
        # Vocab-parallel embedding / head: this rank's rows [v0, v0 + rows); the head is padded to the
        # common part size so every rank's logits slice has one shape for the all-gather.
        self.vocab_start, self.vocab_part = 0, self.embed.shape[0]
        if tp is not None and tp.info.attn_size > 1:
            self.vocab_part = -(-config.vocab_size // tp.info.attn_size)
            self.vocab_start = min(tp.info.attn_rank * self.vocab_part, config.vocab_size)
            if self.head.shape[0] < self.vocab_part:
                pad = torch.zeros(self.vocab_part - self.head.shape[0], self.head.shape[1], dtype=self.head.dtype,
                                  device=device)
                self.head = torch.cat([self.head, pad])

    def embed_tokens(self, ids: Tensor) -> Tensor:
        """Token ids ``[T]`` -> ``[T, D]``; vocab-parallel: this rank's rows, zeros elsewhere, summed."""
        if self.tp is None or self.tp.info.attn_size == 1:
            return self.embed[ids]
        local = ids - self.vocab_start
        mine = (local >= 0) & (local < self.embed.shape[0])
        h = self.embed[local.clamp(0, max(self.embed.shape[0] - 1, 0))] * mine[:, None].to(self.embed.dtype)
        return self.tp.all_reduce_attn(h)

    def hidden_states(self, ctx: AttnContext, kv_pools: list[Tensor], index_pools: list[Tensor]) -> Tensor:
        """Run every layer over the step's tokens; returns the post-final-norm hidden ``[T, D]``."""
        step = ctx.step
        h = self.embed_tokens(step.token_ids)
        turn = self.rope.turns(step.positions)
        for i, layer in enumerate(self.layers):
            h = layer(h, turn, ctx, kv_pools[i], index_pools[i] if index_pools else None)
        return rms_norm(h, self.norm, self.config.rms_norm_eps)

    def draft_hidden_states(self, ctx: AttnContext, prev_hidden: Tensor, kv_pool: Tensor,
                            index_pool: Tensor | None) -> Tensor:
        """The NextN layer over the step's tokens (each the token after its row of ``prev_hidden`` ``[T, D]``)
        at the step's positions; returns its post-norm hidden ``[T, D]`` (feed :meth:`logits`)."""
        if self.nextn is None:
            raise RuntimeError("this model was built without its NextN layer (nextn=True)")
        step = ctx.step
        turn = self.rope.turns(step.positions)
        return self.nextn(self.embed_tokens(step.token_ids), prev_hidden, turn, ctx, kv_pool, index_pool)

    def logits(self, hidden: Tensor) -> Tensor:
        """``[n, D]`` -> float32 ``[n, vocab]`` (vocab-parallel: local slices all-gathered, then trimmed)."""
        logits = linear(hidden, self.head).float()
        if self.tp is None or self.tp.info.attn_size == 1:
            return logits
        return self.tp.all_gather_attn(logits, dim=-1)[:, : self.config.vocab_size]
