"""Process groups and the few collectives the sharded model calls.

:class:`TPContext` is what the model sees: its :class:`RankInfo`, and ``all_reduce_attn`` (after the
row-parallel ``o_proj`` and the vocab-parallel embedding), ``all_gather_attn`` (vocab-parallel logits),
``all_reduce_world`` (after the FFN / MoE down projections), and under expert parallelism ``ep_group`` (the
process group the ``moe_comm`` dispatch / combine run on). Every collective runs under the process
group's timeout (``ParallelConfig.timeout_s``), so a dead or stuck peer raises instead of hanging.
A ``ctrl`` gloo group carries the step's batch (Python objects) from rank 0, also on NCCL runs.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from dsa_runtime.distributed.parallel import ParallelConfig, RankInfo


@dataclass
class TPContext:
    """One rank's groups. ``attn_group`` None when the attention group is one rank (nothing to reduce);
    ``ep_group`` None without expert parallelism."""

    info: RankInfo
    world_group: Any = None
    attn_group: Any = None
    ctrl_group: Any = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    ep_group: Any = None
    # Per step under DP attention: every group's row count as run (null-padded to one count: the FFN gather's),
    # and, on rank 0, how many of those rows are real (metrics: which rows of the gathered FFN input count).
    group_tokens: list[int] | None = None
    real_tokens: list[int] | None = None
    # "fp32": row-parallel partial sums stay fp32 through the all-reduce (ParallelConfig.reduce_dtype).
    reduce_dtype: str = "fp32"

    def partial_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The dtype row-parallel layers return their partial sums in: fp32 under the fp32 reduce (rounded
        to ``model_dtype`` once, after the sum), else ``model_dtype``."""
        return torch.float32 if self.reduce_dtype == "fp32" else model_dtype

    @property
    def world(self) -> int:
        return self.info.world

    def all_reduce_attn(self, x: Tensor) -> Tensor:
        return _all_reduce(x, self.attn_group) if self.info.attn_size > 1 else x

    def all_reduce_world(self, x: Tensor) -> Tensor:
        return _all_reduce(x, self.world_group) if self.info.world > 1 else x

    def all_gather_attn(self, x: Tensor, dim: int) -> Tensor:
        """Concatenate every attention rank's ``x`` (same shape on each) along ``dim``, in rank order."""
        if self.info.attn_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.info.attn_size)]
        torch.distributed.all_gather(parts, x.contiguous(), group=self.attn_group)
        return torch.cat(parts, dim=dim)

    def all_gather_world(self, x: Tensor) -> list[Tensor]:
        """Every rank's ``x`` (same shape on each), in rank order."""
        parts = [torch.empty_like(x) for _ in range(self.info.world)]
        torch.distributed.all_gather(parts, x.contiguous(), group=self.world_group)
        return parts


def _all_reduce(x: Tensor, group: Any) -> Tensor:
    """Sum over ``group`` in ``x``'s dtype (fp32 partials: fp32 sums); bf16 on CPU is summed in fp32 (gloo)
    and rounded once."""
    if x.device.type == "cpu" and x.dtype == torch.bfloat16:
        y = x.float()
        torch.distributed.all_reduce(y, group=group)
        return y.to(x.dtype)
    torch.distributed.all_reduce(x, group=group)
    return x


def init_groups(parallel: ParallelConfig, rank: int, device: torch.device, init_method: str) -> TPContext:
    """``init_process_group`` (NCCL on CUDA, gloo on CPU) plus the attention groups and the gloo ctrl group.

    Every rank creates every attention group in the same order (``new_group`` is collective).
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=parallel.timeout_s)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=parallel.tp, timeout=timeout)
    info = parallel.rank_info(rank)
    attn_group = None
    for g in range(parallel.dp):
        ranks = list(range(g * parallel.attn_size, (g + 1) * parallel.attn_size))
        group = dist.new_group(ranks, timeout=timeout, backend=backend) if parallel.attn_size > 1 else None
        if rank in ranks:
            attn_group = group
    # EP groups: consecutive ranks; one group of every rank is the world group itself (no new communicator).
    ep_group = dist.group.WORLD if parallel.ep == parallel.tp > 1 else None
    for g in range(parallel.tp // parallel.ep if 1 < parallel.ep < parallel.tp else 0):
        ranks = list(range(g * parallel.ep, (g + 1) * parallel.ep))
        group = dist.new_group(ranks, timeout=timeout, backend=backend)
        if rank in ranks:
            ep_group = group
    # The step's batch travels as pickled objects: a CPU (gloo) group even when the math runs on NCCL. Idle
    # workers wait on it between steps, so its timeout is long; liveness is the watchdog's job.
    ctrl = dist.new_group(list(range(parallel.tp)), backend="gloo", timeout=datetime.timedelta(days=7))
    world_group = dist.group.WORLD
    return TPContext(info, world_group, attn_group, ctrl, device, reduce_dtype=parallel.reduce_dtype,
                     ep_group=ep_group)
