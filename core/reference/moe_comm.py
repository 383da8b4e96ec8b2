"""Reference expert-parallel dispatch / combine: exact row counts exchanged first, then ``all_to_all_single``.

Each token goes once to every rank holding one of its experts (DeepEP's normal mode): the per-destination row
counts travel first, so every buffer has its exact size. Works on gloo and NCCL. Not graph-capturable (the
counts are read on the host); for correctness, and for prefill-sized steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dsa_runtime.families import Dispatched, EPGroup


@dataclass
class _Handle:
    """Where each sent row came from, and the split sizes of both directions (host lists)."""

    send_row: Tensor  # [S] int64: the source token of each sent row, grouped by destination rank
    send_counts: list[int]
    recv_counts: list[int]
    tokens: int


def _a2a(x: Tensor, out_rows: int, out_splits: list[int], in_splits: list[int], group) -> Tensor:
    out = torch.empty((out_rows, *x.shape[1:]), dtype=x.dtype, device=x.device)
    torch.distributed.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
    return out


def plan_sends(topk_ids: Tensor, ep: EPGroup) -> tuple[Tensor, Tensor]:
    """``dest`` ``[T, k]`` (the EP rank of each expert, -1 for none) and ``sends`` ``[T, size]`` bool (token t
    goes to rank q)."""
    ids = topk_ids.long()
    dest = torch.where(ids >= 0, ids.div(ep.experts_per_rank, rounding_mode="floor"), -1)
    sends = torch.zeros(ids.shape[0], ep.size + 1, dtype=torch.bool, device=ids.device)
    sends.scatter_(1, torch.where(dest >= 0, dest, ep.size), True)  # column ``size`` collects the -1 ids
    return dest, sends[:, : ep.size]


def local_routing(topk_ids: Tensor, topk_weights: Tensor, dest: Tensor, to: Tensor, ep: EPGroup) -> tuple[Tensor, Tensor]:
    """For rows bound to rank ``to`` (``[..., 1]`` broadcast over k): local ids (-1 elsewhere) and weights (0)."""
    mine = dest == to
    ids = torch.where(mine, topk_ids.long() - to * ep.experts_per_rank, -1).to(torch.int32)
    return ids, torch.where(mine, topk_weights.float(), 0.0)


class ReferenceMoEComm:
    def dispatch(self, hidden: Tensor, topk_ids: Tensor, topk_weights: Tensor, ep: EPGroup) -> Dispatched:
        tokens = hidden.shape[0]
        dest, sends = plan_sends(topk_ids, ep)
        rank_of, row = sends.T.nonzero(as_tuple=True)  # grouped by destination, token order inside
        send_counts = sends.sum(0)
        ids, weights = local_routing(topk_ids[row], topk_weights[row], dest[row], rank_of[:, None], ep)
        meta = torch.cat([ids.long(), row[:, None]], dim=1)
        if ep.size == 1:
            handle = _Handle(row, [int(row.numel())], [int(row.numel())], tokens)
            src_rank = torch.zeros_like(row)
            return Dispatched(hidden[row], ids, weights, src_rank, row, handle)
        recv = torch.empty_like(send_counts)
        torch.distributed.all_to_all_single(recv, send_counts, group=ep.group)
        send_list, recv_list = send_counts.tolist(), recv.tolist()
        total = sum(recv_list)
        x = _a2a(hidden[row], total, recv_list, send_list, ep.group)
        w = _a2a(weights, total, recv_list, send_list, ep.group)
        meta = _a2a(meta, total, recv_list, send_list, ep.group)
        src_rank = torch.repeat_interleave(torch.arange(ep.size, device=hidden.device), recv.to(hidden.device))
        handle = _Handle(row, send_list, recv_list, tokens)
        return Dispatched(x, meta[:, :-1].to(torch.int32), w, src_rank, meta[:, -1], handle)

    def combine(self, expert_out: Tensor, dispatched: Dispatched, ep: EPGroup) -> Tensor:
        h: _Handle = dispatched.handle
        rows = expert_out
        if ep.size > 1:
            rows = _a2a(expert_out, int(h.send_row.numel()), h.send_counts, h.recv_counts, ep.group)
        out = torch.zeros(h.tokens, expert_out.shape[1], dtype=expert_out.dtype, device=expert_out.device)
        return out.index_add_(0, h.send_row, rows)
