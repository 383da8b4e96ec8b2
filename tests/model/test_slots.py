"""Request slots on CPU: the host's slot table and its block-table entries, the device state that applies them,
the graph-shaped step (every row a decode row over the static table width, what a CUDA graph captures) against
per-sequence steps, ragged batches across ``index_topk`` and page boundaries, slot reuse, and the CUDA-graph
bucket list."""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.model.decode_graph import default_batch_sizes
from dsa_runtime.model.seqs import ForwardBatch, ForwardSeq, forward
from dsa_runtime.model.slots import SlotState, SlotTable
from dsa_runtime.model.step import Step, StepKind
from tests.model.helpers import FP32_TOL, PAGE_SIZE, assert_logits_close, make_runner, pages, tokens


def test_slots_hand_out_rows_and_send_only_new_pages():
    slots = SlotTable(max_requests=3, max_pages=4)
    state = SlotState(3, 4, "cpu")
    a, b = slots.acquire(), slots.acquire()
    assert (a, b) == (0, 1) and slots.num_free == 1
    state.apply(slots.updates([(a, [5, 6]), (b, [9])]))
    assert state.block_table[:2].tolist() == [[5, 6, 0, 0], [9, 0, 0, 0]]
    assert slots.updates([(a, [5, 6]), (b, [9])]) is None  # nothing new: nothing to send
    assert slots.updates([(a, [5, 6, 7]), (b, [9])]).tolist() == [[a], [2], [7]]
    slots.release(a)
    with pytest.raises(ValueError, match="not in use"):
        slots.release(a)
    again = slots.acquire()
    assert again == a
    state.apply(slots.updates([(again, [11])]))  # a new owner's pages overwrite the stale row from its start
    assert state.block_table[again, 0] == 11
    assert state.block_table[state.null_slot].tolist() == [0, 0, 0, 0]
    slots.acquire()
    with pytest.raises(RuntimeError, match="all 3 request slots are in use"):
        slots.acquire()
    with pytest.raises(ValueError, match="exceed the block table"):
        slots.updates([(b, [1, 2, 3, 4, 5])])


def test_default_buckets_follow_sglang():
    assert default_batch_sizes(1) == [1]
    assert default_batch_sizes(6) == [1, 2, 4, 6]
    assert default_batch_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert default_batch_sizes(45) == [1, 2, 4, 8, 16, 24, 32, 40, 45]


@pytest.mark.parametrize(("preset", "kv_layout"), [("tiny-v32", "bf16"), ("tiny-v32", "fp8_656"), ("tiny-v3", "bf16")])
def test_tensor_decode_matches_the_per_sequence_forward(preset, kv_layout):
    """Three ragged sequences (contexts across index_topk 32 and page boundaries) decode six steps through
    ModelRunner.decode and through ForwardBatch decodes on a second runner: the same logits (fp32)."""
    lengths = [9, 30, 45]
    steps = 6
    ref = make_runner(preset, kv_layout=kv_layout, dtype=torch.float32)
    fast = make_runner(preset, kv_layout=kv_layout, dtype=torch.float32)
    fast.setup(max_requests=4, max_model_len=64)
    total = [n + steps for n in lengths]
    tables = [pages(1 + 5 * i, n) for i, n in enumerate(total)]
    seqs = [tokens(n, seed=i) for i, n in enumerate(total)]
    for runner in (ref, fast):
        forward(runner, ForwardBatch([ForwardSeq(s[:n], 0, t, "none") for s, n, t in zip(seqs, lengths, tables, strict=True)]))
    table = SlotTable(4, fast.max_pages)
    slot_of = [table.acquire() for _ in lengths]
    table.release(slot_of[1])  # slots need not be dense or ordered
    slot_of[1] = table.acquire()
    for step in range(steps):
        pos = [n + step for n in lengths]
        want = forward(ref, ForwardBatch([ForwardSeq([s[p]], p, t, "last") for s, p, t in zip(seqs, pos, tables, strict=True)]))
        used = [t[: p // PAGE_SIZE + 1] for t, p in zip(tables, pos, strict=True)]  # the pages the scheduler has grown
        entries = table.updates(list(zip(slot_of, used, strict=True)))
        if entries is not None:
            fast.state.apply(entries)
        order = [2, 0, 1]  # batch rows in another order than the slots
        rows = Step.of(StepKind.TARGET, [slot_of[i] for i in order], [seqs[i][pos[i]] for i in order],
                       [pos[i] for i in order]).rows
        got = fast._graph_forward(rows, fast.max_pages)  # what a captured graph runs: the static width
        assert got.shape == (3, fast.config.vocab_size) and got.dtype == torch.float32
        assert_logits_close(got, torch.stack([want[i] for i in order]), what=f"step {step}", **FP32_TOL)
        assert torch.isfinite(got).all()


def test_draft_steps_need_a_nextn_layer():
    runner = make_runner("tiny-v32")
    with pytest.raises(RuntimeError, match="NextN layer"):
        runner.run(Step.of(StepKind.CHAIN, [0], [0], [0]))
