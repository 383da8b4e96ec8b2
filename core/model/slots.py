"""Request slots: a row of device state per running request, kept between steps on every rank.

A running request holds a *slot* from its first step until it finishes, is aborted or preempted. The host side
(:class:`SlotTable`, the engine's) hands slots out and turns each step's page changes into block-table entries
``(slot, column, page)``; the device side (:class:`SlotState`, every rank's runner) holds the block tables and
the tokens only the device knows, and applies those entries before a step runs, so a step reaches a worker as
its rows and a few entries. A slot's row is written only where its pages changed since the last step (a page
is added every ``page_size`` tokens), as vLLM's persistent batch and SGLang's ``req_to_token`` pool do. The
last row (the *null slot*) stays all zeros: a padded row of a CUDA-graph batch points there, so it reads and
writes page 0, which the allocator never hands out.
"""

from __future__ import annotations

import torch
from torch import Tensor


class SlotTable:
    """The host's slots: which are free, and how many pages of each the device already has.

    Args:
        max_requests: slots (``--max-running-requests``).
        max_pages: block-table width, enough pages for ``max_model_len`` tokens.
    """

    def __init__(self, max_requests: int, max_pages: int) -> None:
        if max_requests < 1 or max_pages < 1:
            raise ValueError("request slots need at least one slot and one page per request")
        self.max_requests, self.max_pages = max_requests, max_pages
        self._free = list(range(max_requests - 1, -1, -1))  # pop() hands out the lowest slot first
        self._synced = [0] * max_requests  # pages of each slot already in the device table

    @property
    def null_slot(self) -> int:
        return self.max_requests

    @property
    def num_free(self) -> int:
        return len(self._free)

    def acquire(self) -> int:
        if not self._free:
            raise RuntimeError(f"all {self.max_requests} request slots are in use")
        slot = self._free.pop()
        self._synced[slot] = 0
        return slot

    def release(self, slot: int) -> None:
        """Return a slot. Its stale row is never read again: a new owner's pages overwrite it before use."""
        if not 0 <= slot < self.max_requests or slot in self._free:
            raise ValueError(f"slot {slot} is not in use")
        self._free.append(slot)

    def updates(self, owners: list[tuple[int, list[int]]]) -> Tensor | None:
        """The block-table entries ``[3, U]`` int64 (slot, column, page) of the pages each ``(slot, pages)``
        gained since its last update, or None when nothing changed."""
        rows: list[int] = []
        cols: list[int] = []
        vals: list[int] = []
        for slot, pages in owners:
            done = self._synced[slot]
            if len(pages) > done:
                if len(pages) > self.max_pages:
                    raise ValueError(f"slot {slot}: {len(pages)} pages exceed the block table's {self.max_pages}")
                rows.extend([slot] * (len(pages) - done))
                cols.extend(range(done, len(pages)))
                vals.extend(pages[done:])
                self._synced[slot] = len(pages)
        return torch.tensor([rows, cols, vals], dtype=torch.int64) if vals else None


class SlotState:
    """One rank's device state per slot (``max_requests + 1`` rows, the last the null slot).

    ``block_table`` ``[n + 1, max_pages]`` int32; ``tokens`` ``[n + 1, 1 + drafts]`` int64: column 0 the token
    the slot's last step sampled (read by a row whose token is -1), columns ``1 ..`` its MTP drafts.
    """

    def __init__(self, max_requests: int, max_pages: int, device: torch.device | str, drafts: int = 0) -> None:
        self.max_requests, self.max_pages = max_requests, max_pages
        self.device = torch.device(device)
        self.block_table = torch.zeros(max_requests + 1, max_pages, dtype=torch.int32, device=self.device)
        self.tokens = torch.zeros(max_requests + 1, 1 + drafts, dtype=torch.int64, device=self.device)

    @property
    def null_slot(self) -> int:
        return self.max_requests

    def apply(self, entries: Tensor) -> None:
        """Write block-table entries ``[3, U]`` (slot, column, page), one copy for all."""
        e = entries.to(self.device, non_blocking=True)
        self.block_table[e[0], e[1]] = e[2].to(torch.int32)

    def publish(self, slots: Tensor, tokens: Tensor) -> None:
        """Each slot's newly sampled token (device ``[S]``), for the next step's rows that read token -1."""
        self.tokens[:, 0].index_copy_(0, slots.to(self.device, non_blocking=True), tokens.to(self.device))


def row_inputs(rows: Tensor, state: SlotState, page_size: int, pages: int) -> tuple[Tensor, ...]:
    """Per-step tensors of token rows, on the device, in a few vectorised ops (graph-safe).

    Args:
        rows: ``[3, B]`` int64 (slot, token id, position) on the device; a negative token id ``t`` is read from
            column ``-1 - t`` of the slot's token state.
        pages: block-table columns the step reads (``P``; static for a graph).
    Returns:
        token_ids ``[B]`` int64, positions ``[B]`` int64, KV cache locations ``[B]`` int64, lens ``[B]`` int32 (tokens each
        row sees, itself included), table ``[B, P]`` int32.
    """
    slot, token_ids, positions = rows[0], rows[1], rows[2]
    col = (-1 - token_ids).clamp(0, state.tokens.shape[1] - 1)
    token_ids = torch.where(token_ids >= 0, token_ids, state.tokens[slot, col])
    table = state.block_table[slot, :pages]
    page = table.gather(1, (positions // page_size).clamp_max(pages - 1)[:, None])[:, 0].long()
    locs = page * page_size + positions % page_size
    return token_ids, positions, locs, (positions + 1).to(torch.int32), table
