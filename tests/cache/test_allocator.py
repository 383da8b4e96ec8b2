"""PageAllocator: page 0 reserved, all-or-nothing allocation, frees checked."""

from __future__ import annotations

import pytest

from dsa_runtime.cache import PageAllocator


def test_page_zero_is_never_handed_out_and_everything_else_is():
    alloc = PageAllocator(6)
    assert alloc.capacity == 5 and alloc.num_free == 5 and alloc.num_used == 0
    got = alloc.alloc(5)
    assert sorted(got) == [1, 2, 3, 4, 5]
    assert alloc.num_free == 0 and alloc.num_used == 5
    assert alloc.alloc(1) is None


def test_alloc_is_all_or_nothing_and_free_returns_pages():
    alloc = PageAllocator(5)
    a = alloc.alloc(3)
    assert alloc.alloc(2) is None and alloc.num_free == 1  # nothing taken by the failed call
    alloc.free(a[:2])
    assert alloc.num_free == 3 and alloc.can_alloc(3) and not alloc.can_alloc(4)
    b = alloc.alloc(3)
    assert set(b).isdisjoint({a[2]}) and 0 not in b
    alloc.free(b + [a[2]])
    assert alloc.num_used == 0 and alloc.num_free == 4


def test_double_free_and_foreign_pages_are_rejected_without_side_effects():
    alloc = PageAllocator(4)
    pages = alloc.alloc(2)
    with pytest.raises(ValueError, match="not in use"):
        alloc.free([pages[0], pages[0]])
    with pytest.raises(ValueError, match="page 0 is not in use"):
        alloc.free([pages[1], 0])
    assert alloc.num_used == 2  # the failed calls freed nothing
    alloc.free(pages)
    with pytest.raises(ValueError, match="not in use"):
        alloc.free([pages[0]])


def test_bad_sizes():
    with pytest.raises(ValueError, match="page 0 is reserved"):
        PageAllocator(1)
    with pytest.raises(ValueError, match="cannot allocate"):
        PageAllocator(3).alloc(-1)
    assert PageAllocator(3).alloc(0) == []
