"""DeepSeek MoE for the ``torch`` backend: ``torch.topk`` routing and expert GEMMs grouped by expert.

Routing is fp32 like the reference; ``torch.topk`` replaces the stable full sorts, and only rows where a
tie straddles the cut (the k-th and (k+1)-th values equal, where ``topk``'s choice is arbitrary) are ranked
with a stable sort, which keeps the contract's rule that the lower index wins.

Experts: the (token, slot) pairs are sorted by expert once, each active expert runs two GEMMs over its
tokens (weights from ``expert_cache``, dequantised once) in bf16 for bf16 activations (fp32 for a float32
model), the SwiGLU activation is computed in fp32, and the weighted results are accumulated in fp32 with one
``index_add_``. An expert with at most ``FEW_ROWS`` tokens runs in fp32 when the experts are small enough
to keep an fp32 copy too (``expert_cache.small_fp32``): a bf16 GEMM has a fixed cost of ~15 us on CPU, which
dominates a decode step's few-token experts; it rounds ``h`` and the activation to bf16 as the bf16 path
does, so a token's result does not depend on its expert's token count. Output bf16, or fp32 with
``out_dtype`` (each expert's down projection unrounded: TP partial sums, ``moe_fp32_sum``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import ExpertWeights
from dsa_runtime.torch_kernels.expert_cache import compute_weights, small_fp32

FEW_ROWS = 8


def top_lower_first(x: Tensor, k: int) -> Tensor:
    """Indices ``[..., k]`` of the k largest entries of each row of ``x`` ``[R, n]``; lower index wins ties."""
    n = x.shape[-1]
    if k >= n:
        return torch.arange(n, device=x.device).expand(*x.shape[:-1], n)
    values, idx = torch.topk(x, k + 1, dim=-1)  # sorted, best first
    idx = idx[..., :k]
    tie = values[..., k - 1] == values[..., k]
    if bool(tie.any()):
        exact = torch.sort(x[tie], dim=-1, descending=True, stable=True).indices[..., :k]
        idx = idx.clone()
        idx[tie] = exact
    return idx


def _swiglu(x: Tensor, w13: Tensor, w2: Tensor, w2_f32: Tensor | None = None) -> Tensor:
    """Rows ``x`` ``[n, D]`` bf16 through one expert (``w13`` ``[2I, D]``, ``w2`` ``[D, I]``) -> ``[n, D]`` fp32.

    ``w2_f32`` (fp32 copy of ``w2``): the down projection's output is not rounded to bf16 (the activation
    is rounded to w2's dtype first, as in the bf16 GEMM): a TP rank's partial sum stays exact up to fp32
    order (the CPU has no bf16 GEMM with an fp32 output)."""
    inter = w13.shape[0] // 2
    h = (x @ w13.T).float()
    act = torch.nn.functional.silu(h[:, :inter]).mul_(h[:, inter:])
    if w2_f32 is not None:
        return act.to(w2.dtype).float() @ w2_f32.T
    return (act.to(w2.dtype) @ w2.T).float()


def _swiglu_few(x: Tensor, w13: Tensor, w2: Tensor, exact: bool) -> Tensor:
    """:func:`_swiglu` of a bf16 model through fp32 copies (few rows: fp32 GEMVs are faster on CPU), with the
    bf16 path's roundings (``h`` and the activation to bf16; the output too unless ``exact``), so a token's
    result does not depend on how many tokens its expert got in the step (batch composition, DP groups)."""
    inter = w13.shape[0] // 2
    h = (x @ w13.T).to(torch.bfloat16).float()
    act = torch.nn.functional.silu(h[:, :inter]).mul_(h[:, inter:]).to(torch.bfloat16).float()
    y = act @ w2.T
    return y if exact else y.to(torch.bfloat16).float()


class TorchMoE:
    """:class:`dsa_runtime.families.MoEKernels` for CPU."""

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
        """Grouped ``noaux_tc`` routing: ``weights`` ``[T, top_k]`` fp32 and ``ids`` ``[T, top_k]`` int32."""
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
        if topk_group < n_group:
            grouped = biased.view(tokens, n_group, group_size)
            group_scores = grouped.topk(min(2, group_size), dim=-1).values.sum(dim=-1)  # [T, G]
            kept = top_lower_first(group_scores, topk_group)
            dropped = torch.ones(tokens, n_group, dtype=torch.bool, device=p.device).scatter_(1, kept, False)
            choose = grouped.masked_fill(dropped[:, :, None], float("-inf")).view(tokens, n_exp)
        else:
            choose = biased
        ids = top_lower_first(choose, top_k)
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
        """``out[t] = sum_j w[t, j] * E_{ids[t, j]}(x[t]) + shared(x[t])``: ``[T, D]`` bf16 (``out_dtype``
        float32: the fp32 accumulation unrounded, each expert's down projection too, for TP partial sums),
        fp32 accumulation."""
        n_exp = experts.w13.shape[0]
        ids = topk_ids.to(device=x.device, dtype=torch.int64)
        if ids.numel() and (int(ids.min()) < -1 or int(ids.max()) >= n_exp):
            raise ValueError(f"expert ids must be -1 or in [0, {n_exp})")
        dtype = torch.float32 if x.dtype == torch.float32 else torch.bfloat16
        xc = x.to(dtype)
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
        flat = ids.reshape(-1)
        pairs = torch.nonzero(flat >= 0).squeeze(1)
        few = dtype != torch.float32 and small_fp32(experts)
        exact = out_dtype == torch.float32 and dtype != torch.float32  # fp32 down-projection outputs
        if pairs.numel():
            w13, w2 = compute_weights(experts, dtype)
            w13_f, w2_f = compute_weights(experts, torch.float32) if few or exact else (w13, w2)
            by_expert, order = torch.sort(flat[pairs], stable=True)
            pairs = pairs[order]
            tok = pairs // ids.shape[1]
            xs = xc.index_select(0, tok)
            xs_f = xs.float() if few else xs
            ys = torch.empty(pairs.numel(), x.shape[1], dtype=torch.float32, device=x.device)
            start = 0
            for e, count in enumerate(torch.bincount(by_expert, minlength=n_exp).tolist()):
                if count:
                    end = start + count
                    if few and count <= FEW_ROWS:
                        ys[start:end] = _swiglu_few(xs_f[start:end], w13_f[e], w2_f[e], exact)
                    else:
                        ys[start:end] = _swiglu(xs[start:end], w13[e], w2[e], w2_f[e] if exact else None)
                    start = end
            ys.mul_(topk_weights.to(device=x.device, dtype=torch.float32).reshape(-1)[pairs, None])
            out.index_add_(0, tok, ys)
        if shared is not None:
            if dtype != torch.float32 and x.shape[0] <= FEW_ROWS and small_fp32(shared):
                s13, s2 = compute_weights(shared, torch.float32)
                out += _swiglu_few(xc.float(), s13[0], s2[0], exact)
            else:
                s13, s2 = compute_weights(shared, dtype)
                s2f = compute_weights(shared, torch.float32)[1][0] if exact else None
                out += _swiglu(xc, s13[0], s2[0], s2f)
        return out if out_dtype == torch.float32 else out.to(torch.bfloat16)
