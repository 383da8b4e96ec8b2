"""The CUDA C++ scan of the sampled-bound top-k against the Triton scan it replaces, bit for bit: from the same
bound, the same counts and the same candidates (keys >= the bound, in column order), over random, tied, NaN and
-inf rows, ragged and unaligned windows, overflowing slices, rows the sample skipped and rows taken whole, at
several program sizes; then the whole top-k with either scan against torch.topk's sets, eager and replayed in a
CUDA graph."""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.plugins.cuda_hopper.cuda import topk_scan
from dsa_runtime.plugins.cuda_hopper.triton.topk import SamplePlan, TopKConfig, TritonTopK
from dsa_runtime.plugins.cuda_hopper.triton.topk_sample import _sample_kernel, _scan_kernel
from tests.hopper.gpu_marks import HOPPER_GPU

pytestmark = [
    *HOPPER_GPU,
    pytest.mark.usefixtures("nvrtc_found"),
]
SKIP = 2147483647
KEY_MIN = -2147483648


def rows_of(kind: str, rows: int, width: int, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(rows, width, device="cuda", generator=gen)
    if kind == "ties":  # few distinct values: many keys equal to the bound
        x = torch.randint(0, 7, (rows, width), device="cuda", generator=gen).float()
    elif kind == "specials":  # NaN (ranks as -inf), -inf floods, -0.0 / +0.0
        x[:, ::3] = float("-inf")
        x[:, 1::7] = float("nan")
        x[:, 2::11] = -0.0
        x[0] = float("-inf")
    return x


def scan(x, starts, ends, bound, k, slices, caps, cuda=None):
    """(count, keys, columns) of the Triton scan (``cuda`` None) or of the CUDA scan with ``cuda`` = (round
    steps, threads), into poisoned buffers."""
    rows = x.shape[0]
    cnt = torch.full((rows, slices), -7, dtype=torch.int32, device="cuda")
    ckey = torch.full((rows, slices, caps), -7, dtype=torch.int32, device="cuda")
    ccol = torch.full((rows, slices, caps), -7, dtype=torch.int32, device="cuda")
    if cuda:
        topk_scan.launch_scan(x, starts, ends, bound, cnt, ckey, ccol, k, slices, caps, round_steps=cuda[0],
                              threads=cuda[1])
    else:
        _scan_kernel[(rows, slices)](x, x.stride(0), starts, ends, bound, cnt, ckey, ccol, k, slices, caps, 4.0,
                                     4096, SAMPLE=8192, CHUNK=32, FUSED=False, BLOCK=2048, num_warps=4)
    return cnt, ckey, ccol


@pytest.mark.parametrize(
    ("kind", "rows", "width", "k", "slices", "caps", "ragged"),
    [
        ("random", 64, 131072, 2048, 8, 4096, False),
        ("random", 5, 131072, 2048, 3, 4096, True),  # unaligned slice starts, windows <= k among them
        ("random", 7, 40000, 512, 1, 4096, True),
        ("ties", 6, 65536, 2048, 8, 1024, False),  # slices overflow their part (counts past caps)
        ("specials", 6, 65536, 2048, 16, 4096, True),
        ("random", 3, 4100, 64, 64, 8, True),  # more slices than 1024-column steps, tiny caps
    ],
)
def test_same_candidates_as_the_triton_scan(kind, rows, width, k, slices, caps, ragged):
    gen = torch.Generator(device="cuda").manual_seed(rows * 7 + slices)
    x = rows_of(kind, rows, width, gen)
    assert topk_scan.usable(x)
    if ragged:
        starts = torch.randint(0, width // 3, (rows,), device="cuda", generator=gen, dtype=torch.int32)
        ends = torch.minimum(starts + torch.randint(1, width, (rows,), device="cuda", generator=gen,
                                                    dtype=torch.int32), torch.tensor(width, device="cuda"))
        ends[0] = starts[0] + k  # a window of exactly k: taken whole, no scan
        ends = ends.to(torch.int32)
    else:
        starts = torch.zeros(rows, dtype=torch.int32, device="cuda")
        ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    bound = torch.empty(rows, dtype=torch.int32, device="cuda")
    _sample_kernel[(rows,)](x, x.stride(0), starts, ends, bound, k, 4.0, 4096, SAMPLE=8192, CHUNK=32, num_warps=8)
    if rows > 2:
        bound[1] = SKIP  # the sample saw an overflow: nothing read
        bound[2] = KEY_MIN  # every key a candidate
    cnt_t, key_t, col_t = scan(x, starts, ends, bound, k, slices, caps)
    for cuda in ((2, 256), (4, 128), (2, 512)):
        cnt_c, key_c, col_c = scan(x, starts, ends, bound, k, slices, caps, cuda)
        torch.cuda.synchronize()
        assert torch.equal(cnt_t, cnt_c), cuda
        assert (cnt_c >= 0).all()
        filled = torch.arange(caps, device="cuda")[None, None, :] < cnt_c[:, :, None].clamp(max=caps)
        assert torch.equal(key_t[filled], key_c[filled]) and torch.equal(col_t[filled], col_c[filled]), cuda
        assert (key_c[~filled] == -7).all() and (col_c[~filled] == -7).all()  # nothing written past the counts
        if rows > 2:
            assert int(cnt_c[1].sum()) == 0
            n2 = int(ends[2] - starts[2])
            assert int(cnt_c[2].sum()) == (n2 if n2 > k else 0)


def topk_sets(out: torch.Tensor) -> list[set[int]]:
    return [set(r[r >= 0].tolist()) for r in out.cpu()]


@pytest.mark.parametrize("rows", [1, 64])
def test_top_k_with_either_scan(rows):
    gen = torch.Generator(device="cuda").manual_seed(rows)
    width, k = 131072, 2048
    x = torch.randn(rows, width, device="cuda", generator=gen)
    starts = torch.zeros(rows, dtype=torch.int32, device="cuda")
    ends = torch.full((rows,), width, dtype=torch.int32, device="cuda")
    cuda = TritonTopK(TopKConfig())  # the CUDA scan
    triton_scan = TritonTopK(TopKConfig(sample=SamplePlan(cuda_scan=False)))
    got = cuda.topk(x, starts, ends, k)
    assert torch.equal(got, triton_scan.topk(x, starts, ends, k))
    want = torch.topk(x, k, dim=1).indices
    assert topk_sets(got) == topk_sets(want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = cuda.topk(x, starts, ends, k)
    x.copy_(torch.randn(rows, width, device="cuda", generator=gen))
    graph.replay()
    torch.cuda.synchronize()
    assert topk_sets(captured) == topk_sets(torch.topk(x, k, dim=1).indices)


def test_logits_it_cannot_read_take_the_triton_scan():
    x = torch.randn(2, 4099, device="cuda")  # width % 4 != 0: a 16-byte load could pass the row's end
    assert not topk_scan.usable(x)
    assert not topk_scan.usable(torch.randn(2, 4096, device="cuda")[:, 1:4093])  # rows not 16-byte aligned
    assert not topk_scan.usable(torch.randn(2, 4096, device="cuda").half())
    starts = torch.zeros(2, dtype=torch.int32, device="cuda")
    ends = torch.full((2,), 4099, dtype=torch.int32, device="cuda")
    got = TritonTopK(TopKConfig()).topk(x, starts, ends, 256)
    assert topk_sets(got) == topk_sets(torch.topk(x, 256, dim=1).indices)
