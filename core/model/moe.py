"""Feed-forward blocks: the dense SwiGLU FFN (layers < first_k_dense_replace) and the DeepSeek MoE.

MoE: router logits ``x_fp32 @ Wg_fp32.T``, grouped ``noaux_tc`` selection through
``kernels.moe.route`` and the routed + shared experts through ``kernels.moe.experts`` (experts stay FP8 with
their block scales when the checkpoint is FP8). Under expert parallelism a rank holds its EP rank's experts
whole and :meth:`MoE.forward_ep` sends its tokens to their experts' ranks and back through
``kernels.moe_comm``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import EPGroup
from dsa_runtime.model.config import ModelConfig
from dsa_runtime.model.ops import swiglu_mlp
from dsa_runtime.model.weights import WeightSource


class DenseFFN:
    ep: EPGroup | None = None  # never expert-parallel

    def __init__(self, ws: WeightSource, prefix: str):
        self.w1 = ws.linear(f"{prefix}.gate_proj")
        self.w3 = ws.linear(f"{prefix}.up_proj")
        self.w2 = ws.linear(f"{prefix}.down_proj")

    def __call__(self, x: Tensor, kernels, out_dtype: torch.dtype | None = None) -> Tensor:
        """x ``[T, D]`` -> ``[T, D]`` in x's dtype, or fp32 with ``out_dtype`` (unrounded partial sums)."""
        return swiglu_mlp(x, self.w1, self.w3, self.w2, out_dtype)


class MoE:
    """gate ``[E, D]`` fp32, correction bias ``[E]`` fp32, routed ExpertWeights ``[E, ...]``, shared (E=1).

    ``tp`` (a :class:`~dsa_runtime.distributed.comm.TPContext`) with ``info.ep`` > 1: ``experts`` holds only this
    rank's ``E / ep`` experts (``ep`` is their :class:`EPGroup`) and the layer runs through :meth:`forward_ep`.
    """

    def __init__(self, ws: WeightSource, prefix: str, config: ModelConfig, fp32_sum: bool = False, tp=None):
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
        n = config.n_routed_experts
        self.ep: EPGroup | None = None
        start, end = 0, n
        if tp is not None and tp.info.ep > 1:
            start, end = tp.info.expert_range(n)
            self.ep = EPGroup(tp.info.ep_rank, tp.info.ep, n, tp.ep_group)
        # Token rows this rank's experts received (EP load figures); a device counter, so captured graphs add too.
        self.tokens_received = torch.zeros((), dtype=torch.int64, device=ws.device)
        self.experts = ws.experts([f"{prefix}.experts.{j}" for j in range(start, end)])
        self.shared = ws.experts([f"{prefix}.shared_experts"]) if config.n_shared_experts > 0 else None

    def __call__(self, x: Tensor, kernels, out_dtype: torch.dtype | None = None) -> Tensor:
        """x ``[T, D]`` -> ``[T, D]`` in x's dtype; with ``out_dtype`` float32 the experts' fp32 sum unrounded
        (a TP rank's partial sum)."""
        weights, ids = self._route(x, kernels)
        fp32 = out_dtype == torch.float32 or (out_dtype is None and self.fp32_sum and x.dtype != torch.float32)
        y = kernels.moe.experts(x, weights, ids, self.experts, self.shared,
                                out_dtype=torch.float32 if fp32 else torch.bfloat16)
        return y.to(out_dtype or x.dtype)

    def forward_ep(self, x: Tensor, kernels, out_dtype: torch.dtype) -> Tensor:
        """Expert parallelism: x ``[T, D]`` (this rank's share of the tokens; every rank of the EP group calls
        with the same T) -> ``[T, D]`` in ``out_dtype``: the routed experts' weighted sum over every EP rank
        plus the shared expert, summed in ``out_dtype`` (fp32: rounded once by the caller)."""
        ep = self.ep
        assert ep is not None
        weights, ids = self._route(x, kernels)
        sent = kernels.moe_comm.dispatch(x, ids, weights, ep)
        self.tokens_received += (sent.src_rank >= 0).sum()
        if sent.x.shape[0]:
            y = self._experts(sent.x, sent.topk_weights, sent.topk_ids, self.experts, kernels, out_dtype)
        else:  # no token routed here this step
            y = sent.x.new_zeros(sent.x.shape, dtype=out_dtype)
        out = kernels.moe_comm.combine(y, sent, ep)
        if self.shared is not None:
            ones = torch.ones(x.shape[0], 1, dtype=torch.float32, device=x.device)
            zero = torch.zeros(x.shape[0], 1, dtype=torch.int32, device=x.device)
            out = out + self._experts(x, ones, zero, self.shared, kernels, out_dtype)
        return out

    def _route(self, x: Tensor, kernels) -> tuple[Tensor, Tensor]:
        """Router logits ``x_fp32 @ Wg_fp32.T`` through ``kernels.moe.route``: weights and expert ids ``[T, top_k]``."""
        cfg = self.cfg
        return kernels.moe.route(
            x.float() @ self.gate.T, self.bias, top_k=cfg.num_experts_per_tok, n_group=cfg.n_group,
            topk_group=cfg.topk_group, routed_scaling_factor=cfg.routed_scaling_factor, renormalize=cfg.norm_topk_prob,
        )

    @staticmethod
    def _experts(x: Tensor, weights: Tensor, ids: Tensor, experts, kernels, out_dtype: torch.dtype) -> Tensor:
        fp32 = out_dtype == torch.float32
        y = kernels.moe.experts(x, weights, ids, experts, None, out_dtype=torch.float32 if fp32 else torch.bfloat16)
        return y.to(out_dtype)
