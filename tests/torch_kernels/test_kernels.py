"""Targeted checks of the ``torch`` backend's own machinery, beyond what the conformance kit sends.

Each test pins one of its speed tricks to the reference's values: the e4m3 lookup table, the bit-level ue8m0
round-up, top-k's ranking keys, the two prefill strategies, page-level gathers with junk table entries, the
expert-weight cache and routing ties.
"""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.families import ExpertWeights
from dsa_runtime.reference.fp8 import block_quant_weight
from dsa_runtime.reference.fp8 import quantize_blocks as ref_quantize
from dsa_runtime.reference.indexer import ReferenceIndexer
from dsa_runtime.reference.kv_quant import ReferenceKVQuant
from dsa_runtime.reference.moe import ReferenceMoE
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn
from dsa_runtime.reference.topk import ReferenceTopK
from dsa_runtime.torch_kernels import e4m3, expert_cache, sparse_attn
from dsa_runtime.torch_kernels.indexer import TorchIndexer
from dsa_runtime.torch_kernels.moe import TorchMoE
from dsa_runtime.torch_kernels.quant import quantize_blocks
from dsa_runtime.torch_kernels.sparse_attn import TorchSparseAttn
from dsa_runtime.torch_kernels.topk import TorchTopK


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_e4m3_table_matches_the_cast_for_every_code():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(16, 16)
    want = codes.view(torch.float8_e4m3fn).float()
    got = e4m3.to_float(codes.view(torch.float8_e4m3fn))
    same = (got == want) | (got.isnan() & want.isnan())
    assert bool(same.all()) and int(want.isnan().sum()) == 2 and got.shape == (16, 16)


@pytest.mark.parametrize("scale_fmt", ["ue8m0", "float"])
def test_block_quantization_is_bit_identical_to_the_reference(scale_fmt):
    g = gen(1)
    for magnitude in (1e-7, 3e-3, 1.0, 448.0, 5e4):
        x = torch.randn(20, 3, 256, generator=g) * magnitude
        x[0, 0, :128] = 448 * 2.0**-5  # amax / 448 exactly a power of two: must stay itself under ue8m0
        got8, got_s = quantize_blocks(x.to(torch.bfloat16), scale_fmt)
        want8, want_s = ref_quantize(x.to(torch.bfloat16), scale_fmt)
        assert torch.equal(got_s, want_s), magnitude
        assert torch.equal(got8.view(torch.uint8), want8.view(torch.uint8)), magnitude


def _selected_values(logits: torch.Tensor, picks: torch.Tensor, starts: torch.Tensor) -> list[list[float]]:
    rows = []
    for r in range(picks.shape[0]):
        cols = picks[r][picks[r] >= 0].long() + starts[r]
        vals = logits[r, cols]
        vals = torch.where(vals.isnan(), float("-inf"), vals)  # NaN ranks as -inf (nan_to_num would map -inf too)
        rows.append(sorted(vals.tolist()))
    return rows


def test_topk_ranks_in_window_minus_inf_and_nan_above_the_outside_and_keeps_flt_max_exact():
    big = torch.finfo(torch.float32).max
    logits = torch.randn(4, 12, generator=gen(2))
    logits[0, 2:6] = torch.tensor([float("-inf"), float("nan"), -big, 0.5])  # ambiguous row: float64 path
    logits[0, 6:] = 1e30  # outside the window: never chosen
    logits[1, :] = float("-inf")
    logits[2, 3] = float("nan")
    starts = torch.tensor([2, 0, 1, 5], dtype=torch.int32)
    ends = torch.tensor([6, 12, 9, 5], dtype=torch.int32)
    k = 3
    got = TorchTopK().topk(logits, starts, ends, k)
    want = ReferenceTopK().topk(logits, starts, ends, k)
    assert _selected_values(logits, got, starts) == _selected_values(logits, want, starts)
    assert sorted(got[0].tolist())[1:] == [2, 3] and -1 not in got[1].tolist()  # 0.5 and -FLT_MAX, then one of -inf/NaN
    assert got[3].tolist() == [-1, -1, -1]  # empty window


