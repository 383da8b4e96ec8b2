"""Reference DeepSeek MoE: grouped ``noaux_tc`` routing and SwiGLU experts.

Routing is in fp32; ties (equal biased scores, equal group scores) go to the lower index, by stable
descending sorts. Experts run in fp32 on weights dequantized with their 128x128 block scales; the activations
are *not* FP8-quantized (the reference is the exact math, GPU kernels add that rounding). Output is bf16.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import ExpertWeights
from dsa_runtime.reference.fp8 import block_dequant_weight


def _top_indices(x: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` largest entries of each row, lower index first among equals."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]


def _expert_weights_fp32(experts: ExpertWeights, e: int) -> tuple[Tensor, Tensor]:
    """Expert ``e``'s ``w13`` ``[2I, D]`` and ``w2`` ``[D, I]`` in fp32 (block-dequantized when FP8)."""
    if experts.is_fp8:
        if experts.w2_scale is None:
            raise ValueError("FP8 experts need both w13_scale and w2_scale")
        return (
            block_dequant_weight(experts.w13[e], experts.w13_scale[e]),
            block_dequant_weight(experts.w2[e], experts.w2_scale[e]),
        )
    return experts.w13[e].float(), experts.w2[e].float()


def _swiglu(x: Tensor, w13: Tensor, w2: Tensor) -> Tensor:
    """``w2 @ (silu(w1 @ x) * (w3 @ x))`` for rows of ``x`` ``[n, D]`` fp32 -> ``[n, D]`` fp32."""
    inter = w13.shape[0] // 2
    h = x @ w13.T  # [n, 2I]: gate (w1) then up (w3)
    return (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]) @ w2.T


class ReferenceMoE:
    """Plain-PyTorch implementation of :class:`dsa_runtime.families.MoEKernels`."""

    def route(
        self,
        router_logits: Tensor,
        correction_bias: Tensor,
        *,
        top_k: int,
        n_group: int,
        topk_group: int,
        routed_scaling_factor: float,
        renormalize: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """Grouped routing: ``weights`` ``[T, top_k]`` fp32 and ``ids`` ``[T, top_k]`` int32, best first.

        Requires ``E % n_group == 0``, ``1 <= topk_group <= n_group`` and ``top_k <= topk_group * E / n_group``.
        A group of a single expert scores that expert alone (there is no second one to add). When
        ``renormalize`` and the chosen ``p`` sum to 0 (all sigmoids underflowed) the weights are 0, not NaN.
        """
        tokens, n_exp = router_logits.shape
        if n_exp % n_group or not 1 <= topk_group <= n_group:
            raise ValueError(f"bad grouping: E={n_exp}, n_group={n_group}, topk_group={topk_group}")
        group_size = n_exp // n_group
        if not 1 <= top_k <= topk_group * group_size:
            raise ValueError(
                f"top_k={top_k} exceeds the {topk_group * group_size} experts of the kept groups"
            )
        p = torch.sigmoid(router_logits.float())
        biased = p + correction_bias.float().to(p.device)  # for choosing only
        grouped = biased.view(tokens, n_group, group_size)
        group_scores = grouped.topk(min(2, group_size), dim=-1).values.sum(dim=-1)  # [T, G]
        kept_groups = _top_indices(group_scores, topk_group)
        group_mask = torch.zeros(tokens, n_group, dtype=torch.bool, device=p.device)
        group_mask.scatter_(1, kept_groups, True)
        expert_mask = group_mask.repeat_interleave(group_size, dim=1)
        ids = _top_indices(biased.masked_fill(~expert_mask, float("-inf")), top_k)
        weights = torch.gather(p, 1, ids)  # the unbiased sigmoid of the chosen experts
        if renormalize:
            total = weights.sum(dim=-1, keepdim=True)
            weights = torch.where(total > 0, weights / total, 0.0)
        return weights * routed_scaling_factor, ids.to(torch.int32)

    def experts(
        self,
        x: Tensor,
        topk_weights: Tensor,
        topk_ids: Tensor,
        experts: ExpertWeights,
        shared: ExpertWeights | None = None,
        *,
        out_dtype: torch.dtype | None = None,
    ) -> Tensor:
        """``out[t] = sum_j w[t, j] * E_{ids[t, j]}(x[t]) + shared(x[t])``: ``[T, D]`` bf16 (fp32 unrounded
        with ``out_dtype`` float32, a TP rank's partial sum), fp32 inside.

        An id of ``-1`` (expert held by another rank) contributes nothing; any other id outside ``[0, E)`` is
        an error. A token listing the same expert twice gets both terms.
        """
        n_exp = experts.w13.shape[0]
        ids = topk_ids.long().to(x.device)
        if bool(((ids < -1) | (ids >= n_exp)).any()):
            raise ValueError(f"expert ids must be -1 or in [0, {n_exp})")
        xf = x.float()
        out = torch.zeros_like(xf)
        weights = topk_weights.float().to(x.device)
        for e in torch.unique(ids[ids >= 0]).tolist():
            tok, slot = torch.nonzero(ids == e, as_tuple=True)
            w13, w2 = _expert_weights_fp32(experts, e)
            y = _swiglu(xf[tok], w13, w2) * weights[tok, slot, None]
            out.index_add_(0, tok, y)
        if shared is not None:
            w13, w2 = _expert_weights_fp32(shared, 0)
            out += _swiglu(xf, w13, w2)
        return out if out_dtype == torch.float32 else out.to(torch.bfloat16)
