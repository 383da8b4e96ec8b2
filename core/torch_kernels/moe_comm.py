"""Fixed-capacity expert-parallel dispatch / combine: one ``all_to_all_single`` of equal splits each way.

Every rank sends each peer a buffer of ``T`` rows (its whole batch: a token goes to a rank at most once, so
``T`` rows never drop one), with the token's local expert ids on the rows bound there and ``-1`` on the others
(padding rows). Shapes depend on ``T`` alone and nothing is read on the host, so a decode step stays
capturable in a CUDA graph (the collective inside it), as DeepEP's low-latency mode keeps fixed buffers. Cost:
``size * T`` rows each way per layer whatever the routing (the experts kernel skips the ``-1`` ids), so above
:data:`FIXED_MAX_ROWS` tokens, outside a graph capture (prefill chunks), the exact-count exchange of the
reference runs instead, as SGLang's DeepEP ``auto`` mode takes the normal kernels for prefill.

Pure ``torch.distributed``: the same code runs on gloo (CPU, where the conformance kit certifies it) and on
NCCL (the ``cuda_hopper`` plugin registers it as the ``nccl`` backend).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import Dispatched, EPGroup
from dsa_runtime.reference.moe_comm import ReferenceMoEComm, local_routing, plan_sends

FIXED_MAX_ROWS = 256  # decode batches (graph buckets) stay below; a prefill chunk's size x T rows would not fit


class TorchMoEComm:
    """Fixed capacity: ``T`` rows to every peer each way up to :data:`FIXED_MAX_ROWS` tokens (or while a CUDA
    graph is being captured), exact counts above (see the module docstring)."""

    exact = ReferenceMoEComm()

    def dispatch(self, hidden: Tensor, topk_ids: Tensor, topk_weights: Tensor, ep: EPGroup) -> Dispatched:
        tokens, dim = hidden.shape
        if tokens > FIXED_MAX_ROWS and not (hidden.is_cuda and torch.cuda.is_current_stream_capturing()):
            return self.exact.dispatch(hidden, topk_ids, topk_weights, ep)
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
        if not isinstance(dispatched.handle, int):  # dispatched with exact counts
            return self.exact.combine(expert_out, dispatched, ep)
        tokens = dispatched.handle
        rows = torch.where((dispatched.src_rank >= 0).unsqueeze(1), expert_out, 0)
        if ep.size > 1:
            rows = _exchange(rows, ep)
        return rows.view(ep.size, tokens, -1).sum(0)


def _exchange(x: Tensor, ep: EPGroup) -> Tensor:
    """Equal-split all-to-all: block q of ``x`` goes to rank q; block q of the result came from rank q."""
    out = torch.empty_like(x)
    torch.distributed.all_to_all_single(out, x.contiguous(), group=ep.group)
    return out
