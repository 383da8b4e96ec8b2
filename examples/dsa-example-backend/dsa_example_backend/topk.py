"""The ``topk`` family implemented with ``torch.topk`` (see ``dsa_runtime.families.TopKKernels``)."""

from __future__ import annotations

import torch


class TorchTopK:
    def topk(self, logits: torch.Tensor, row_starts: torch.Tensor, row_ends: torch.Tensor, k: int) -> torch.Tensor:
        """[R, L] fp32 -> [R, k] int32 positions relative to each row start, -1 padded."""
        rows, width = logits.shape
        cols = torch.arange(width, device=logits.device)
        starts, ends = row_starts.long()[:, None], row_ends.long()[:, None]
        in_window = (cols >= starts) & (cols < ends)
        # Every in-window position is a candidate, even -inf or NaN, so rank those just above the mask.
        lowest = torch.finfo(torch.float32).min
        scores = logits.float().nan_to_num(nan=lowest, neginf=lowest)
        scores = scores.masked_fill(~in_window, float("-inf"))
        take = min(k, width)
        picked = scores.topk(take, dim=1).indices if take else cols.new_empty(rows, 0)
        valid = in_window.gather(1, picked)
        out = torch.where(valid, picked - starts, torch.full_like(picked, -1)).to(torch.int32)
        if take < k:
            out = torch.cat([out, out.new_full((rows, k - take), -1)], dim=1)
        return out

    def page_table_transform(
        self, topk_indices: torch.Tensor, page_table: torch.Tensor, row_to_batch: torch.Tensor, page_size: int
    ) -> torch.Tensor:
        pos = topk_indices.long()
        valid = pos >= 0
        safe = pos.clamp(min=0)
        pages = page_table.long()[row_to_batch.long()[:, None], safe // page_size]
        slots = pages * page_size + safe % page_size
        return torch.where(valid, slots, torch.full_like(slots, -1)).to(torch.int32)

    def topk_transform(self, logits, row_starts, row_ends, k, page_table, row_to_batch, page_size):
        return self.page_table_transform(self.topk(logits, row_starts, row_ends, k), page_table, row_to_batch, page_size)
