"""Fixed-capacity expert-parallel dispatch / combine: one ``all_to_all_single`` of equal splits each way.

Every rank sends each peer a buffer of ``T`` rows (its whole batch: a token goes to a rank at most once, so
``T`` rows never drop one), with the token's local expert ids on the rows bound there and ``-1`` on the others
(padding rows). Shapes depend on ``T`` alone and nothing is read on the host, so a decode step stays
capturable in a CUDA graph (the collective inside it), as DeepEP's low-latency mode keeps fixed buffers. Cost:
``size * T`` rows each way per layer whatever the routing, so the engine's prefill-sized steps are better
served by the exact-count reference; the experts kernel skips the ``-1`` ids.

Pure ``torch.distributed``: the same code runs on gloo (CPU, where the conformance kit certifies it) and on
NCCL (the ``cuda_hopper`` plugin registers it as the ``nccl`` backend).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import Dispatched, EPGroup
from dsa_runtime.reference.moe_comm import local_routing, plan_sends


class TorchMoEComm:
    """Fixed capacity: ``T`` rows to every peer each way (see the module docstring)."""

    def dispatch(self, hidden: Tensor, topk_ids: Tensor, topk_weights: Tensor, ep: EPGroup) -> Dispatched:
        tokens, dim = hidden.shape
        dev = hidden.device
        dest, sends = plan_sends(topk_ids, ep)
        to = torch.arange(ep.size, device=dev).view(ep.size, 1, 1)
        ids, weights = local_routing(topk_ids.unsqueeze(0), topk_weights.unsqueeze(0), dest.unsqueeze(0), to, ep)
        row = torch.arange(tokens, device=dev)
        # [size, T, k + 1]: local ids, then the source row where the token is bound for that rank, else -1
        meta = torch.cat([ids.long(), torch.where(sends.T, row, -1).unsqueeze(-1)], dim=2)
        x = hidden.unsqueeze(0).expand(ep.size, tokens, dim).reshape(ep.size * tokens, dim)
        weights, meta = weights.reshape(ep.size * tokens, -1), meta.reshape(ep.size * tokens, -1)
        if ep.size > 1:
            x, weights, meta = (_exchange(t, ep) for t in (x, weights, meta))
        src_row = meta[:, -1]
        src_rank = torch.where(src_row >= 0, torch.arange(ep.size, device=dev).repeat_interleave(tokens), -1)
        return Dispatched(x, meta[:, :-1].to(torch.int32), weights, src_rank, src_row, tokens)

    def combine(self, expert_out: Tensor, dispatched: Dispatched, ep: EPGroup) -> Tensor:
        tokens: int = dispatched.handle
        rows = torch.where((dispatched.src_rank >= 0).unsqueeze(1), expert_out, 0)
        if ep.size > 1:
            rows = _exchange(rows, ep)
        return rows.view(ep.size, tokens, -1).sum(0)


def _exchange(x: Tensor, ep: EPGroup) -> Tensor:
    """Equal-split all-to-all: block q of ``x`` goes to rank q; block q of the result came from rank q."""
    out = torch.empty_like(x)
    torch.distributed.all_to_all_single(out, x.contiguous(), group=ep.group)
    return out
