"""How a step reaches every rank: a few int64 tensors broadcast from rank 0, never per-sequence objects.

Each step is one fixed-size header and one payload, both int64 tensors on the gloo ``ctrl`` group. The payload
holds the step's token rows laid out by attention group (under DP attention each group's rows padded with null
rows to one count, so every rank runs, and replays, the same row count), the picked rows per group, the
block-table entries, and the slots of the tokens rank 0 sampled since the last step (their values follow as one
device broadcast, so the next step's rows of token -1 read them on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dsa_runtime.model.step import Step, StepKind

OP_STEP, OP_CALL, OP_STOP = 1, 2, 3
_FIXED = 10  # header fields before the per-group pick counts
_EMPTY = torch.zeros(0, dtype=torch.int64)


@dataclass
class Message:
    """One broadcast: ``op``, and for a step the group layout of :class:`Step` fields.

    ``step.rows`` is ``[3, dp * group_rows]`` (group ``g``'s rows at ``g * group_rows``), ``step.pick`` the
    group-local picked rows of every group in group order (``picks[g]`` of them for group ``g``; None: every row),
    ``step.source`` / ``step.budget`` laid out like the rows; ``publish``: ``[P]`` slots of the tokens that follow.
    """

    op: int
    step: Step | None = None
    group_rows: int = 0
    picks: list[int] | None = None
    publish: Tensor | None = None

    def encode(self, dp: int) -> tuple[Tensor, Tensor]:
        """The header ``[10 + dp]`` and payload tensors (one tensor built from host ints, one concatenation)."""
        s = self.step
        if s is None:
            return torch.tensor([self.op] + [0] * (_FIXED - 1 + dp), dtype=torch.int64), _EMPTY
        fields = [self.op, int(s.kind), s.num_rows, self.group_rows,
                  -1 if s.pick is None else int(s.pick.numel()),
                  0 if s.pages is None else int(s.pages.shape[1]),
                  int(s.hidden), int(s.source is not None), int(s.budget is not None),
                  0 if self.publish is None else int(self.publish.numel())]
        fields += self.picks if self.picks is not None else [0] * dp
        parts = [t.reshape(-1) for t in (s.rows, s.pick, s.pages, s.source, s.budget, self.publish) if t is not None]
        return torch.tensor(fields, dtype=torch.int64), parts[0] if len(parts) == 1 else torch.cat(parts)

    @staticmethod
    def payload_size(header: Tensor) -> int:
        op, _, rows, _, pick, pages, _, source, budget, publish = header[:_FIXED].tolist()
        if op != OP_STEP:
            return 0
        return 3 * rows + max(pick, 0) + 3 * pages + rows * (source + budget) + publish

    @classmethod
    def decode(cls, header: Tensor, payload: Tensor) -> Message:
        fields = header.tolist()
        op, kind, rows, group_rows, pick, pages, hidden, source, budget, publish = fields[:_FIXED]
        if op != OP_STEP:
            return cls(op)
        r, p, e, src, bud, pub = payload.split([3 * rows, max(pick, 0), 3 * pages, rows * source, rows * budget,
                                                publish])
        step = Step(StepKind(kind), r.view(3, rows), pick=p if pick >= 0 else None,
                    pages=e.view(3, pages) if pages else None, hidden=bool(hidden),
                    source=src if source else None, budget=bud if budget else None)
        return cls(op, step, group_rows, fields[_FIXED:] if pick >= 0 else None, pub if publish else None)

    def local_step(self, dp_rank: int) -> Step:
        """This attention group's part of the step (every block-table entry: each rank keeps every slot's)."""
        s = self.step
        if self.group_rows == s.num_rows:  # one group
            return s
        lo, hi = dp_rank * self.group_rows, (dp_rank + 1) * self.group_rows
        pick = None
        if self.picks is not None:
            start = sum(self.picks[:dp_rank])
            pick = s.pick[start:start + self.picks[dp_rank]]
        return Step(s.kind, s.rows[:, lo:hi], pick=pick, pages=s.pages, hidden=s.hidden,
                    source=None if s.source is None else s.source[lo:hi],
                    budget=None if s.budget is None else s.budget[lo:hi])


@dataclass
class GroupLayout:
    """Where each row of a step sits once laid out by attention group: ``position[i]`` its column in the padded
    ``[3, dp * group_rows]`` rows (row ``i`` is in group ``position[i] // group_rows``)."""

    position: Tensor
    group_rows: int


def lay_out(step: Step, groups: Tensor, dp: int, null_slot: int) -> tuple[Step, GroupLayout, list[int] | None,
                                                                            Tensor | None]:
    """Lay ``step``'s rows out by group (``groups`` ``[R]``: each row's attention group).

    Returns the laid-out step (picked rows as group-local indices, grouped), the layout, each group's pick
    count, and ``order`` ``[S]``: where the output of the step's ``i``-th picked row lands among the groups'
    outputs concatenated in group order (None for a ``CHAIN``, whose outputs are every laid-out row's). ``step.source`` is left to the caller (it
    indexes an earlier step's layout).
    """
    members = [(groups == g).nonzero().flatten() for g in range(dp)]
    group_rows = max(1, max(int(m.numel()) for m in members))
    rows = torch.zeros(3, dp * group_rows, dtype=torch.int64)
    rows[0].fill_(null_slot)
    position = torch.empty(step.num_rows, dtype=torch.int64)
    budget = None if step.budget is None else torch.zeros(dp * group_rows, dtype=torch.int64)
    for g, m in enumerate(members):
        at = g * group_rows + torch.arange(m.numel())
        rows[:, at] = step.rows[:, m]
        position[m] = at
        if budget is not None:
            budget[at] = step.budget[m]
    picks = order = local_pick = None
    if step.kind is not StepKind.CHAIN:  # a CHAIN returns every row's drafts: the caller takes them by position
        pick = step.pick if step.pick is not None else torch.arange(step.num_rows)
        where = position[pick]
        group = where // group_rows
        by_group = torch.sort(group, stable=True).indices
        local_pick = (where % group_rows)[by_group]
        picks = torch.bincount(group, minlength=dp).tolist()
        order = torch.empty_like(by_group)
        order[by_group] = torch.arange(by_group.numel())
    laid = Step(step.kind, rows, pick=local_pick, pages=step.pages, hidden=step.hidden, budget=budget)
    return laid, GroupLayout(position, group_rows), picks, order
