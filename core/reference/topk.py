"""Reference exact top-k over per-row windows, and the request-position -> KV-slot transform.

Rules where the contract leaves a choice (documented here and in the family docstring):

* ties: the lower column wins (a *stable* descending sort keeps columns in increasing order among equals);
* NaN logits are treated as ``-inf``: still candidates (every in-window position is), ranked with the
  ``-inf`` entries, and among those the lower column wins;
* the selected positions of a row are returned best first (the contract leaves order unspecified).
"""

from __future__ import annotations

import torch
from torch import Tensor

# Rows sorted at once: bounds the [rows, L] int64 intermediates of a long prefill.
ROW_CHUNK = 256


class ReferenceTopK:
    """Plain-PyTorch implementation of :class:`dsa_runtime.families.TopKKernels`."""

    def topk(self, logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int) -> Tensor:
        """``[R, k]`` int32 positions relative to each row start, best first, ``-1`` padded.

        Args:
            logits: ``[R, L]`` fp32; values outside ``[row_starts[r], row_ends[r])`` are ignored.
            row_starts, row_ends: ``[R]`` int, ``0 <= start <= end <= L``.
            k: positive number of entries per row.
        """
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        rows, width = logits.shape
        device = logits.device
        starts, ends = row_starts.long().to(device), row_ends.long().to(device)
        if rows and (int(starts.min()) < 0 or int(ends.max()) > width or bool((starts > ends).any())):
            raise ValueError("row windows must satisfy 0 <= start <= end <= L")
        out = torch.full((rows, k), -1, dtype=torch.int32, device=device)
        take = min(k, width)
        cols = torch.arange(width, device=device)
        for r0 in range(0, rows, ROW_CHUNK):
            r1 = min(r0 + ROW_CHUNK, rows)
            values = logits[r0:r1].float()
            values = torch.where(values.isnan(), float("-inf"), values)  # NaN ranks as -inf
            inside = (cols >= starts[r0:r1, None]) & (cols < ends[r0:r1, None])
            # 1) order every column by value, best first, lower column first among equals;
            by_value = torch.sort(values, dim=1, descending=True, stable=True).indices
            # 2) move in-window columns in front, keeping step 1's order (stable): -inf inside still
            #    outranks anything outside, which a single sort with a -inf sentinel could not express.
            in_order = torch.gather(inside, 1, by_value).to(torch.int8)
            ranked = torch.gather(
                by_value, 1, torch.sort(in_order, dim=1, descending=True, stable=True).indices
            )
            chosen = ranked[:, :take] - starts[r0:r1, None]
            count = (ends[r0:r1] - starts[r0:r1])[:, None]
            keep = torch.arange(take, device=device)[None, :] < count
            out[r0:r1, :take] = torch.where(keep, chosen, -1).to(torch.int32)
        return out

    def page_table_transform(
        self, topk_indices: Tensor, page_table: Tensor, row_to_batch: Tensor, page_size: int
    ) -> Tensor:
        """``slot = page_table[b, p // page_size] * page_size + p % page_size``; ``-1`` stays ``-1``."""
        pos = topk_indices.long()
        valid = pos >= 0
        safe = torch.where(valid, pos, 0)
        batch = row_to_batch.long().to(pos.device)[:, None].expand_as(pos)
        pages = page_table.long().to(pos.device)[batch, safe // page_size]
        slots = pages * page_size + safe % page_size
        return torch.where(valid, slots, -1).to(torch.int32)

    def topk_transform(
        self,
        logits: Tensor,
        row_starts: Tensor,
        row_ends: Tensor,
        k: int,
        page_table: Tensor,
        row_to_batch: Tensor,
        page_size: int,
    ) -> Tensor:
        """:meth:`topk` then :meth:`page_table_transform`."""
        positions = self.topk(logits, row_starts, row_ends, k)
        return self.page_table_transform(positions, page_table, row_to_batch, page_size)
