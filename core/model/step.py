"""The one description of a model step: token rows against per-slot state that lives on every rank's device.

A step is a :class:`Step`: ``rows`` ``[3, R]`` int64 on the host, one row per token the step feeds (request
slot, token id, position). Every step kind is such a tensor:

* ``TARGET``, the model over the rows: decodes (one row per request), prompt chunks (consecutive rows of one
  slot at consecutive positions) and MTP verifies (a request's last token and its drafts). Each row's KV is
  written before any row's attention reads the cache, so the rows of one slot see each other as the tokens of
  a prefill chunk do. Returns the float32 logits of the ``pick`` rows.
* ``DRAFT``, the NextN layer over the rows (MTP draft extend); row ``i`` continues the hidden state of row
  ``source[i]`` of the last ``TARGET`` step that kept its hidden states. The argmax of each ``pick`` row becomes
  its slot's first draft, its hidden state the slot's chain start.
* ``CHAIN``, ``draft_steps - 1`` chained NextN steps from each row's slot (its first draft at the row's
  position), ``budget[i]`` drafts for row ``i``; returns the drafts ``[R, draft_steps]`` (first one included)
  and keeps them in the slot's token columns.

A token id ``t >= 0`` is literal; ``t < 0`` names a token only the device knows, column ``-1 - t`` of the
slot's token state (:class:`~dsa_runtime.model.slots.SlotState`): ``-1`` is the token the slot's last step
sampled (overlap scheduling), ``-1 - j`` its ``j``-th draft (an MTP verify).

``pages`` carries the step's block-table changes (slot, column, page) so that every rank applies the same ones
before it runs: a step reaches a worker as these few tensors, never as per-sequence objects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


class StepKind(enum.IntEnum):
    TARGET = 0
    DRAFT = 1
    CHAIN = 2


@dataclass
class Step:
    """One step. Tensors are int64 on the host.

    Attributes:
        kind: what runs over the rows (module docstring).
        rows: ``[3, R]`` slot, token id (negative: a device-side token), position.
        pick: ``[S]`` the rows whose output is returned (``TARGET``: logits) or used (``DRAFT``: the rows that
            set their slot's first draft); None: every row.
        pages: ``[3, U]`` block-table entries (slot, column, page) to write before the rows run; None: none.
        hidden: ``TARGET``: keep every row's post-norm hidden state for the next ``DRAFT`` step.
        source: ``DRAFT``: ``[R]`` the row of the kept hidden states each row continues.
        budget: ``CHAIN``: ``[R]`` drafts each row needs (a row stops writing once it has them).
    """

    kind: StepKind
    rows: Tensor
    pick: Tensor | None = None
    pages: Tensor | None = None
    hidden: bool = False
    source: Tensor | None = None
    budget: Tensor | None = None

    @property
    def num_rows(self) -> int:
        return int(self.rows.shape[1])

    @property
    def longest(self) -> int:
        """Positions the longest row reads: its position + 1 (a host value, no device read)."""
        return int(self.rows[2].max()) + 1 if self.num_rows else 0

    def check(self, max_requests: int, max_pages: int, page_size: int, vocab_size: int) -> None:
        """``ValueError`` naming the first thing a runner with this slot state cannot run (nothing is written)."""
        if self.num_rows == 0:
            raise ValueError("a step needs at least one row")
        (slot_lo, _, pos_lo), (slot_hi, token_hi, pos_hi) = self.rows.amin(1).tolist(), self.rows.amax(1).tolist()
        if slot_lo < 0 or slot_hi > max_requests:
            raise ValueError(f"row slots must be in [0, {max_requests}], got {self.rows[0].tolist()}")
        if token_hi >= vocab_size:
            raise ValueError(f"token id {token_hi} is outside the vocabulary [0, {vocab_size})")
        if pos_lo < 0 or pos_hi >= max_pages * page_size:
            raise ValueError(f"row positions must be in [0, {max_pages * page_size}), got {self.rows[2].tolist()}")
        if self.pages is not None and self.pages.numel():
            (s_lo, c_lo, p_lo), (s_hi, c_hi, _) = self.pages.amin(1).tolist(), self.pages.amax(1).tolist()
            if s_lo < 0 or s_hi >= max_requests or c_lo < 0 or c_hi >= max_pages:
                raise ValueError(f"block-table entries outside [{max_requests}, {max_pages}]: {self.pages.tolist()}")
            if p_lo < 1:
                raise ValueError("page 0 is reserved (the null slot's); a block-table entry names it")
        if self.pick is not None and self.pick.numel():
            lo, hi = self.pick.aminmax()
            if int(lo) < 0 or int(hi) >= self.num_rows:
                raise ValueError(f"Step.pick holds a row outside [0, {self.num_rows})")

    @classmethod
    def of(cls, kind: StepKind, slots: list[int], tokens: list[int], positions: list[int], **fields) -> Step:
        return cls(kind, torch.tensor([slots, tokens, positions], dtype=torch.int64).reshape(3, -1), **fields)


def spans(rows: Tensor) -> tuple[list[int], list[int]]:
    """Runs of consecutive rows of one slot at consecutive positions (a prompt chunk, a verify, a decode):
    each run's first row and its length, from host rows ``[3, R]``."""
    slot, pos = rows[0], rows[2]
    if slot.numel() == 0:
        return [], []
    cut = ((slot[1:] != slot[:-1]) | (pos[1:] != pos[:-1] + 1)).nonzero().flatten() + 1
    firsts = [0, *cut.tolist()]
    ends = [*firsts[1:], int(slot.numel())]
    return firsts, [e - f for f, e in zip(firsts, ends, strict=True)]


class Runner(Protocol):
    """What the engine runs its steps on: a :class:`~dsa_runtime.model.runner.ModelRunner` in this process, a
    :class:`~dsa_runtime.distributed.runtime.DistributedRunner` over several ranks, or a test double.

    ``max_requests`` slots whose block tables hold ``max_pages`` pages each; ``graph_rows``: rows of the largest
    captured graph (0: every step is eager); ``nextn``: whether ``DRAFT`` and ``CHAIN`` steps run (MTP).
    """

    device: torch.device
    nextn: bool

    @property
    def max_requests(self) -> int: ...

    @property
    def max_pages(self) -> int: ...

    @property
    def graph_rows(self) -> int: ...

    def run(self, step: Step) -> Tensor | None:
        """Run ``step``; its output (``TARGET``: picked rows' logits ``[S, vocab]`` fp32; ``CHAIN``: drafts)."""

    def publish(self, slots: Tensor, tokens: Tensor) -> None:
        """Each slot's newly sampled token (host slots ``[S]``, device tokens ``[S]``), read by rows of token -1."""

    def shutdown(self) -> None:
        """Stop the workers and leave the process group, if any (idempotent); the runner runs nothing after."""
