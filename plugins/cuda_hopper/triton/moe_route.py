"""Fused DeepSeek ``noaux_tc`` routing in one Triton kernel (contract: ``MoEKernels.route``).

One program handles ``BLOCK_T`` tokens and all ``E`` experts of each (``E`` padded to a power of two with
``-inf``). Steps, all in registers: ``p = sigmoid(logits)``; ``b = p + bias``; per group the sum of its two
largest ``b`` (one if the group has a single expert); ``topk_group`` groups by that score; ``top_k`` experts
by ``b`` inside the kept groups; weights = the chosen ``p``, renormalised (0 when they sum to 0) and scaled.
Every selection is an ``argmax`` that keeps the lowest index among equals, so ties go to the lower index as
the contract says. Power-of-two groups are reduced as ``[T, G, group]`` tiles; other group sizes as column
ranges, one group at a time. The chosen ``p`` are recomputed from reloaded logits (bit-identical sigmoid).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _route_kernel(
    logits_ptr, bias_ptr, w_ptr, ids_ptr, T, E, stride_t, scale,
    GROUP_SIZE: tl.constexpr, N_GROUP: tl.constexpr, TOPK_GROUP: tl.constexpr, TOP_K: tl.constexpr,
    RENORM: tl.constexpr, RESHAPE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < T
    col_ok = cols < E
    x = tl.load(logits_ptr + rows[:, None] * stride_t + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                other=0.0).to(tl.float32)
    p = tl.sigmoid(x)
    bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.where(col_ok[None, :], p + bias[None, :], NEG_INF)
    group_of = cols // GROUP_SIZE
    gcols = tl.arange(0, BLOCK_G)

    # Group scores: the largest b of the group plus the largest of the rest (first argmax removed).
    if RESHAPE:  # power-of-two groups filling BLOCK_E: reduce [T, G, group] tiles along the group axis
        b3 = tl.reshape(b, (BLOCK_T, N_GROUP, GROUP_SIZE))
        m1 = tl.max(b3, axis=2)
        if GROUP_SIZE > 1:
            i1 = tl.argmax(b3, axis=2, tie_break_left=True)
            inner = tl.arange(0, GROUP_SIZE)
            m2 = tl.max(tl.where(inner[None, None, :] == i1[:, :, None], NEG_INF, b3), axis=2)
            gscore = m1 + m2
        else:
            gscore = m1
    else:
        gscore = tl.full((BLOCK_T, BLOCK_G), NEG_INF, tl.float32)
        for g in tl.static_range(N_GROUP):
            in_g = (group_of == g)[None, :] & col_ok[None, :]
            bg = tl.where(in_g, b, NEG_INF)
            m1 = tl.max(bg, axis=1)
            if GROUP_SIZE > 1:
                i1 = tl.argmax(bg, axis=1, tie_break_left=True)
                m2 = tl.max(tl.where(cols[None, :] == i1[:, None], NEG_INF, bg), axis=1)
                s = m1 + m2
            else:
                s = m1
            gscore = tl.where(gcols[None, :] == g, s[:, None], gscore)

    # Keep TOPK_GROUP groups: repeated argmax over a "taken" mask (never over a -inf sentinel alone).
    gvalid = gcols < N_GROUP
    kept = tl.zeros((BLOCK_T, BLOCK_G), tl.int32)
    for _ in tl.static_range(TOPK_GROUP):
        cand = tl.where(gvalid[None, :] & (kept == 0), gscore, NEG_INF)
        gi = tl.argmax(cand, axis=1, tie_break_left=True)
        kept = tl.where(gcols[None, :] == gi[:, None], 1, kept)
    if RESHAPE:
        keep_e = tl.reshape(tl.broadcast_to(kept[:, :, None], (BLOCK_T, N_GROUP, GROUP_SIZE)), (BLOCK_T, BLOCK_E))
    else:
        keep_e = tl.zeros((BLOCK_T, BLOCK_E), tl.int32)
        for g in tl.static_range(N_GROUP):
            kg = tl.sum(tl.where(gcols[None, :] == g, kept, 0), axis=1)
            keep_e = tl.where((group_of == g)[None, :] & (kg[:, None] > 0), 1, keep_e)
        keep_e = tl.where(col_ok[None, :], keep_e, 0)

    # Top-k experts by b among the kept groups' experts.
    kcols = tl.arange(0, BLOCK_K)
    chosen = tl.zeros((BLOCK_T, BLOCK_E), tl.int32)
    out_ids = tl.zeros((BLOCK_T, BLOCK_K), tl.int32)
    for j in tl.static_range(TOP_K):
        cand = tl.where((keep_e != 0) & (chosen == 0), b, NEG_INF)
        ei = tl.argmax(cand, axis=1, tie_break_left=True)
        hit = cols[None, :] == ei[:, None]
        chosen = tl.where(hit, 1, chosen)
        out_ids = tl.where(kcols[None, :] == j, ei[:, None], out_ids)
    # The chosen p: reload the chosen logits (L1/L2 hits) rather than reducing the tile once more per pick.
    kmask = row_ok[:, None] & (kcols < TOP_K)[None, :]
    x_sel = tl.load(logits_ptr + rows[:, None] * stride_t + out_ids, mask=kmask, other=0.0).to(tl.float32)
    out_w = tl.where(kmask, tl.sigmoid(x_sel), 0.0)
    if RENORM:
        total = tl.sum(out_w, axis=1)
        out_w = tl.where(total[:, None] > 0, out_w / total[:, None], 0.0)
    out_w = out_w * scale
    tl.store(w_ptr + rows[:, None] * TOP_K + kcols[None, :], out_w, mask=kmask)
    tl.store(ids_ptr + rows[:, None] * TOP_K + kcols[None, :], out_ids, mask=kmask)


def route(
    router_logits: Tensor,
    correction_bias: Tensor,
    *,
    top_k: int,
    n_group: int,
    topk_group: int,
    routed_scaling_factor: float,
    renormalize: bool = True,
    block_t: int | None = None,
    num_warps: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Grouped routing: ``[T, E]`` fp32 logits and ``[E]`` fp32 bias -> weights ``[T, top_k]`` fp32, ids int32."""
    if router_logits.dim() != 2:
        raise ValueError(f"router_logits must be [T, E], got shape {tuple(router_logits.shape)}")
    tokens, n_exp = router_logits.shape
    if n_exp % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"bad grouping: E={n_exp}, n_group={n_group}, topk_group={topk_group}")
    group_size = n_exp // n_group
    if not 1 <= top_k <= topk_group * group_size:
        raise ValueError(f"top_k={top_k} exceeds the {topk_group * group_size} experts of the kept groups")
    logits = router_logits.float().contiguous()
    bias = correction_bias.float().to(logits.device).contiguous()
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int32, device=logits.device)
    if tokens == 0:
        return weights, ids
    block_e = triton.next_power_of_2(n_exp)
    if block_t is None:  # keep the [BLOCK_T, BLOCK_E] tiles near 2K elements per program
        block_t = max(1, min(16, 2048 // block_e, triton.next_power_of_2(tokens)))
    grid = (triton.cdiv(tokens, block_t),)
    _route_kernel[grid](
        logits, bias, weights, ids, tokens, n_exp, logits.stride(0), float(routed_scaling_factor),
        GROUP_SIZE=group_size, N_GROUP=n_group, TOPK_GROUP=topk_group, TOP_K=top_k, RENORM=bool(renormalize),
        RESHAPE=block_e == n_exp and n_group == triton.next_power_of_2(n_group) and n_group > 1,
        BLOCK_T=block_t, BLOCK_E=block_e, BLOCK_G=max(2, triton.next_power_of_2(n_group)),
        BLOCK_K=max(2, triton.next_power_of_2(top_k)), num_warps=num_warps or 4,
    )
    return weights, ids
