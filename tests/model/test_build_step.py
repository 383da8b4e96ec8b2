"""build_step, vectorised over the batch, gives each token the position and cache slot of the per-sequence
definition, and page tables padded once for the whole step (``StepMeta.tables_of``)."""

from __future__ import annotations

import random

import pytest
import torch

from dsa_runtime.model.batch import ForwardBatch, ForwardSeq, build_step

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
def test_positions_slots_and_tables_match_the_per_sequence_definition(seed):
    batch = _ragged(seed)
    step = build_step(batch, page_size=PAGE, num_pages=4000, vocab_size=1000, device="cpu")
    row = 0
    for i, (seq, meta) in enumerate(zip(batch.seqs, step.seqs, strict=True)):
        n, end = len(seq.token_ids), seq.start_pos + len(seq.token_ids)
        need = -(-end // PAGE)
        assert (meta.index, meta.t0, meta.t1, meta.start_pos, meta.end_pos) == (i, row, row + n, seq.start_pos, end)
        assert meta.page_table.tolist() == seq.page_table[:need]
        assert step.token_ids[row:row + n].tolist() == seq.token_ids
        for j, p in enumerate(range(seq.start_pos, end)):
            assert int(step.positions[row + j]) == p
            assert int(step.slots[row + j]) == seq.page_table[p // PAGE] * PAGE + p % PAGE
        row += n
    assert step.num_tokens == row
    widths = [len(m.page_table) for m in step.seqs]
    assert step.page_tables.shape == (len(batch.seqs), max(widths))
    assert all(int(step.page_tables[i, w:].abs().sum()) == 0 for i, w in enumerate(widths))  # zero padding


def test_tables_of_a_subset_equals_padding_its_own_tables():
    step = build_step(_ragged(5), page_size=PAGE, num_pages=4000, vocab_size=1000, device="cpu")
    for pick in ([3, 7, 8, 20], list(range(4, 9)), [11], list(range(len(step.seqs)))):
        seqs = [step.seqs[i] for i in pick]
        want = torch.nn.utils.rnn.pad_sequence([s.page_table for s in seqs], batch_first=True)
        assert torch.equal(step.tables_of(seqs), want), pick


def test_bad_input_is_one_clear_error():
    ok = {"page_size": PAGE, "num_pages": 100, "vocab_size": 50, "device": "cpu"}
    with pytest.raises(ValueError, match="page ids must be in"):
        build_step(ForwardBatch([ForwardSeq([1, 2], 0, [0])]), **ok)
    with pytest.raises(ValueError, match="page ids must be in"):
        build_step(ForwardBatch([ForwardSeq([1], 0, [100])]), **ok)
    with pytest.raises(ValueError, match="token id out of range"):
        build_step(ForwardBatch([ForwardSeq([1, 50], 0, [3])]), **ok)
    with pytest.raises(ValueError, match="2 needed"):
        build_step(ForwardBatch([ForwardSeq([1] * 3, 15, [3])]), **ok)
