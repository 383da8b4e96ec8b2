"""Host-independent pair alignment of the Triton MoE (pure torch, runs on CPU)."""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.plugins.cuda_hopper.triton.moe_align import align_pairs, max_blocks_for


@pytest.mark.parametrize(("pairs", "experts", "block_m", "p_neg"), [(37, 5, 4, 0.2), (200, 64, 16, 0.1), (9, 3, 16, 1.0), (1, 1, 16, 0.0)])
def test_every_valid_pair_once_in_its_experts_blocks(pairs, experts, block_m, p_neg):
    gen = torch.Generator().manual_seed(pairs + experts)
    ids = torch.randint(0, experts, (pairs,), generator=gen, dtype=torch.int32)
    ids = torch.where(torch.rand(pairs, generator=gen) < p_neg, -1, ids)
    b = align_pairs(ids, experts, block_m)
    assert b.max_blocks == max_blocks_for(pairs, experts, block_m)
    rows = b.sorted_pairs.view(-1, block_m)
    used = int(b.num_padded)
    valid = ids >= 0
    counts = torch.bincount(ids[valid].long(), minlength=experts)
    assert used == int(((counts + block_m - 1) // block_m * block_m).sum())
    assert bool((b.sorted_pairs[used:] == pairs).all())  # nothing past the used rows
    seen = []
    for blk in range(b.max_blocks):
        e = int(b.block_expert[blk])
        if blk * block_m >= used:
            assert e == -1
            continue
        real = rows[blk][rows[blk] < pairs]
        assert real.numel() > 0, "a used block holds at least one pair"
        assert bool((ids[real.long()] == e).all())
        seen += real.tolist()
    assert sorted(seen) == torch.nonzero(valid).flatten().tolist()
    # Within an expert the pairs keep their order (stable sort): token order inside each expert's run.
    for e in range(experts):
        mine = [p for p in seen if int(ids[p]) == e]
        assert mine == sorted(mine)


def test_all_invalid_pairs_leave_no_blocks():
    b = align_pairs(torch.full((12,), -1, dtype=torch.int32), 4, 16)
    assert int(b.num_padded) == 0 and bool((b.block_expert == -1).all())
