"""How many programs the register-resident top-k gives each row (pure host arithmetic, no GPU)."""

from __future__ import annotations

import pytest

from tests.hopper.interp_support import NEEDS_INTERPRETER

pytestmark = NEEDS_INTERPRETER  # the module imports triton


@pytest.mark.parametrize(
    ("rows", "width", "k", "want"),
    [
        (64, 32768, 2048, 2),  # 64 rows on 132 SMs: two slices each, merge 4096 candidates
        (4096, 8192, 2048, 1),  # rows fill the GPU
        (16, 32768, 2048, 4),  # slices stop at 8K (>= max(2k, 4096)) and merge_max 8192
        (1, 131072, 2048, 0),  # 4 slices of 32K would leave 128 SMs idle: the candidate search takes it
        (64, 131072, 2048, 4),  # 256 programs of 32K, merge 8192 candidates
        (8, 65536, 1024, 0),  # 16 programs: fewer than half the SMs
        (48, 65536, 1024, 2),  # 96 programs of 32K
        (64, 32768, 8192, 1),  # k too large to split
    ],
)
def test_bisect_split_for(rows, width, k, want):
    from dsa_runtime.plugins.cuda_hopper.triton.topk_bisect_split import bisect_split_for

    assert bisect_split_for(rows, width, k, 132) == want


@pytest.mark.parametrize(
    ("rows", "width", "k", "want"),
    [
        (1, 131072, 2048, (16, 4)),  # 16 slices of 8K, 4 groups of 4 x 2048 candidates, then 4 x 2048
        (8, 131072, 2048, (16, 4)),
        (64, 131072, 2048, (4, 1)),  # one level is enough
        (1, 131072, 1024, (32, 4)),
        (1, 131072, 8192, (0, 1)),  # one merge program holds a single slice's k: nothing fits
    ],
)
def test_bisect_plan_two_levels(rows, width, k, want):
    from dsa_runtime.plugins.cuda_hopper.triton.topk_bisect_split import bisect_plan

    assert bisect_plan(rows, width, k, 132, two_level=True) == want
    assert bisect_plan(rows, width, k, 132, two_level=False)[1] == 1
