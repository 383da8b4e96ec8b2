"""Per-sequence batches for tests and benchmarks, run as one runner :class:`~dsa_runtime.model.step.Step`.

The engine never uses this: it keeps request slots and sends token rows. A test or a benchmark that thinks in
sequences (tokens from a start position, a page table, which logits it wants) builds a :class:`ForwardBatch` and
calls :func:`forward`, which gives sequence ``i`` the runner's slot ``i`` for the step and writes its page table
there first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor

from dsa_runtime.model.step import Step, StepKind

LogitsMode = Literal["last", "all", "none"]


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


def batch_step(batch: ForwardBatch, *, page_size: int, num_pages: int, vocab_size: int, max_requests: int,
               hidden: bool = False) -> Step:
    """The batch as one ``TARGET`` step (sequence ``i`` in slot ``i``); one clear ``ValueError`` for bad input."""
    if not batch.seqs:
        raise ValueError("empty ForwardBatch")
    if len(batch.seqs) > max_requests:
        raise ValueError(f"{len(batch.seqs)} sequences need as many request slots; the runner has {max_requests}")
    slots: list[int] = []
    ids: list[int] = []
    positions: list[int] = []
    pick: list[int] = []
    entries: list[list[int]] = [[], [], []]
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
        entries[0] += [i] * need
        entries[1] += range(need)
        entries[2] += table
        first = len(ids)
        slots += [i] * n
        ids += s.token_ids
        positions += range(s.start_pos, end)
        if s.logits == "last":
            pick.append(first + n - 1)
        elif s.logits == "all":
            pick += range(first, first + n)
    return Step.of(StepKind.TARGET, slots, ids, positions, pick=torch.tensor(pick, dtype=torch.int64),
                   pages=torch.tensor(entries, dtype=torch.int64), hidden=hidden)


def forward(runner, batch: ForwardBatch) -> list[Tensor | None]:
    """Run ``batch`` on ``runner`` (a :class:`~dsa_runtime.model.step.Runner` with a ``cache`` and ``config``):
    each sequence's logits as it asks (``"last"`` ``[vocab]``, ``"all"`` ``[len, vocab]``, ``"none"`` None)."""
    cache = runner.cache
    step = batch_step(batch, page_size=cache.page_size, num_pages=cache.num_pages,
                      vocab_size=runner.config.vocab_size, max_requests=runner.max_requests)
    logits = runner.run(step)
    out: list[Tensor | None] = []
    at = 0
    for s in batch.seqs:
        if s.logits == "none":
            out.append(None)
        elif s.logits == "last":
            out.append(logits[at])
            at += 1
        else:
            out.append(logits[at:at + len(s.token_ids)])
            at += len(s.token_ids)
    return out
