"""Exact top-k over per-row windows with ``torch.topk`` (no full-row sorts), and the slot transform.

Ranking keys (fp32): a finite in-window logit keeps its value; an in-window ``-inf`` or NaN becomes
``-FLT_MAX`` (still a candidate, ranked below every finite logit); everything outside the window becomes
``-inf``, so any in-window position outranks any outside one and a selected key of ``-inf`` marks a slot the
window could not fill (returned as ``-1``). The one ambiguity, an in-window logit of exactly ``-FLT_MAX``
beside an in-window ``-inf``/NaN, would let a tie hide which one is larger: such rows are ranked in float64
instead (never seen in practice; kept for exactness).

Ties: the lower column wins, as in the reference. The contract would accept any tie-break, but FP8 logits
tie often (a key whose ReLU terms are all 0 scores exactly 0) and ``torch.topk``'s choice among equal values
depends on the row's width, so a request could select different keys alone and in a batch (whose decode
rows are padded to the longest context). Rows whose k-th and (k+1)-th keys are equal are re-ranked with a
stable sort; the others keep ``torch.topk``'s set.
"""

from __future__ import annotations

import torch
from torch import Tensor

FLT_MAX = torch.finfo(torch.float32).max
ROW_CHUNK = 1024  # rows ranked at once: bounds the [rows, L] key copies of a long prefill


def _rank_keys(values: Tensor, inside: Tensor) -> Tensor:
    """``[r, L]`` ranking keys (see the module docstring), fp32 or, for the ambiguous rows, float64."""
    keys = torch.nan_to_num(values, nan=-FLT_MAX, neginf=-FLT_MAX, posinf=float("inf"))
    keys.masked_fill_(~inside, float("-inf"))
    # -FLT_MAX inside a window is either a mapped -inf/NaN or a real -FLT_MAX logit: only when both occur
    # could a tie hide which is larger (rare: checked only when some key is -FLT_MAX at all).
    if bool((keys == -FLT_MAX).any()):
        real = inside & (values == -FLT_MAX)
        mapped = inside & (values.isnan() | (values == float("-inf")))
        if bool(real.any()) and bool(mapped.any()):
            wide = values.double().nan_to_num(nan=float("-inf"))
            wide = torch.where(wide == float("-inf"), -1e300, wide)  # below every fp32 value, above -inf
            return wide.masked_fill_(~inside, float("-inf"))
    return keys


def _top_lower_first(keys: Tensor, take: int) -> tuple[Tensor, Tensor]:
    """Values and columns ``[r, take]`` of each row's ``take`` largest keys; among equal keys at the cut the
    lower column wins (order inside a row unspecified)."""
    if take >= keys.shape[1]:
        return torch.topk(keys, take, dim=1, sorted=False)
    best, idx = torch.topk(keys, take + 1, dim=1)  # sorted, best first
    # A tie across the cut is decided by column; ties among keys that are all outside the window do not
    # matter (those slots become -1).
    tie = (best[:, take - 1] == best[:, take]) & (best[:, take - 1] > float("-inf"))
    best, idx = best[:, :take], idx[:, :take]
    if bool(tie.any()):
        rows = tie.nonzero().squeeze(1)
        exact = torch.sort(keys.index_select(0, rows), dim=1, descending=True, stable=True)
        best, idx = best.clone(), idx.clone()
        best[rows], idx[rows] = exact.values[:, :take], exact.indices[:, :take]
    return best, idx


class TorchTopK:
    """:class:`dsa_runtime.families.TopKKernels` with ``torch.topk``."""

    def topk(self, logits: Tensor, row_starts: Tensor, row_ends: Tensor, k: int) -> Tensor:
        """``[R, k]`` int32 positions relative to each row start, ``-1`` padded (order unspecified)."""
        if k <= 0:
            raise ValueError(f"k must be positive, got {k}")
        rows, width = logits.shape
        device = logits.device
        starts = row_starts.to(device=device, dtype=torch.int64)
        ends = row_ends.to(device=device, dtype=torch.int64)
        if rows and (int(starts.min()) < 0 or int(ends.max()) > width or bool((starts > ends).any())):
            raise ValueError("row windows must satisfy 0 <= start <= end <= L")
        out = torch.full((rows, k), -1, dtype=torch.int32, device=device)
        take = min(k, width)
        if rows == 0 or take == 0:
            return out
        cols = torch.arange(width, device=device)
        for r0 in range(0, rows, ROW_CHUNK):
            r1 = min(r0 + ROW_CHUNK, rows)
            inside = (cols >= starts[r0:r1, None]) & (cols < ends[r0:r1, None])
            keys = _rank_keys(logits[r0:r1].float(), inside)
            best, idx = _top_lower_first(keys, take)
            chosen = torch.where(best > float("-inf"), idx - starts[r0:r1, None], -1)
            out[r0:r1, :take] = chosen.to(torch.int32)
        return out

    def page_table_transform(
        self, topk_indices: Tensor, page_table: Tensor, row_to_batch: Tensor, page_size: int
    ) -> Tensor:
        """``slot = page_table[b, p // page_size] * page_size + p % page_size``; ``-1`` stays ``-1``."""
        pos = topk_indices.long()
        valid = pos >= 0
        safe = pos.clamp_min(0)
        table = page_table.to(device=pos.device, dtype=torch.int64)
        batch = row_to_batch.to(device=pos.device, dtype=torch.int64)[:, None]
        slots = table[batch, safe // page_size] * page_size + safe % page_size
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
