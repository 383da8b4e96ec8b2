"""GPU-resident decode state: a block-table row per request slot, kept on the device between steps.

A running request holds a *slot* (a row of :attr:`RequestSlots.block_table`, ``[max_requests + 1,
max_pages]`` int32 on the model device) from its first decode until it finishes, is aborted or preempted. Its
row is written only where its page list changed since the last sync, in one host-to-device copy for all the
step's changes (a page is added every ``page_size`` tokens), as vLLM's persistent batch and SGLang's
``req_to_token`` pool do. The last row (:attr:`RequestSlots.null_slot`) stays all zeros: a padded row of a
CUDA-graph batch points there, so it reads and writes page 0, which the allocator never hands out.

A decode step is then described by :class:`DecodePlan`: three int64 numbers per row (slot, token id,
position; a token id of -1 means the token this slot's previous step sampled, which the host has not seen yet
under overlap scheduling and :attr:`RequestSlots.next_ids` holds on the device), copied to the device at once; the block tables, lengths and KV slots of the step are derived from
them on the device (:func:`decode_inputs`), inside the captured graph when graphs are on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class DecodePlan:
    """One pure decode step: ``rows`` ``[3, B]`` int64 (on the host or the device): request slot, input token
    id and position (= tokens already cached) of each row; ``longest`` = max position + 1 (a host int, known
    from the schedule, so no device read is needed to size an eager step)."""

    rows: Tensor
    longest: int

    @property
    def batch_size(self) -> int:
        return int(self.rows.shape[1])

    @classmethod
    def from_lists(cls, slots: list[int], token_ids: list[int], positions: list[int]) -> DecodePlan:
        return cls(torch.tensor([slots, token_ids, positions], dtype=torch.int64), max(positions) + 1)


class RequestSlots:
    """Slots and their device block tables. See the module docstring.

    Args:
        max_requests: slots (``--max-running-requests``).
        max_pages: block-table width, enough pages for ``max_model_len`` tokens.
        device: the model device.
    """

    def __init__(self, max_requests: int, max_pages: int, device: torch.device | str) -> None:
        if max_requests < 1 or max_pages < 1:
            raise ValueError("RequestSlots needs at least one slot and one page per request")
        self.max_requests, self.max_pages = max_requests, max_pages
        self.device = torch.device(device)
        self.block_table = torch.zeros(max_requests + 1, max_pages, dtype=torch.int32, device=self.device)
        # Each slot's last sampled token, written on the device by the step that sampled it: a plan row whose
        # token is -1 (still in flight under overlap scheduling) reads it here.
        self.next_ids = torch.zeros(max_requests + 1, dtype=torch.int64, device=self.device)
        self._free = list(range(max_requests - 1, -1, -1))  # pop() hands out the lowest slot first
        self._synced = [0] * max_requests  # pages of each slot already written to the device row

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

    def sync(self, owners: list[tuple[int, list[int]]]) -> None:
        """Write the pages that each ``(slot, pages)`` gained since its last sync (one copy for all)."""
        rows: list[int] = []
        cols: list[int] = []
        vals: list[int] = []
        for slot, pages in owners:
            done = self._synced[slot]
            if len(pages) > done:
                if len(pages) > self.max_pages:
                    raise ValueError(f"slot {slot}: {len(pages)} pages exceed the block table's {self.max_pages}")
                new = pages[done:]
                rows.extend([slot] * len(new))
                cols.extend(range(done, len(pages)))
                vals.extend(new)
                self._synced[slot] = len(pages)
        if vals:
            update = torch.tensor([rows, cols, vals], dtype=torch.int64).to(self.device, non_blocking=True)
            self.block_table[update[0], update[1]] = update[2].to(torch.int32)


def decode_inputs(rows: Tensor, block_table: Tensor, page_size: int, pages: int,
                  next_ids: Tensor | None = None) -> tuple[Tensor, ...]:
    """Per-step tensors of a decode batch from its plan rows, on the device, in a few vectorised ops.

    Args:
        rows: ``[3, B]`` int64 (slot, token id, position) on the device; a token id of -1 is read from
            ``next_ids[slot]`` (the token the previous step sampled, not yet seen by the host).
        block_table: :attr:`RequestSlots.block_table`.
        pages: block-table columns the step reads (``P``; static for a graph).
        next_ids: :attr:`RequestSlots.next_ids` (needed when a token id is -1).
    Returns:
        token_ids ``[B]`` int64, positions ``[B]`` int64, kv slots ``[B]`` int64, lens ``[B]`` int32, table
        ``[B, P]`` int32.
    """
    slot, token_ids, positions = rows[0], rows[1], rows[2]
    if next_ids is not None:
        token_ids = torch.where(token_ids >= 0, token_ids, next_ids[slot])
    table = block_table[slot, :pages]
    page = table.gather(1, (positions // page_size).clamp_max(pages - 1)[:, None])[:, 0].long()
    kv_slots = page * page_size + positions % page_size
    return token_ids, positions, kv_slots, (positions + 1).to(torch.int32), table
