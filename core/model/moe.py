"""Feed-forward blocks: the dense SwiGLU FFN (layers < first_k_dense_replace) and the DeepSeek MoE.

MoE (spec section 6): router logits ``x_fp32 @ Wg_fp32.T``, grouped ``noaux_tc`` selection through
``kernels.moe.route`` and the routed + shared experts through ``kernels.moe.experts`` (experts stay FP8 with
their block scales when the checkpoint is FP8).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.model.config import ModelConfig
from dsa_runtime.model.ops import swiglu_mlp
from dsa_runtime.model.weights import WeightSource


class DenseFFN:
    def __init__(self, ws: WeightSource, prefix: str):
        self.w1 = ws.linear(f"{prefix}.gate_proj")
        self.w3 = ws.linear(f"{prefix}.up_proj")
        self.w2 = ws.linear(f"{prefix}.down_proj")

    def __call__(self, x: Tensor, kernels) -> Tensor:
        return swiglu_mlp(x, self.w1, self.w3, self.w2)


class MoE:
    """gate ``[E, D]`` fp32, correction bias ``[E]`` fp32, routed ExpertWeights ``[E, ...]``, shared (E=1)."""

    def __init__(self, ws: WeightSource, prefix: str, config: ModelConfig):
        self.cfg = config
        self.gate = ws.plain(f"{prefix}.gate.weight", torch.float32)
        bias_name = f"{prefix}.gate.e_score_correction_bias"
        self.bias = (
            ws.plain(bias_name, torch.float32) if ws.has(bias_name)
            else torch.zeros(config.n_routed_experts, dtype=torch.float32, device=ws.device)
        )
        self.experts = ws.experts([f"{prefix}.experts.{j}" for j in range(config.n_routed_experts)])
        self.shared = ws.experts([f"{prefix}.shared_experts"]) if config.n_shared_experts > 0 else None

    def __call__(self, x: Tensor, kernels) -> Tensor:
        cfg = self.cfg
        logits = x.float() @ self.gate.T
        weights, ids = kernels.moe.route(
            logits, self.bias, top_k=cfg.num_experts_per_tok, n_group=cfg.n_group, topk_group=cfg.topk_group,
            routed_scaling_factor=cfg.routed_scaling_factor, renormalize=cfg.norm_topk_prob,
        )
        return kernels.moe.experts(x, weights, ids, self.experts, self.shared).to(x.dtype)
