"""Sparse MLA attention (prefill and paged decode, bf16 and 656-byte FP8 caches) against float64 loops."""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.reference import sparse_attn as sparse_attn_mod
from dsa_runtime.reference.kv_quant import ReferenceKVQuant
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn

from . import oracle64 as o

ATTN = ReferenceSparseAttn()
SM_SCALE = 0.135234


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_attn_close(out, lse, want_out, want_lse) -> None:
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    empty = torch.isposinf(want_lse)
    assert torch.equal(torch.isposinf(lse), empty)
    assert bool((out[empty] == 0).all())
    # out is rounded once to bf16 (8 significant bits); lse stays fp32.
    torch.testing.assert_close(out.double(), want_out, rtol=2**-8, atol=2e-3)
    torch.testing.assert_close(lse.double()[~empty], want_lse[~empty], rtol=1e-5, atol=1e-5)


def _indices(rows: int, k: int, n_valid: int, seed: int) -> torch.Tensor:
    """Random valid rows plus -1 padding, the last valid row, duplicates and one all-invalid row."""
    g = _gen(seed)
    idx = torch.randint(0, n_valid, (rows, k), generator=g)
    idx[0, k // 2 :] = -1  # -1 padded tail
    idx[1, 0] = n_valid - 1  # the last valid row (indices are -1 or valid; >= S is a caller error)
    idx[2, 1] = idx[2, 0]  # a duplicate contributes twice
    idx[3] = -1  # nothing valid: zeros and lse = +inf
    return idx.int()


@pytest.mark.parametrize("heads", [1, 16, 20, 128])
def test_prefill_matches_oracle(heads):
    g = _gen(heads)
    t, s, k = 6, 50, 16
    q = torch.randn(t, heads, 576, generator=g).bfloat16()
    kv = torch.randn(s, 576, generator=g).bfloat16()
    idx = _indices(t, k, s, heads)
    out, lse = ATTN.prefill(q, kv, idx, SM_SCALE)
    assert out.shape == (t, heads, 512) and lse.shape == (t, heads)
    want_out, want_lse = o.sparse_attention(q, kv, idx, SM_SCALE)
    assert_attn_close(out, lse, want_out, want_lse)
    assert bool(torch.isposinf(lse[3]).all()) and bool(torch.isfinite(lse[:3]).all())


def test_prefill_single_key_gives_that_row_and_natural_log_lse():
    g = _gen(5)
    q = torch.randn(1, 4, 576, generator=g).bfloat16()
    kv = torch.randn(3, 576, generator=g).bfloat16()
    out, lse = ATTN.prefill(q, kv, torch.tensor([[-1, 2, -1]], dtype=torch.int32), SM_SCALE)
    assert torch.equal(out[0], kv[2, :512].expand(4, 512))
    score = (q[0].double() @ kv[2].double()) * SM_SCALE  # ln(exp(score)) = score, not score * log2(e)
    torch.testing.assert_close(lse[0].double(), score, rtol=1e-6, atol=1e-5)


def test_prefill_d_v_and_chunking(monkeypatch):
    g = _gen(6)
    q = torch.randn(9, 3, 576, generator=g).bfloat16()
    kv = torch.randn(40, 576, generator=g).bfloat16()
    idx = _indices(9, 12, 40, 6)
    out, lse = ATTN.prefill(q, kv, idx, SM_SCALE, d_v=128)
    want_out, want_lse = o.sparse_attention(q, kv, idx, SM_SCALE, d_v=128)
    assert out.shape == (9, 3, 128)
    assert_attn_close(out, lse, want_out, want_lse)
    monkeypatch.setattr(sparse_attn_mod, "CHUNK_ELEMENTS", 1)  # one query per chunk
    out1, lse1 = ATTN.prefill(q, kv, idx, SM_SCALE, d_v=128)
    assert torch.equal(out1, out) and torch.equal(lse1, lse)


def _paged_cache(layout: str, pages: int, page_size: int, seed: int):
    """A cache filled through the reference store, and the f64 row of every slot decoded independently."""
    g = _gen(seed)
    n = pages * page_size
    c = torch.randn(n, 512, generator=g).bfloat16()
    k_pe = torch.randn(n, 64, generator=g).bfloat16()
    kv = ReferenceKVQuant()
    if layout == "fp8_656":
        cache = torch.zeros(pages, page_size, 656, dtype=torch.uint8)
    else:
        cache = torch.zeros(pages, page_size, 576, dtype=torch.bfloat16)
    kv.store_mla(cache, torch.randperm(n, generator=g), c, k_pe, layout=layout)
    flat = cache.reshape(n, -1)
    if layout == "fp8_656":
        rows = torch.stack([o.decode_656(flat[i].numpy().tobytes()) for i in range(n)])
    else:
        rows = flat.double()
    return cache, rows


@pytest.mark.parametrize(
    ("layout", "n_q", "page_size", "heads"),
    [("fp8_656", 1, 64, 16), ("fp8_656", 2, 16, 128), ("bf16", 1, 16, 1), ("bf16", 2, 64, 20)],
)
def test_decode_matches_oracle(layout, n_q, page_size, heads):
    pages, batch, k = 4, 5, 24
    cache, rows = _paged_cache(layout, pages, page_size, page_size + heads)
    g = _gen(heads)
    q = torch.randn(batch, n_q, heads, 576, generator=g).bfloat16()
    idx = _indices(batch * n_q, k, pages * page_size, n_q).view(batch, n_q, k)
    out, lse = ATTN.decode(q, cache, idx, SM_SCALE, layout=layout)
    assert out.shape == (batch, n_q, heads, 512) and lse.shape == (batch, n_q, heads)
    want_out, want_lse = o.sparse_attention(q.view(-1, heads, 576), rows, idx.view(batch * n_q, k), SM_SCALE)
    assert_attn_close(out.view(-1, heads, 512), lse.view(-1, heads), want_out, want_lse)


@pytest.mark.parametrize("bad", [-2, 50])
def test_out_of_range_indices_are_a_caller_error(bad):
    g = _gen(11)
    q = torch.randn(3, 4, 576, generator=g).bfloat16()
    kv = torch.randn(50, 576, generator=g).bfloat16()
    idx = torch.randint(0, 50, (3, 8), generator=g).int()
    idx[1, 2] = bad
    with pytest.raises(ValueError, match=r"indices must be -1 or in \[0, 50\)"):
        ATTN.prefill(q, kv, idx, SM_SCALE)
