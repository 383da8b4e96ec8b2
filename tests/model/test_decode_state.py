"""GPU-resident decode state on CPU: request slots and their block tables, the tensor-only decode step
(``ModelRunner.decode``) against the per-sequence forward, ragged batches across ``index_topk`` and page
boundaries, slot reuse, and the CUDA-graph bucket list."""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.model.decode_graph import default_batch_sizes
from dsa_runtime.model.decode_state import DecodePlan, RequestSlots, decode_inputs
from dsa_runtime.model.runner import ForwardBatch, ForwardSeq
from tests.model.helpers import FP32_TOL, PAGE_SIZE, assert_logits_close, make_runner, pages, tokens


def test_slots_hand_out_rows_and_sync_only_new_pages():
    slots = RequestSlots(max_requests=3, max_pages=4, device="cpu")
    a, b = slots.acquire(), slots.acquire()
    assert (a, b) == (0, 1) and slots.num_free == 1
    slots.sync([(a, [5, 6]), (b, [9])])
    assert slots.block_table[:2].tolist() == [[5, 6, 0, 0], [9, 0, 0, 0]]
    slots.block_table[a, 0] = -7  # a synced entry is not written again
    slots.sync([(a, [5, 6, 7]), (b, [9])])
    assert slots.block_table[a].tolist() == [-7, 6, 7, 0]
    slots.release(a)
    with pytest.raises(ValueError, match="not in use"):
        slots.release(a)
    again = slots.acquire()
    assert again == a
    slots.sync([(again, [11])])  # a new owner's pages overwrite the stale row from its start
    assert slots.block_table[again, 0] == 11
    assert slots.block_table[slots.null_slot].tolist() == [0, 0, 0, 0]
    slots.acquire()
    with pytest.raises(RuntimeError, match="all 3 request slots are in use"):
        slots.acquire()
    with pytest.raises(ValueError, match="exceed the block table"):
        slots.sync([(b, [1, 2, 3, 4, 5])])


def test_decode_inputs_derive_slots_and_lengths_on_the_device():
    table = torch.tensor([[3, 4, 5], [7, 0, 0], [0, 0, 0]], dtype=torch.int32)
    rows = torch.tensor([[0, 1, 2], [11, 12, 0], [17, 2, 0]])  # slot, token, position (row 2: the null slot)
    ids, pos, kv_slots, lens, tab = decode_inputs(rows, table, page_size=8, pages=3)
    assert ids.tolist() == [11, 12, 0] and pos.tolist() == [17, 2, 0]
    assert kv_slots.tolist() == [5 * 8 + 1, 7 * 8 + 2, 0] and lens.tolist() == [18, 3, 1]
    assert lens.dtype == torch.int32 and tab.tolist() == table.tolist()


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
    fast.setup_decode(max_requests=4, max_model_len=64)
    total = [n + steps for n in lengths]
    tables = [pages(1 + 5 * i, n) for i, n in enumerate(total)]
    seqs = [tokens(n, seed=i) for i, n in enumerate(total)]
    for runner in (ref, fast):
        runner.forward(ForwardBatch([ForwardSeq(s[:n], 0, t, "none") for s, n, t in zip(seqs, lengths, tables, strict=True)]))
    slot_of = [fast.request_slots.acquire() for _ in lengths]
    fast.request_slots.release(slot_of[1])  # slots need not be dense or ordered
    slot_of[1] = fast.request_slots.acquire()
    for step in range(steps):
        pos = [n + step for n in lengths]
        want = ref.forward(ForwardBatch([ForwardSeq([s[p]], p, t, "last") for s, p, t in zip(seqs, pos, tables, strict=True)]))
        used = [t[: p // PAGE_SIZE + 1] for t, p in zip(tables, pos, strict=True)]  # the pages the scheduler has grown
        fast.request_slots.sync(list(zip(slot_of, used, strict=True)))
        order = [2, 0, 1]  # batch rows in another order than the slots
        got = fast.decode(DecodePlan.from_lists([slot_of[i] for i in order], [seqs[i][pos[i]] for i in order],
                                                [pos[i] for i in order]))
        assert got.shape == (3, fast.config.vocab_size) and got.dtype == torch.float32
        assert_logits_close(got, torch.stack([want[i] for i in order]), what=f"step {step}", **FP32_TOL)
        assert torch.isfinite(got).all()


def test_decode_needs_setup():
    runner = make_runner("tiny-v32")
    with pytest.raises(RuntimeError, match="setup_decode"):
        runner.decode(DecodePlan.from_lists([0], [1], [0]))
