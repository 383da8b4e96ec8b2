"""Pair alignment for decode-sized batches in one Triton program (same result as :func:`.moe_align.align_pairs`).

At a few tokens the torch version's ~20 small launches cost more host time than the expert GEMMs cost the
GPU (eager decode is launch-bound). One program here does it all: it sorts the pairs by expert (a bitonic
``tl.sort`` of ``expert * BLOCK_P + pair``, so the order inside an expert is the pair order, as the stable
torch sort gives), counts pairs per expert with ``tl.histogram``, pads each expert's run to ``block_m`` rows
and writes the block -> expert map. Ids outside ``[0, E)`` (``-1``, or bad ids) are dropped like ``-1``; the
shared expert's pairs (one per token, expert ``E - 1`` of the addressed ones) are generated in the kernel, so
the caller launches nothing else. Nothing depends on the data's values on the host: CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dsa_runtime.plugins.cuda_hopper.triton.moe_align import ExpertBlocks, max_blocks_for

# Decode-sized batches only (113 tokens x (8 + 1) pairs): each power of two of the pair count is a kernel of its
# own (the sort's width is a constexpr), and a 2048- or 4096-wide bitonic sort takes seconds to compile, which a
# prefill of a new size would pay in the middle of serving; larger batches take the torch alignment (as exact).
MAX_PAIRS = 1024
MAX_EXPERTS = 1023


def fits(num_pairs: int, num_experts: int) -> bool:
    """Whether :func:`align_pairs_small` handles this many pairs and addressed experts."""
    return 0 < num_pairs <= MAX_PAIRS and num_experts <= MAX_EXPERTS


# Sizes are not specialised (divisibility by 16, == 1): a new token count must not compile a new kernel.
@triton.jit(do_not_specialize=["TK", "P", "E", "E_ROUTED", "ROWS", "MAX_BLOCKS"])
def _align_small(
    ids_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr, scratch_ptr,
    TK, P, E, E_ROUTED, ROWS, MAX_BLOCKS,
    BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, NB: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_P)
    e = tl.load(ids_ptr + offs, mask=offs < TK, other=-1)
    key = tl.where((e >= 0) & (e < E_ROUTED), e, E)  # dropped pairs (and the lanes past P) go to bucket E
    key = tl.where((offs >= TK) & (offs < P), E_ROUTED, key)  # the shared expert's pairs follow the routed ones
    counts = tl.histogram(key, NB)
    bins = tl.arange(0, NB)
    padded = tl.where(bins < E, (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M, 0)
    pad_end = tl.cumsum(padded, 0)
    tl.store(scratch_ptr + bins, pad_end - padded)
    tl.store(scratch_ptr + NB + bins, tl.cumsum(counts, 0) - counts)
    tl.store(num_padded_ptr, tl.sum(padded, 0))
    # Padding rows hold P (the kernels' "no pair" sentinel); written before the scatter below.
    for r0 in range(0, ROWS, BLOCK_R):
        r = r0 + tl.arange(0, BLOCK_R)
        tl.store(sorted_ptr + r, tl.full((BLOCK_R,), 0, tl.int32) + P, mask=r < ROWS)
    for b0 in range(0, MAX_BLOCKS, BLOCK_B):
        blk = b0 + tl.arange(0, BLOCK_B)
        before = (pad_end[None, :] <= (blk * BLOCK_M)[:, None]) & (bins[None, :] < E)
        expert = tl.sum(before.to(tl.int32), 1)
        tl.store(block_expert_ptr + blk, tl.where(expert < E, expert, -1), mask=blk < MAX_BLOCKS)
    tl.debug_barrier()  # the fill and the scratch table are visible to every thread before the scatter
    srt = tl.sort(key * BLOCK_P + offs)
    skey = srt // BLOCK_P
    pair = srt % BLOCK_P
    keep = skey < E
    start = tl.load(scratch_ptr + skey, mask=keep, other=0)
    raw = tl.load(scratch_ptr + NB + skey, mask=keep, other=0)
    tl.store(sorted_ptr + start + offs - raw, pair, mask=keep)


_WARMED: set[tuple] = set()


def _warm_every_width(device: torch.device, top_k: int, num_experts: int, block_m: int, shared: bool) -> None:
    """Compile every sort width this configuration can meet, on its first call outside a CUDA-graph capture.

    The sort width ``BLOCK_P`` (a power of two of the pair count) and ``BLOCK_B`` are constexprs: without this,
    the first step of each new size class (a prefill of a few more tokens than any before) would stall every
    request for the compile (0.4-2 s each on an H200). Here they are all compiled at once, at start-up when the
    engine's first forward runs (about 7 small kernels; Triton's disk cache makes later starts cheap)."""
    key = (str(device), top_k, num_experts, block_m, shared)
    if key in _WARMED or device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return
    _WARMED.add(key)
    per_token = top_k + int(shared)
    n_addr = num_experts + int(shared)
    width = 16
    while width <= MAX_PAIRS:
        for target in (width // 2 + 1, width):  # both ends of the class: BLOCK_B follows the block count
            tokens = -(-target // per_token)
            if tokens * per_token > width:
                tokens = width // per_token
            pairs = tokens * per_token
            if (pairs > width // 2 or width == 16) and tokens and fits(pairs, n_addr):
                align_pairs_small(torch.zeros(tokens, top_k, dtype=torch.int32, device=device), num_experts,
                                  block_m, shared=shared)
        width *= 2


def align_pairs_small(topk_ids: Tensor, num_experts: int, block_m: int, *, shared: bool) -> ExpertBlocks:
    """:func:`.moe_align.align_pairs` for ``topk_ids`` ``[T, k]`` int32 (+ one shared pair per token).

    Args:
        topk_ids: ``[T, k]`` int32 routed expert ids; anything outside ``[0, num_experts)`` is dropped.
        num_experts: routed experts. With ``shared`` the shared expert is expert ``num_experts`` and its pairs
            are ``T * k + t``.
        block_m: rows per block.
    """
    tokens, top_k = topk_ids.shape
    _warm_every_width(topk_ids.device, top_k, num_experts, block_m, shared)
    tk = tokens * top_k
    pairs = tk + (tokens if shared else 0)
    n_addr = num_experts + int(shared)
    if not fits(pairs, n_addr):
        raise ValueError(f"{pairs} pairs over {n_addr} experts is past the small-batch alignment's limits")
    dev = topk_ids.device
    max_blocks = max_blocks_for(pairs, n_addr, block_m)
    rows = max_blocks * block_m
    nb = max(16, triton.next_power_of_2(n_addr + 1))
    sorted_pairs = torch.empty(rows, dtype=torch.int32, device=dev)
    block_expert = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    num_padded = torch.empty(1, dtype=torch.int32, device=dev)
    scratch = torch.empty(2 * nb, dtype=torch.int32, device=dev)
    _align_small[(1,)](
        topk_ids, sorted_pairs, block_expert, num_padded, scratch,
        tk, pairs, n_addr, num_experts, rows, max_blocks,
        BLOCK_M=block_m, BLOCK_P=max(16, triton.next_power_of_2(pairs)), NB=nb, BLOCK_R=1024,
        BLOCK_B=max(16, min(64, triton.next_power_of_2(max_blocks))), num_warps=4,
    )
    return ExpertBlocks(sorted_pairs, block_expert, num_padded, pairs, block_m)
