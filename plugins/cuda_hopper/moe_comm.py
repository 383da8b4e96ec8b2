"""Expert-parallel all-to-all backends of the Hopper platform (the ``moe_comm`` family).

* ``nccl``: the fixed-capacity ``all_to_all_single`` of :mod:`dsa_runtime.torch_kernels.moe_comm` on NCCL: equal
  splits, no host read, so a captured decode graph keeps the collective inside it.
* ``deepep``: DeepSeek's DeepEP intranode kernels (``deep_ep.Buffer.dispatch`` / ``combine``, NVLink), with
  ``num_worst_tokens`` set so the receive side has a fixed size and nothing is read on the host. Available only
  when the ``deep_ep`` module is installed. PyPI: ``sgl-deep-ep`` 0.1.2.post1 ships a cp311 wheel pinned to
  ``torch==2.14.1``; ``deep-ep`` 1.0.0 is a source release whose build needs NVSHMEM. DeepEP moves bf16 rows
  only: fp32 expert outputs are rounded to bf16 before the combine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dsa_runtime.backend import Backend
from dsa_runtime.capabilities import Capabilities
from dsa_runtime.families import Dispatched, EPGroup
from dsa_runtime.hw_probe import module_available

if TYPE_CHECKING:
    from torch import Tensor

NOT_COMM = dict.fromkeys(("indexer", "topk", "sparse_attn", "kv_quant", "moe"), "an all-to-all backend: moe_comm only")


def deepep_available() -> tuple[bool, str]:
    """``deep_ep`` is installed and an SM90 GPU is visible (neither is imported)."""
    if not module_available("deep_ep"):
        return False, ("deep_ep is not installed (pip install sgl-deep-ep, which needs torch 2.14.1, or build "
                       "deep-ep from source with NVSHMEM)")
    from dsa_runtime.plugins.cuda_hopper import on_sm90  # late: the platform module imports this one

    return on_sm90((True, "deep_ep installed"))


def moe_comm_backends() -> list[Backend]:
    caps = Capabilities(families=frozenset({"moe_comm"}), devices=frozenset({"cuda"}), not_claimed=NOT_COMM)
    return [
        Backend(name="nccl", capabilities=caps,
                kernels={"moe_comm": "dsa_runtime.torch_kernels.moe_comm:TorchMoEComm"}, platform="cuda_hopper",
                description="fixed-capacity NCCL all_to_all_single for expert parallelism (CUDA-graph safe)"),
        Backend(name="deepep", capabilities=caps,
                kernels={"moe_comm": "dsa_runtime.plugins.cuda_hopper.moe_comm:DeepEPMoEComm"},
                available=deepep_available, platform="cuda_hopper",
                description="DeepEP intranode dispatch / combine (NVLink), fixed worst-case receive size"),
    ]


class DeepEPMoEComm:
    """Adapter of ``deep_ep.Buffer`` (normal intranode mode) to the ``moe_comm`` contract; one buffer per group."""

    def __init__(self) -> None:
        self._buffers: dict[int, Any] = {}

    def _buffer(self, ep: EPGroup, row_bytes: int) -> Any:
        import deep_ep

        buf = self._buffers.get(id(ep.group))
        if buf is None:
            hints = (deep_ep.Buffer.get_dispatch_config(ep.size).get_nvl_buffer_size_hint(row_bytes, ep.size),
                     deep_ep.Buffer.get_combine_config(ep.size).get_nvl_buffer_size_hint(row_bytes, ep.size))
            buf = self._buffers[id(ep.group)] = deep_ep.Buffer(ep.group, num_nvl_bytes=max(hints))
        return buf

    def dispatch(self, hidden: Tensor, topk_ids: Tensor, topk_weights: Tensor, ep: EPGroup) -> Dispatched:
        import torch

        if hidden.dtype != torch.bfloat16:
            raise ValueError(f"DeepEP dispatches bf16 rows only, got {hidden.dtype}")
        buf = self._buffer(ep, hidden.shape[1] * hidden.element_size())
        idx = topk_ids.long()
        per_rank, _, per_expert, in_rank, _ = buf.get_dispatch_layout(idx, ep.num_experts)
        x, ids, weights, _, handle, _ = buf.dispatch(
            hidden, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert,
            topk_idx=idx, topk_weights=topk_weights.float(), num_worst_tokens=hidden.shape[0] * ep.size)
        # handle[0][i, me]: rows ranks 0..i sent here (a prefix sum), handle[3]: each row's source token.
        prefix = handle[0][:, ep.rank].long()
        rows = torch.arange(x.shape[0], device=x.device)
        valid = rows < prefix[-1]
        src_rank = torch.where(valid, torch.searchsorted(prefix, rows, right=True), -1)
        src_row = torch.where(valid, handle[3].long(), -1)
        ids = torch.where(valid[:, None], ids.long(), -1).to(torch.int32)
        return Dispatched(x, ids, torch.where(ids >= 0, weights.float(), 0.0), src_rank, src_row, handle)

    def combine(self, expert_out: Tensor, dispatched: Dispatched, ep: EPGroup) -> Tensor:
        import torch

        buf = self._buffer(ep, expert_out.shape[1] * 2)
        rows = torch.where((dispatched.src_rank >= 0)[:, None], expert_out, 0).to(torch.bfloat16)
        out, _, _ = buf.combine(rows, dispatched.handle)
        return out.to(expert_out.dtype)
