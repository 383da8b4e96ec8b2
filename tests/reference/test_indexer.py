"""Lightning indexer against the float64 oracle: quantization, ragged prefill logits, paged decode logits."""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.reference import indexer as indexer_mod
from dsa_runtime.reference.indexer import ReferenceIndexer
from dsa_runtime.reference.kv_quant import ReferenceKVQuant

from . import oracle64 as o

IDX = ReferenceIndexer()
NEG_INF = float("-inf")


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _qk(t: int, h: int, s: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = _gen(seed)
    q = (torch.randn(t, h, 128, generator=g) * torch.logspace(-2, 1, h)[None, :, None]).bfloat16()
    k = (torch.randn(s, 128, generator=g) + 0.3).bfloat16()  # offset: some q.k positive, some negative
    hw = torch.randn(t, h, generator=g)
    return q, k, hw


def assert_logits_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Same -inf pattern; finite values equal up to fp32 summation error (relative to the row's scale)."""
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(torch.isneginf(got), torch.isneginf(want))
    finite = ~torch.isneginf(want)
    scale = want[finite].abs().max().clamp_min(1e-30) if finite.any() else torch.tensor(1.0)
    torch.testing.assert_close(got[finite].double(), want[finite], rtol=1e-5, atol=1e-6 * float(scale))


@pytest.mark.parametrize("fmt", ["ue8m0", "float"])
@pytest.mark.parametrize("heads", [1, 16, 20, 64])
def test_quantize_matches_oracle(fmt, heads):
    q, k, hw = _qk(5, heads, 9, heads)
    q8, w = IDX.quantize_q(q, hw, scale_fmt=fmt)
    k8, k_scale = IDX.quantize_k(k, scale_fmt=fmt)
    want_q8, want_qs, want_k8, want_ks = o.indexer_quant(q, k, fmt)
    assert q8.dtype == k8.dtype == torch.float8_e4m3fn and w.dtype == k_scale.dtype == torch.float32
    assert q8.shape == (5, heads, 128) and w.shape == (5, heads) and k_scale.shape == (9,)
    # The rotation is fp32 in the reference and f64 in the oracle: amax (hence a "float" scale) may differ in
    # the last fp32 bit, and an e4m3 code sitting on a rounding midpoint could flip by one step. ue8m0 scales
    # absorb the amax noise, so there everything must match exactly.
    exact = fmt == "ue8m0"
    tol = {"rtol": 0, "atol": 0} if exact else {"rtol": 4e-7, "atol": 0}
    torch.testing.assert_close(k_scale.double(), want_ks, **tol)
    want_w = hw.double() * heads**-0.5 * want_qs * 128**-0.5
    torch.testing.assert_close(w.double(), want_w, rtol=1e-6, atol=0)
    for got8, want8 in ((q8, want_q8), (k8, want_k8)):
        differ = got8.double() != want8
        assert int(differ.sum()) <= (0 if exact else 1 + differ.numel() // 1000)
        assert bool(((got8.double() - want8).abs()[differ] <= want8.abs()[differ] / 8 + 2**-9).all())


def _ragged_batch(lengths: list[int], starts: list[int]):
    """Queries of several requests over their concatenated keys; request r's query i sits at position
    ``starts[r] + i`` (chunked prefill when starts[r] > 0) and sees keys 0..that position of its request."""
    ks, ke, offset = [], [], 0
    for length, start in zip(lengths, starts, strict=True):
        for i in range(length - start):
            ks.append(offset)
            ke.append(offset + start + i + 1)
        offset += length
    return torch.tensor(ks, dtype=torch.int32), torch.tensor(ke, dtype=torch.int32), offset


@pytest.mark.parametrize("fmt", ["ue8m0", "float"])
@pytest.mark.parametrize("heads", [1, 20, 64])
def test_logits_ragged_matches_oracle(fmt, heads):
    ks, ke, total = _ragged_batch([6, 1, 9], [0, 0, 4])
    # Two extra rows: an empty window, and a window in the middle of the key buffer.
    ks = torch.cat([ks, torch.tensor([3, 2], dtype=torch.int32)])
    ke = torch.cat([ke, torch.tensor([3, 11], dtype=torch.int32)])
    q, k, hw = _qk(len(ks), heads, total, 10 + heads)
    q8, w = IDX.quantize_q(q, hw, scale_fmt=fmt)
    k8, k_scale = IDX.quantize_k(k, scale_fmt=fmt)
    got = IDX.logits_ragged(q8, w, k8, k_scale, ks, ke)
    want = o.indexer_logits(q, hw, k, ks, ke, fmt)
    assert_logits_close(got, want)
    assert bool(torch.isneginf(got[-2]).all())  # the empty window
    assert bool(torch.isfinite(got[-1, 2:11]).all())


def test_logits_are_chunked_without_a_full_t_h_s_block(monkeypatch):
    """With a tiny chunk budget the result is unchanged and no einsum output exceeds the budget."""
    q, k, hw = _qk(12, 16, 40, 7)
    ks = torch.zeros(12, dtype=torch.int32)
    ke = torch.arange(29, 41, dtype=torch.int32)
    q8, w = IDX.quantize_q(q, hw)
    k8, k_scale = IDX.quantize_k(k)
    full = IDX.logits_ragged(q8, w, k8, k_scale, ks, ke)
    budget = 3 * 40  # forces 3 heads x 1 row per step
    monkeypatch.setattr(indexer_mod, "CHUNK_ELEMENTS", budget)
    sizes = []
    real_einsum = torch.einsum

    def spy(eq, *ops):
        res = real_einsum(eq, *ops)
        sizes.append(res.numel())
        return res

    monkeypatch.setattr(torch, "einsum", spy)
    chunked = IDX.logits_ragged(q8, w, k8, k_scale, ks, ke)
    assert max(sizes) <= budget and len(sizes) > 12
    torch.testing.assert_close(chunked, full, rtol=1e-6, atol=1e-6)


def _paged_setup(lens: list[int], n_q: int, heads: int, page_size: int, seed: int, fmt: str):
    """Write each request's keys into shuffled physical pages; return everything both sides need."""
    g = _gen(seed)
    max_pages = max(-(-n // page_size) for n in lens)
    n_pages = len(lens) * max_pages + 1
    perm = torch.randperm(n_pages, generator=g).to(torch.int32)
    block_table = perm[: len(lens) * max_pages].view(len(lens), max_pages)
    cache = torch.full((n_pages, page_size * 132), 0x7F, dtype=torch.uint8)  # NaN-ish poison bytes
    kv = ReferenceKVQuant()
    keys = []
    for b, length in enumerate(lens):
        k = (torch.randn(length, 128, generator=g) + 0.2).bfloat16()
        k8, k_scale = IDX.quantize_k(k, scale_fmt=fmt)
        pos = torch.arange(length)
        slots = block_table[b, pos // page_size].long() * page_size + pos % page_size
        kv.store_index_k(cache, slots, k8, k_scale)
        keys.append(k)
    q = (torch.randn(len(lens), n_q, heads, 128, generator=g)).bfloat16()
    hw = torch.randn(len(lens) * n_q, heads, generator=g)
    return q, hw, keys, cache, block_table


@pytest.mark.parametrize(
    ("n_q", "page_size", "heads", "fmt"), [(1, 64, 64, "ue8m0"), (2, 16, 16, "float"), (2, 64, 1, "ue8m0")]
)
def test_logits_paged_matches_oracle(n_q, page_size, heads, fmt):
    lens = [3, 70, 33]  # partial last pages; 70 spans two pages of 64
    max_len = 80
    q, hw, keys, cache, block_table = _paged_setup(lens, n_q, heads, page_size, n_q * 100 + page_size, fmt)
    q8, w = IDX.quantize_q(q.view(-1, heads, 128), hw, scale_fmt=fmt)
    got = IDX.logits_paged(
        q8.view(len(lens), n_q, heads, 128),
        w,
        cache,
        torch.tensor(lens, dtype=torch.int32),
        block_table,
        max_len,
    )
    assert got.shape == (len(lens) * n_q, max_len)
    for b, length in enumerate(lens):
        for j in range(n_q):
            row = b * n_q + j
            visible = length - n_q + j + 1
            want = torch.full((1, max_len), NEG_INF, dtype=torch.float64)
            want[:, :length] = o.indexer_logits(
                q[b, j : j + 1], hw[row : row + 1], keys[b], [0], [visible], fmt
            )
            assert_logits_close(got[row : row + 1], want)
            assert bool(torch.isfinite(got[row, :visible]).all()) and bool(
                torch.isneginf(got[row, visible:]).all()
            )
