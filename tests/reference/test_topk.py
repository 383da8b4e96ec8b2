"""Top-k over row windows and the page-table transform against explicit per-row loops."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsa_runtime.reference.topk import ReferenceTopK

from . import oracle64 as o

TK = ReferenceTopK()
NEG_INF = float("-inf")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _as_sets(x: torch.Tensor) -> list[list[int]]:
    return [sorted(row) for row in x.tolist()]


@pytest.mark.parametrize(("rows", "width", "k"), [(40, 300, 32), (6, 5000, 2048)])
def test_topk_random_ragged_matches_oracle(rows, width, k):
    g = _gen(width)
    logits = torch.randn(rows, width, generator=g)
    starts = torch.randint(0, width * 2 // 3, (rows,), generator=g)
    lengths = torch.randint(0, width // 3 + k, (rows,), generator=g)
    lengths[:3] = torch.tensor([0, 5, k - 1])  # empty window, rows shorter than k
    ends = torch.minimum(starts + lengths, torch.tensor(width))
    got = TK.topk(logits, starts.int(), ends.int(), k)
    assert got.dtype == torch.int32 and got.shape == (rows, k)
    want = o.topk(logits, starts, ends, k)
    assert _as_sets(got) == [sorted(r) for r in want]
    assert got[0].tolist() == [-1] * k
    assert (got[1] >= 0).sum() == 5 and (got[2] >= 0).sum() == k - 1
    assert bool(((got >= 0).sum(1) == torch.clamp(ends - starts, max=k)).all())


def test_topk_best_first_and_ties_lower_column():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 3.0]])
    got = TK.topk(logits, torch.tensor([0]), torch.tensor([7]), 3)
    assert got.tolist() == [[1, 2, 4]]  # four 3.0s, the three lowest columns; best first
    got = TK.topk(logits, torch.tensor([2]), torch.tensor([7]), 2)
    assert got.tolist() == [[0, 2]]  # relative to the start: columns 2 and 4


def test_topk_neg_inf_in_window_is_a_candidate_and_outside_is_ignored():
    logits = torch.tensor([[100.0, NEG_INF, NEG_INF, 5.0, 100.0]])
    got = TK.topk(logits, torch.tensor([1]), torch.tensor([4]), 3)
    assert sorted(got[0].tolist()) == [0, 1, 2]  # both -inf kept, out-of-window 100s never picked
    got = TK.topk(logits, torch.tensor([1]), torch.tensor([4]), 5)
    assert got[0].tolist() == [2, 0, 1, -1, -1]


def test_topk_nan_is_treated_as_neg_inf():
    nan = float("nan")
    logits = torch.tensor([[nan, 1.0, NEG_INF, nan, 2.0]])
    got = TK.topk(logits, torch.tensor([0]), torch.tensor([5]), 3)
    assert got[0].tolist() == [4, 1, 0]  # then NaN@0 ties -inf@2 and NaN@3: the lower column wins
    assert o.topk(logits, [0], [5], 3) == [[4, 1, 0]]


def test_topk_k_larger_than_width():
    logits = torch.tensor([[0.5, -1.0, 2.0]])
    got = TK.topk(logits, torch.tensor([0]), torch.tensor([3]), 2048)
    assert got.shape == (1, 2048) and got[0, :3].tolist() == [2, 0, 1] and bool((got[0, 3:] == -1).all())


def test_topk_rejects_bad_windows():
    with pytest.raises(ValueError):
        TK.topk(torch.zeros(1, 4), torch.tensor([3]), torch.tensor([2]), 1)
    with pytest.raises(ValueError):
        TK.topk(torch.zeros(1, 4), torch.tensor([0]), torch.tensor([5]), 1)


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(st.sampled_from([-2.0, -0.5, 0.0, 0.5, 1.0, NEG_INF]), min_size=1, max_size=40),
    data=st.data(),
)
def test_topk_property_ties_and_windows(values, data):
    """Few distinct values: heavy ties. The set must equal the oracle's (lower column wins)."""
    width = len(values)
    start = data.draw(st.integers(0, width))
    end = data.draw(st.integers(start, width))
    k = data.draw(st.integers(1, 12))
    logits = torch.tensor([values])
    got = TK.topk(logits, torch.tensor([start]), torch.tensor([end]), k)
    want = o.topk(logits, [start], [end], k)
    assert sorted(got[0].tolist()) == sorted(want[0])


def test_page_table_transform_matches_oracle():
    g = _gen(1)
    page_size, n_batch, max_pages = 16, 3, 5
    page_table = torch.randperm(n_batch * max_pages, generator=g).int().view(n_batch, max_pages)
    row_to_batch = torch.tensor([0, 2, 2, 1], dtype=torch.int32)
    idx = torch.randint(0, max_pages * page_size, (4, 9), generator=g).int()
    idx[0, 3:] = -1
    idx[2, 0] = -1
    got = TK.page_table_transform(idx, page_table, row_to_batch, page_size)
    assert got.dtype == torch.int32
    assert got.tolist() == o.page_transform(idx, page_table, row_to_batch, page_size)
    assert bool((got[idx == -1] == -1).all())


def test_topk_transform_is_the_composition():
    g = _gen(2)
    logits = torch.randn(5, 64, generator=g)
    starts = torch.tensor([0, 0, 10, 20, 64], dtype=torch.int32)
    ends = torch.tensor([1, 40, 64, 30, 64], dtype=torch.int32)
    page_table = torch.randperm(12, generator=g).int().view(3, 4)
    row_to_batch = torch.tensor([0, 1, 2, 1, 0], dtype=torch.int32)
    got = TK.topk_transform(logits, starts, ends, 8, page_table, row_to_batch, 16)
    composed = TK.page_table_transform(TK.topk(logits, starts, ends, 8), page_table, row_to_batch, 16)
    assert torch.equal(got, composed)
    positions = o.topk(logits, starts, ends, 8)
    assert got.tolist() == o.page_transform(torch.tensor(positions), page_table, row_to_batch, 16)
