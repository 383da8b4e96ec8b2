"""Feed-forward blocks: the dense SwiGLU FFN (layers < first_k_dense_replace) and the DeepSeek MoE.

MoE: router logits ``x_fp32 @ Wg_fp32.T``, grouped ``noaux_tc`` selection through
``kernels.moe.route`` and the routed + shared experts through ``kernels.moe.experts`` (experts stay FP8 with
their block scales when the checkpoint is FP8).
"""

from __future__ import annotations

import inspect

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

    def __call__(self, x: Tensor, kernels, out_dtype: torch.dtype | None = None) -> Tensor:
        """x ``[T, D]`` -> ``[T, D]`` in x's dtype, or fp32 with ``out_dtype`` (unrounded partial sums)."""
        return swiglu_mlp(x, self.w1, self.w3, self.w2, out_dtype)


_TAKES_OUT_DTYPE: dict[object, bool] = {}


def takes_out_dtype(fn) -> bool:
    """Whether an ``experts`` implementation accepts ``out_dtype`` (older plugins return bf16 only)."""
    key = getattr(fn, "__func__", fn)
    got = _TAKES_OUT_DTYPE.get(key)
    if got is None:
        try:
            got = "out_dtype" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            got = False
        _TAKES_OUT_DTYPE[key] = got
    return got


class MoE:
    """gate ``[E, D]`` fp32, correction bias ``[E]`` fp32, routed ExpertWeights ``[E, ...]``, shared (E=1)."""

    def __init__(self, ws: WeightSource, prefix: str, config: ModelConfig, fp32_sum: bool = False):
        self.cfg = config
        # One process: round the experts' fp32 sum once (no bf16 rounding of each expert's output), as TP
        # ranks do with their fp32 partial sums; off by default (CPU: an fp32 down-projection GEMM).
        self.fp32_sum = fp32_sum
        self.gate = ws.plain(f"{prefix}.gate.weight", torch.float32)
        bias_name = f"{prefix}.gate.e_score_correction_bias"
        self.bias = (
            ws.plain(bias_name, torch.float32) if ws.has(bias_name)
            else torch.zeros(config.n_routed_experts, dtype=torch.float32, device=ws.device)
        )
        self.experts = ws.experts([f"{prefix}.experts.{j}" for j in range(config.n_routed_experts)])
        self.shared = ws.experts([f"{prefix}.shared_experts"]) if config.n_shared_experts > 0 else None

    def __call__(self, x: Tensor, kernels, out_dtype: torch.dtype | None = None) -> Tensor:
        """x ``[T, D]`` -> ``[T, D]`` in x's dtype; with ``out_dtype`` float32 the experts' fp32 sum unrounded
        (a TP rank's partial sum) when the backend takes ``out_dtype``, else its bf16 output as fp32."""
        cfg = self.cfg
        logits = x.float() @ self.gate.T
        weights, ids = kernels.moe.route(
            logits, self.bias, top_k=cfg.num_experts_per_tok, n_group=cfg.n_group, topk_group=cfg.topk_group,
            routed_scaling_factor=cfg.routed_scaling_factor, renormalize=cfg.norm_topk_prob,
        )
        fn = kernels.moe.experts
        if out_dtype is None and self.fp32_sum and x.dtype != torch.float32 and takes_out_dtype(fn):
            return fn(x, weights, ids, self.experts, self.shared, out_dtype=torch.float32).to(x.dtype)
        if out_dtype == torch.float32 and takes_out_dtype(fn):
            return fn(x, weights, ids, self.experts, self.shared, out_dtype=torch.float32)
        return fn(x, weights, ids, self.experts, self.shared).to(out_dtype or x.dtype)
