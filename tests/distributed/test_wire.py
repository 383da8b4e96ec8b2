"""A step's message (``core/distributed/wire.py``): what the workers decode is what rank 0 runs, and under DP
attention each group's part holds exactly its rows, padded with null rows, its picks and the same entries."""

from __future__ import annotations

import torch

from dsa_runtime.distributed.wire import OP_STEP, OP_STOP, Message, lay_out
from dsa_runtime.model.step import Step, StepKind


def _same(a: Step, b: Step) -> None:
    assert a.kind is b.kind and a.hidden == b.hidden
    for name in ("rows", "pick", "pages", "source", "budget"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert torch.equal(x, y), name


def test_a_message_decodes_to_the_step_it_encodes():
    step = Step.of(StepKind.DRAFT, [3, 3, 1], [5, -2, 7], [10, 11, 4], pick=torch.tensor([1, 2]),
                   pages=torch.tensor([[3, 1], [0, 0], [9, 12]]), source=torch.tensor([4, 5, 0]))
    msg = Message(OP_STEP, step, step.num_rows, [2], torch.tensor([3, 1]))
    header, payload = msg.encode(dp=1)
    assert header.dtype == payload.dtype == torch.int64 and Message.payload_size(header) == payload.numel()
    got = Message.decode(header, payload)
    _same(got.step, step)
    assert torch.equal(got.publish, msg.publish) and got.picks == [2]
    chain = Step.of(StepKind.CHAIN, [0, 2], [0, 0], [8, 9], budget=torch.tensor([3, 1]))
    got = Message.decode(*Message(OP_STEP, chain, 2).encode(dp=1))
    _same(got.step, chain)
    assert got.publish is None and got.picks is None
    assert Message.decode(*Message(OP_STOP).encode(dp=2)).op == OP_STOP


def test_dp_layout_gives_each_group_its_rows_and_picks():
    # Rows of slots 0 (group 1), 2 (group 0, a 3-token chunk) and 5 (group 1); picks in the step's order.
    step = Step.of(StepKind.TARGET, [0, 2, 2, 2, 5], [11, 12, 13, 14, 15], [7, 0, 1, 2, 30],
                   pick=torch.tensor([4, 3, 0]), pages=torch.tensor([[2], [0], [6]]))
    groups = torch.tensor([1, 0, 0, 0, 1])
    laid, layout, picks, order = lay_out(step, groups, dp=2, null_slot=9)
    assert layout.group_rows == 3 and picks == [1, 2]
    msg = Message.decode(*Message(OP_STEP, laid, layout.group_rows, picks).encode(dp=2))
    g0, g1 = msg.local_step(0), msg.local_step(1)
    assert g0.rows.tolist() == [[2, 2, 2], [12, 13, 14], [0, 1, 2]] and g0.pick.tolist() == [2]
    assert g1.rows.tolist() == [[0, 5, 9], [11, 15, 0], [7, 30, 0]] and g1.pick.tolist() == [1, 0]
    assert torch.equal(g0.pages, step.pages) and torch.equal(g1.pages, step.pages)
    # Outputs concatenated in group order (g0's pick, then g1's) come back in the step's pick order.
    outputs = torch.tensor([3, 4, 0])  # the picked rows' own indices, as each group would return them
    assert outputs[order].tolist() == step.pick.tolist()
