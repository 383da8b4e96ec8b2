"""Per-token metadata of a step, derived once from its token rows and shared by every layer.

Tokens of the step are its rows in order (for the dense matmuls); attention is split: the decode rows go through
one batched decode call, the prompt chunks (runs of one slot's rows at consecutive positions) through the
ragged prefill kernels, each chunk described by a :class:`SeqMeta`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


def pack_in_order(items: list, size: Callable[[Any], int], limit: int) -> list[list]:
    """``items`` (in order) packed greedily into consecutive groups whose ``size`` sum stays within ``limit``;
    an item larger than ``limit`` is a group of its own. No items, no groups."""
    groups: list[list] = []
    total = 0
    for item in items:
        n = size(item)
        if not groups or (groups[-1] and total + n > limit):
            groups.append([])
            total = 0
        groups[-1].append(item)
        total += n
    return groups


@dataclass
class SeqMeta:
    """One prompt chunk of the step: its token rows ``[t0, t1)`` and positions ``start_pos .. end_pos - 1``."""

    index: int
    t0: int
    t1: int
    start_pos: int
    end_pos: int
    page_table: Tensor  # [n_pages] int64 on the model device

    @property
    def length(self) -> int:
        return self.t1 - self.t0

    @property
    def is_decode(self) -> bool:
        return self.length == 1


@dataclass
class StepMeta:
    """Flat metadata of a step. token_ids, positions, locs (each token's KV cache location, page * page_size + offset): ``[T]`` int64 on the model device;
    seqs: the prompt chunks; page_tables: ``[B, P]`` int64, each chunk's pages zero-padded to the longest (each
    ``SeqMeta.page_table`` is a view of its row), or None."""

    seqs: list[SeqMeta]
    token_ids: Tensor
    positions: Tensor
    locs: Tensor
    page_size: int
    page_tables: Tensor | None = None

    def tables_of(self, seqs: list[SeqMeta]) -> Tensor:
        """``[len(seqs), max pages of seqs]`` int64: their page tables, zero-padded (one gather, no loop)."""
        width = max(len(s.page_table) for s in seqs)
        if self.page_tables is None:
            return torch.nn.utils.rnn.pad_sequence([s.page_table for s in seqs], batch_first=True)
        rows = [s.index for s in seqs]
        if rows == list(range(rows[0], rows[0] + len(rows))):
            return self.page_tables[rows[0]:rows[0] + len(rows), :width]
        return self.page_tables[torch.tensor(rows, device=self.page_tables.device), :width]

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    def locs_of(self, seq: SeqMeta, end: int | None = None) -> Tensor:
        """Cache locations of positions ``0 .. end - 1`` (default: all the sequence's tokens so far) ``[end]`` int64."""
        end = seq.end_pos if end is None else end
        pos = torch.arange(end, device=seq.page_table.device)
        return seq.page_table[pos // self.page_size] * self.page_size + pos % self.page_size
