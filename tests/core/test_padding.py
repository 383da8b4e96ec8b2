"""pad_target over every ValueSet form, and the padding wrapper's trim against the unpadded kernel."""

from __future__ import annotations

import torch

from dsa_runtime.capabilities import MethodClaim, ValueSet
from dsa_runtime.padding import PaddedSparseAttn, pad_target, padded_needs, padding_note
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn


def test_pad_target_smallest_claimed_value_that_fits():
    assert pad_target(ValueSet.one_of(64, 128), 4) == 64
    assert pad_target(ValueSet.one_of(64, 128), 64) == 64
    assert pad_target(ValueSet.one_of(64, 128), 65) == 128
    assert pad_target(ValueSet.one_of(64, 128), 129) is None
    assert pad_target(ValueSet.multiples(128, 128, 16384), 32) == 128
    assert pad_target(ValueSet.multiples(64, 64, 16384), 2049) == 2112
    assert pad_target(ValueSet.multiples(64, 256, 512), 16) == 256
    assert pad_target(ValueSet.multiples(64, 64, 512), 513) is None
    assert pad_target(ValueSet.any(), 7) == 7
    assert pad_target(ValueSet.one_of(), 7) is None


def test_padded_needs_only_for_attention_heads_and_k():
    claim = MethodClaim(heads=ValueSet.one_of(64), k=ValueSet.multiples(128, 128, 2048), page_sizes={64})
    needs = {"device": "cpu", "heads": 16, "k": 2048, "page_size": 16}
    assert padded_needs("sparse_attn.decode", claim, needs) == {**needs, "heads": 64}
    assert padded_needs("topk.topk", claim, needs) == needs  # top-k k is never padded
    assert padding_note("sparse_attn.decode", claim, needs) == "pads heads 16 -> 64"
    assert padding_note("sparse_attn.decode", claim, {"heads": 64}) == ""


def test_wrapper_trims_to_the_unpadded_result():
    g = torch.Generator().manual_seed(0)
    ref = ReferenceSparseAttn()
    q = torch.randn(5, 3, 576, generator=g).bfloat16()
    kv = torch.randn(40, 576, generator=g).bfloat16()
    idx = torch.randint(0, 40, (5, 20), generator=g).int()
    idx[:, 15:] = -1
    idx[2] = -1  # a query with no valid row: zeros and lse +inf survive the trim
    fn = PaddedSparseAttn(ref.prefill, "sparse_attn.prefill",
                          MethodClaim(heads=ValueSet.one_of(64), k=ValueSet.multiples(64, 64, 128)))
    out, lse = fn(q, kv, idx, 0.135)
    want_out, want_lse = ref.prefill(q, kv, idx, 0.135)
    assert out.shape == (5, 3, 512) and lse.shape == (5, 3) and out.is_contiguous()
    # The padded call may sum in another order (fp32): at most one bf16 rounding apart. Its 576-term fp32 dot
    # products at other shapes (and, with MKL, other buffer alignments) move |scores| ~3 by up to ~1e-5 each, so
    # the lse gets 1e-4: a wrong trim is off by O(1). (1e-5 failed once in a full CI run: 2.9e-5, 2026-11-26.)
    torch.testing.assert_close(out, want_out, rtol=8e-3, atol=1e-3)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-4)
    assert torch.isposinf(lse[2]).all() and (out[2] == 0).all()
