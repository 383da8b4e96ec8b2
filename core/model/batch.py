"""What the engine hands the model each step, and the flat per-token metadata derived from it once.

A batch mixes prefill chunks (``len(token_ids) > 1``; ``start_pos > 0`` continues a chunked prefill) and
decodes (one new token). Tokens of all sequences are concatenated in batch order for the dense matmuls;
attention is ragged: the step's prefill chunks and its decodes each go through batched kernel calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

LogitsMode = Literal["last", "all", "none"]


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
class ForwardSeq:
    """One sequence's work this step.

    Attributes:
        token_ids: the new tokens (>= 1), at positions ``start_pos .. start_pos + len - 1``.
        start_pos: tokens of this sequence already in the cache.
        page_table: physical pages covering at least ``start_pos + len`` tokens (page 0 is never valid).
        logits: ``"last"`` -> float32 ``[vocab]``, ``"all"`` -> ``[len, vocab]``, ``"none"`` -> None.
    """

    token_ids: list[int]
    start_pos: int
    page_table: list[int]
    logits: LogitsMode = "last"


@dataclass
class ForwardBatch:
    seqs: list[ForwardSeq] = field(default_factory=list)


@dataclass
class SeqMeta:
    """Per-sequence view: its token rows ``[t0, t1)`` in the flat batch and its positions."""

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
    """Flat metadata of a step. token_ids, positions, slots: ``[T]`` int64 on the model device; page_tables:
    ``[B, P]`` int64, every sequence's pages zero-padded to the longest (each ``SeqMeta.page_table`` is a view of
    its row), or None where a caller built the step otherwise."""

    seqs: list[SeqMeta]
    token_ids: Tensor
    positions: Tensor
    slots: Tensor
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

    def slots_of(self, seq: SeqMeta, end: int | None = None) -> Tensor:
        """Slots of positions ``0 .. end - 1`` (default: all the sequence's tokens so far) ``[end]`` int64."""
        end = seq.end_pos if end is None else end
        pos = torch.arange(end, device=seq.page_table.device)
        return seq.page_table[pos // self.page_size] * self.page_size + pos % self.page_size


def build_step(batch: ForwardBatch, *, page_size: int, num_pages: int, vocab_size: int, device) -> StepMeta:
    """Validate the batch and flatten it; one clear ``ValueError`` for bad input.

    Vectorised over the batch: the checks are plain Python over the lists, the token positions and cache slots
    are computed by a few CPU ops for the whole step, and everything reaches ``device`` in one copy (per
    sequence tensor work here cost ~7 launches and a host-to-device copy per sequence on every eager step).
    """
    if not batch.seqs:
        raise ValueError("empty ForwardBatch")
    ids: list[int] = []
    tables: list[list[int]] = []
    starts: list[int] = []
    lengths: list[int] = []
    for i, s in enumerate(batch.seqs):
        n = len(s.token_ids)
        if n < 1:
            raise ValueError(f"seq {i}: no new tokens")
        if s.start_pos < 0:
            raise ValueError(f"seq {i}: start_pos {s.start_pos} < 0")
        if s.logits not in ("last", "all", "none"):
            raise ValueError(f"seq {i}: logits must be 'last', 'all' or 'none', got {s.logits!r}")
        end = s.start_pos + n
        need = -(-end // page_size)
        if len(s.page_table) < need:
            raise ValueError(f"seq {i}: page_table has {len(s.page_table)} pages, {need} needed for {end} tokens")
        table = list(s.page_table[:need])
        if min(table) <= 0 or max(table) >= num_pages:
            raise ValueError(f"seq {i}: page ids must be in [1, {num_pages}) (page 0 is reserved), got {table}")
        if min(s.token_ids) < 0 or max(s.token_ids) >= vocab_size:
            raise ValueError(f"seq {i}: token id out of range [0, {vocab_size})")
        tables.append(table)
        starts.append(s.start_pos)
        lengths.append(n)
        ids.extend(s.token_ids)
    width = max(len(t) for t in tables)
    table_cpu = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int64)  # [B, P]
    lens = torch.tensor(lengths, dtype=torch.int64)
    seq_of = torch.repeat_interleave(torch.arange(len(tables)), lens)  # [T]: each token's sequence
    first = torch.cumsum(lens, 0) - lens  # each sequence's first token row
    pos = torch.tensor(starts, dtype=torch.int64)[seq_of] + torch.arange(len(ids)) - first[seq_of]
    slots = table_cpu[seq_of, pos // page_size] * page_size + pos % page_size
    t = len(ids)
    packed = torch.cat([torch.tensor(ids, dtype=torch.int64), pos, slots, table_cpu.reshape(-1)]).to(device)
    token_ids, positions, slot_ids, flat = packed.split([t, t, t, table_cpu.numel()])
    page_tables = flat.view(len(tables), width)
    metas: list[SeqMeta] = []
    t0 = 0
    for i, (start, n, table) in enumerate(zip(starts, lengths, tables, strict=True)):
        metas.append(SeqMeta(i, t0, t0 + n, start, start + n, page_tables[i, :len(table)]))
        t0 += n
    return StepMeta(seqs=metas, token_ids=token_ids, positions=positions, slots=slot_ids, page_size=page_size,
                    page_tables=page_tables)
