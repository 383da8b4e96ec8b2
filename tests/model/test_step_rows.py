"""A per-sequence batch as token rows: ``batch_step`` writes each sequence's page table into its slot, the rows
give each token the position and cache slot of the per-sequence definition (``row_inputs``), ``spans`` finds
each sequence's run of rows, and bad input is one clear error before anything runs."""

from __future__ import annotations

import random

import pytest
import torch

from dsa_runtime.model.seqs import ForwardBatch, ForwardSeq, batch_step
from dsa_runtime.model.slots import SlotState, row_inputs
from dsa_runtime.model.step import spans

PAGE = 16


def _ragged(seed: int, n: int = 23) -> ForwardBatch:
    rng = random.Random(seed)
    seqs = []
    for _ in range(n):
        length = rng.choice([1, 1, 1, 2, 5, 40])
        start = rng.randrange(0, 300)
        pages = rng.sample(range(1, 4000), -(-(start + length) // PAGE) + rng.randrange(0, 3))  # spare pages too
        seqs.append(ForwardSeq([rng.randrange(1000) for _ in range(length)], start, pages,
                               rng.choice(["last", "all", "none"])))
    return ForwardBatch(seqs)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rows_give_positions_slots_and_runs_of_the_per_sequence_definition(seed):
    batch = _ragged(seed)
    step = batch_step(batch, page_size=PAGE, num_pages=4000, vocab_size=1000, max_requests=32)
    state = SlotState(32, 400 // PAGE, "cpu")
    state.apply(step.pages)
    ids, pos, kv_slots, lens, table = row_inputs(step.rows, state, PAGE, 400 // PAGE)
    firsts, counts = spans(step.rows)
    assert counts == [len(s.token_ids) for s in batch.seqs]
    row = 0
    picked = []
    for i, seq in enumerate(batch.seqs):
        n, end = len(seq.token_ids), seq.start_pos + len(seq.token_ids)
        assert firsts[i] == row
        assert ids[row:row + n].tolist() == seq.token_ids and step.rows[0, row:row + n].tolist() == [i] * n
        for j, p in enumerate(range(seq.start_pos, end)):
            assert int(pos[row + j]) == p and int(lens[row + j]) == p + 1
            assert int(kv_slots[row + j]) == seq.page_table[p // PAGE] * PAGE + p % PAGE
        assert table[row, :-(-end // PAGE)].tolist() == seq.page_table[:-(-end // PAGE)]
        picked += {"last": [row + n - 1], "all": list(range(row, row + n)), "none": []}[seq.logits]
        row += n
    assert step.num_rows == row and step.pick.tolist() == picked


def test_device_tokens_are_read_from_the_slot_state():
    state = SlotState(3, 2, "cpu", drafts=2)
    state.tokens[1] = torch.tensor([70, 71, 72])
    state.publish(torch.tensor([0]), torch.tensor([60]))
    rows = torch.tensor([[0, 1, 1, 1, 2], [-1, -1, -2, -3, 5], [4, 5, 6, 7, 0]])
    ids = row_inputs(rows, state, PAGE, 2)[0]
    assert ids.tolist() == [60, 70, 71, 72, 5]


def test_bad_input_is_one_clear_error():
    ok = {"page_size": PAGE, "num_pages": 100, "vocab_size": 50, "max_requests": 4}
    with pytest.raises(ValueError, match="page ids must be in"):
        batch_step(ForwardBatch([ForwardSeq([1, 2], 0, [0])]), **ok)
    with pytest.raises(ValueError, match="page ids must be in"):
        batch_step(ForwardBatch([ForwardSeq([1], 0, [100])]), **ok)
    with pytest.raises(ValueError, match="token id out of range"):
        batch_step(ForwardBatch([ForwardSeq([1, 50], 0, [3])]), **ok)
    with pytest.raises(ValueError, match="2 needed"):
        batch_step(ForwardBatch([ForwardSeq([1] * 3, 15, [3])]), **ok)
    with pytest.raises(ValueError, match="5 sequences need as many request slots"):
        batch_step(ForwardBatch([ForwardSeq([1], 0, [3])] * 5), **ok)
