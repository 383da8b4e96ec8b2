"""Partial DP attention: which attention group serves a sequence, and the token gather / scatter around the FFN.

With ``--dp D --enable-dp-attention`` each of the D attention groups runs attention (and holds KV cache
rows) for its own sequences only. A sequence belongs to group ``first_page % D``: stable for the request's
life (its first page never changes; after a preemption it is re-prefilled from scratch anyway).

Around every FFN / MoE, the groups' token rows meet: each group's rows are padded to a common row count
``pad`` (a multiple of ``tp``, e.g. 7 -> 8 on tp 8) with zero rows, all-gathered, run through the
TP-split FFN (partial sums all-reduced over every rank) and the group's own rows taken back. Padded rows
are never attention queries; any top-k buffer sized to the padded count carries ``-1`` rows for them.

Under expert parallelism a MoE layer does neither: each rank sends its own rows (its share of its attention
group's, when the group has several ranks) to the experts' ranks and takes their outputs back
(:func:`run_expert_parallel`); no rows of other groups are gathered and the MoE output is not all-reduced.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from dsa_runtime.distributed.comm import TPContext


def group_of(page_table: list[int], dp: int) -> int:
    """The attention group serving a sequence with this page table."""
    return page_table[0] % dp if dp > 1 else 0


def padded_rows(counts: list[int], multiple: int) -> int:
    """The common row count: the largest group's tokens rounded up to ``multiple`` (at least ``multiple``)."""
    top = max(max(counts), 1)
    return -(-top // multiple) * multiple


def run_ffn(ffn, x: Tensor, kernels, tp: TPContext | None) -> Tensor:
    """``ffn(x, kernels)`` with TP-split weights: partial sums (fp32 under ``reduce_dtype`` fp32, rounded to
    x's dtype once after the sum) all-reduced over every rank; under DP
    attention the groups' rows are gathered first and this group's rows returned. x ``[T, D]`` -> ``[T, D]``."""
    if tp is None or tp.world == 1:
        return ffn(x, kernels)
    if ffn.ep is not None:
        return run_expert_parallel(ffn, x, kernels, tp)
    part = tp.partial_dtype(x.dtype)  # fp32 partial sums, rounded once after the all-reduce (reduce fp32)
    if tp.info.dp == 1:
        return tp.all_reduce_world(ffn(x, kernels, out_dtype=part)).to(x.dtype)
    counts = tp.group_tokens
    assert counts is not None, "DP attention step without group token counts"
    pad = padded_rows(counts, tp.world)
    mine = x.shape[0]
    xp = torch.zeros(pad, x.shape[1], dtype=x.dtype, device=x.device)
    xp[:mine] = x
    parts = tp.all_gather_world(xp)
    a = tp.info.attn_size
    rows = torch.cat([parts[g * a] for g in range(tp.info.dp)])
    y = tp.all_reduce_world(ffn(rows, kernels, out_dtype=part))
    off = tp.info.dp_rank * pad
    return y[off:off + mine].to(x.dtype)


def run_expert_parallel(moe, x: Tensor, kernels, tp: TPContext) -> Tensor:
    """An expert-parallel MoE layer: x ``[T, D]`` (the rank's attention group's rows, T equal on every rank) ->
    ``[T, D]``. The ranks of an attention group hold the same rows: each sends its contiguous share (the rows
    padded with zeros to a multiple of the group's size) and the shares' outputs are all-gathered in the group.
    The experts' sum is fp32 under ``reduce_dtype`` fp32, rounded to x's dtype once."""
    part = tp.partial_dtype(x.dtype)
    a = tp.info.attn_size
    if a == 1:
        return moe.forward_ep(x, kernels, part).to(x.dtype)
    rows = x.shape[0]
    share = max(1, -(-rows // a))
    xp = torch.zeros(share * a, x.shape[1], dtype=x.dtype, device=x.device)
    xp[:rows] = x
    start = tp.info.attn_rank * share
    y = moe.forward_ep(xp[start:start + share], kernels, part).to(x.dtype)
    return tp.all_gather_attn(y, 0)[:rows]