def test_prefill_strategies_agree_with_duplicates_and_poison_outside_the_selection(monkeypatch):
    g = gen(3)
    q = torch.randn(6, 16, 576, generator=g).to(torch.bfloat16)
    kv = torch.randn(40, 576, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, 39, (6, 16), generator=g, dtype=torch.int32)
    idx[0, :4] = 7  # duplicates each contribute
    idx[1] = -1  # an empty query
    idx[2, 10:] = -1
    want = ReferenceSparseAttn().prefill(q, kv, idx, 0.135234)
    kernel = TorchSparseAttn()
    for factor in (100, 0):  # dense-then-select, then gather
        monkeypatch.setattr(sparse_attn, "DENSE_FACTOR", factor)
        out, lse = kernel.prefill(q, kv, idx, 0.135234)
        torch.testing.assert_close(out.float(), want[0].float(), rtol=1.6e-2, atol=1e-2)
        torch.testing.assert_close(lse, want[1], rtol=1e-4, atol=2e-3)
        assert bool((out[1] == 0).all()) and bool(torch.isposinf(lse[1]).all())
    poisoned = kv.clone()
    poisoned[39] = float("nan")  # never selected: must not reach any output (forces the gather strategy)
    monkeypatch.setattr(sparse_attn, "DENSE_FACTOR", 100)
    out, lse = kernel.prefill(q, poisoned, idx, 0.135234)
    assert bool(torch.isfinite(out).all())
    torch.testing.assert_close(out.float(), want[0].float(), rtol=1.6e-2, atol=1e-2)


def test_logits_paged_ignores_junk_block_table_entries_past_each_context():
    g = gen(4)
    page, pages, batch, heads = 16, 12, 3, 8
    cache = torch.randint(0, 256, (pages, page * 132), generator=g, dtype=torch.uint8)
    kvq, idx = ReferenceKVQuant(), ReferenceIndexer()
    k8, k_scale = idx.quantize_k(torch.randn(pages * page, 128, generator=g))
    kvq.store_index_k(cache, torch.arange(pages * page), k8, k_scale)
    q8, w = idx.quantize_q(torch.randn(batch * 2, heads, 128, generator=g), torch.randn(batch * 2, heads, generator=g))
    q8 = q8.view(batch, 2, heads, 128)
    lens = torch.tensor([5, 33, 17], dtype=torch.int32)
    table = torch.tensor([[3, 999, -7, 5], [0, 11, 4, -1], [7, 2, 123456, 6]], dtype=torch.int32)  # junk past lens
    want = idx.logits_paged(q8, w, cache, lens, table, 40)
    got = TorchIndexer().logits_paged(q8, w, cache, lens, table, 40)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _fp8_experts(g: torch.Generator, n_exp: int, d: int, inter: int) -> ExpertWeights:
    w13, s13 = block_quant_weight(torch.randn(n_exp, 2 * inter, d, generator=g) * 0.05)
    w2, s2 = block_quant_weight(torch.randn(n_exp, d, inter, generator=g) * 0.05)
    return ExpertWeights(w13, w2, s13, s2)


def test_expert_weights_are_dequantised_once_and_refreshed_after_an_in_place_change():
    g = gen(5)
    experts = _fp8_experts(g, 4, 256, 128)
    x = torch.randn(9, 256, generator=g).to(torch.bfloat16)
    w = torch.rand(9, 2, generator=g)
    ids = torch.randint(-1, 4, (9, 2), generator=g, dtype=torch.int32)
    moe, ref = TorchMoE(), ReferenceMoE()
    first = moe.experts(x, w, ids, experts)
    cached = expert_cache.compute_weights(experts)
    assert cached[0] is expert_cache.compute_weights(experts)[0]  # a hit, not a new dequantisation
    experts.w2_scale.mul_(2.0)  # in place: the version counter moves, the cache must not serve stale weights
    second = moe.experts(x, w, ids, experts)
    for got in (first, second):
        want = ref.experts(x, w, ids, experts) if got is second else None
        if want is not None:
            err = (got.float() - want.float()).norm(dim=1) / want.float().norm(dim=1).clamp_min(1e-6)
            assert float(err.max()) < 0.02
    torch.testing.assert_close(second.float(), 2 * first.float(), rtol=2e-2, atol=1e-3)


def test_routing_ties_go_to_the_lower_index_like_the_reference():
    logits = torch.zeros(5, 16)
    logits[:, 3] = logits[:, 9] = 2.0  # equal best pair across two groups
    logits[1] = torch.tensor([1.0] * 16)  # every expert tied
    logits[2, ::2] = 0.5
    bias = torch.zeros(16)
    for groups, keep, k in ((4, 2, 3), (1, 1, 4), (8, 3, 2)):
        got_w, got_ids = TorchMoE().route(logits, bias, top_k=k, n_group=groups, topk_group=keep,
                                          routed_scaling_factor=2.5)
        want_w, want_ids = ReferenceMoE().route(logits, bias, top_k=k, n_group=groups, topk_group=keep,
                                                routed_scaling_factor=2.5)
        assert [sorted(r) for r in got_ids.tolist()] == [sorted(r) for r in want_ids.tolist()]
        order_g, order_w = got_ids.argsort(dim=1), want_ids.argsort(dim=1)
        torch.testing.assert_close(got_w.gather(1, order_g), want_w.gather(1, order_w))
