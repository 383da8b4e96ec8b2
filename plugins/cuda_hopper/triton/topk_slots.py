"""Request positions -> KV slots through the page table (Triton): ``page_table[b, p // page] * page + p % page``.

One program per (row, block of k); ``-1`` stays ``-1``. Used on its own by
:meth:`~.topk.TritonTopK.page_table_transform`; the fused top-k writes slots in its selecting pass instead.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

SLOT_BLOCK = 1024


@triton.jit
def _slots_kernel(pos_ptr, stride_pos, table_ptr, stride_table, batch_ptr, out_ptr, k, page_size, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    idx = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = idx < k
    pos = tl.load(pos_ptr + r.to(tl.int64) * stride_pos + idx, mask=inside, other=-1)
    valid = pos >= 0
    b = tl.load(batch_ptr + r).to(tl.int64)
    page = tl.load(table_ptr + b * stride_table + pos // page_size, mask=valid, other=0)
    slot = tl.where(valid, page * page_size + pos % page_size, -1)
    tl.store(out_ptr + r.to(tl.int64) * k + idx, slot, mask=inside)


def launch_slots(positions: Tensor, page_table: Tensor, row_to_batch: Tensor, page_size: int) -> Tensor:
    """``[R, k]`` int32 slots of ``[R, k]`` positions (``-1`` kept); ``page_table`` ``[B, P]``, ``row_to_batch`` ``[R]``."""
    rows, k = positions.shape
    dev = positions.device
    out = torch.empty((rows, k), dtype=torch.int32, device=dev)
    if rows == 0 or k == 0:
        return out
    pos = positions.to(torch.int32)
    if pos.stride(1) != 1:
        pos = pos.contiguous()
    table = page_table.to(device=dev, dtype=torch.int32).contiguous()
    batch = row_to_batch.to(device=dev, dtype=torch.int32).contiguous()
    block = min(SLOT_BLOCK, triton.next_power_of_2(k))
    _slots_kernel[(rows, triton.cdiv(k, block))](
        pos, pos.stride(0), table, table.stride(0), batch, out, k, page_size, BLOCK=block, num_warps=4
    )
    return out
