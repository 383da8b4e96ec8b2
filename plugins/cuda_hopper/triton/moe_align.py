"""Sort (token, slot) pairs by expert and pad each expert's run to a multiple of ``block_m`` (pure torch).

Everything stays on the device and nothing synchronises with the host: the buffers are sized for the worst
case (every pair valid, each used expert wasting ``block_m - 1`` rows), and the kernels read the real padded
length from ``num_padded`` and return early past it. That keeps the expert launches capturable in a CUDA
graph and free of host round trips at decode.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class ExpertBlocks:
    """Pairs grouped per expert, in blocks of ``block_m`` rows.

    Attributes:
        sorted_pairs: ``[max_blocks * block_m]`` int32 pair indices (``t * k + j``, or the shared expert's
            extra pairs), each expert's pairs contiguous and in pair order; padding rows hold ``num_pairs``.
        block_expert: ``[max_blocks]`` int32 expert of each block; ``-1`` past the used blocks.
        num_padded: ``[1]`` int32 rows in use (a multiple of ``block_m``).
        num_pairs: pair count including invalid ones (the padding sentinel).
        block_m: rows per block.
    """

    sorted_pairs: Tensor
    block_expert: Tensor
    num_padded: Tensor
    num_pairs: int
    block_m: int

    @property
    def max_blocks(self) -> int:
        return self.block_expert.shape[0]


def max_blocks_for(num_pairs: int, num_experts: int, block_m: int) -> int:
    """Worst-case block count: every pair valid and ``min(pairs, experts)`` experts each padding a block."""
    worst = num_pairs + min(num_pairs, num_experts) * (block_m - 1)
    return max(1, -(-worst // block_m))


def align_pairs(expert_of_pair: Tensor, num_experts: int, block_m: int) -> ExpertBlocks:
    """Group pairs by expert.

    Args:
        expert_of_pair: ``[P]`` int32/int64 expert id of each pair; ``-1`` = skip (expert on another rank).
            Ids must be in ``[-1, num_experts)`` (the caller checks).
        num_experts: experts addressed (routed ones, plus one when the shared expert rides along).
        block_m: rows per block of the grouped GEMM.
    Returns:
        :class:`ExpertBlocks` on the device of ``expert_of_pair``.
    """
    dev = expert_of_pair.device
    n_pairs = expert_of_pair.shape[0]
    ids = expert_of_pair.long()
    key = torch.where(ids >= 0, ids, num_experts)  # invalid pairs sort last, into a dropped bucket
    # scatter_add, not bincount: CUDA bincount reads the max back to the host (a sync, and no graph capture).
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))
    padded = (counts + block_m - 1) // block_m * block_m
    # The invalid bucket gets no rows (a multiply, not an item assignment: no host copy under graph capture).
    padded = padded * (torch.arange(num_experts + 1, device=dev) < num_experts)
    pad_end = torch.cumsum(padded, 0)
    pad_start = pad_end - padded
    raw_start = torch.cumsum(counts, 0) - counts
    order = torch.argsort(key, stable=True)
    sorted_key = key[order]
    rank = torch.arange(n_pairs, device=dev) - raw_start[sorted_key]
    max_blocks = max_blocks_for(n_pairs, num_experts, block_m)
    rows = max_blocks * block_m
    # Invalid pairs land in one extra trailing row that is cut off: a scatter with no boolean indexing (no sync).
    dest = torch.where(sorted_key < num_experts, pad_start[sorted_key] + rank, rows)
    sorted_pairs = torch.full((rows + 1,), n_pairs, dtype=torch.int32, device=dev)
    sorted_pairs.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(max_blocks, device=dev) * block_m
    block_expert = torch.searchsorted(pad_end[:num_experts], block_start, right=True)
    block_expert = torch.where(block_expert < num_experts, block_expert, -1).to(torch.int32)
    return ExpertBlocks(
        sorted_pairs=sorted_pairs[:rows],
        block_expert=block_expert,
        num_padded=pad_end[num_experts - 1 : num_experts].to(torch.int32) if num_experts else torch.zeros(1, dtype=torch.int32, device=dev),
        num_pairs=n_pairs,
        block_m=block_m,
    )
