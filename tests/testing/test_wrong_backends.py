"""Deliberately wrong backends fail with messages naming the family and the case; right-but-different pass."""

from __future__ import annotations

import pytest

from dsa_runtime.testing import run_conformance
from tests.testing import wrong_backends as W

# (kernel class, family, substring every failing case id must contain to count, cases that must fail)
WRONG = [
    (W.TopKIgnoresWindows, "topk", ["topk/topk/r16/l300/k32/ragged/randn", "topk/topk_transform/b3/l40/k16/p64/prefill"]),
    (W.SparseAttnDerefsMinusOne, "sparse_attn",
     ["sparse_attn/prefill/h20/k64/t5/s80/pad", "sparse_attn/decode/fp8_656/h20/k64/q2/p64/partial_pages"]),
    (W.SparseAttnLse2, "sparse_attn", ["sparse_attn/prefill/h128/k64/t4/s160/pad", "sparse_attn/decode/bf16/h16/k64/q1/p64/partial_pages"]),
    (W.KVQuantScalesAtEnd, "kv_quant",
     ["kv_quant/quantize_mla/fp8_656/ue8m0/n40/random", "kv_quant/quantize_mla/fp8_656/ue8m0/n40/edge",
      "kv_quant/dequantize_mla/fp8_656/ue8m0/n40/random", "kv_quant/store_mla/fp8_656/ue8m0/p64/n30"]),
    (W.KVQuantWritesMinusOne, "kv_quant", ["kv_quant/store_mla/bf16/p64/n30", "kv_quant/store_mla/fp8_656/ue8m0/p1/n30"]),
    (W.MoEBiasedWeights, "moe", ["moe/route/e256/g8x4/k8/t33/renorm/s2.5/random", "moe/route/e256/g8x4/k8/t9/norenorm/s1/random"]),
    (W.MoEMinusOneIsLastExpert, "moe", ["moe/experts/bf16/e6/k3/d320/i96/t7/shared/neg_ids", "moe/experts/fp8/e8/k4/d200/i72/t6/shared/all_neg"]),
    (W.IndexerNoHadamard, "indexer", ["indexer/quantize_q/h64/t5/ue8m0/bf16/random", "indexer/quantize_k/n37/float/bf16/random"]),
    (W.IndexerIgnoresMTPCausal, "indexer", ["indexer/logits_paged/h64/q2/p64/b3/l150", "indexer/logits_paged/h1/q2/p1/b3/l9"]),
]

# The peers' bugs and one backend per former gap of the kit (each passed the kit before the edge cases).
WRONG_EDGES = [
    (W.TopKPadsWithZero, "topk", ["topk/topk/r12/l100/k64/short/randn", "topk/topk/r32/l96/k64/short/randn"]),
    (W.SparseAttnPrefillMinusOneIsRowZero, "sparse_attn",
     ["sparse_attn/prefill/h16/k32/t6/s96/pad", "sparse_attn/prefill/h64/k64/t3/s1/single_key"]),
    (W.KVQuantFloatScales, "kv_quant", ["kv_quant/quantize_mla/fp8_656/ue8m0/n40/random", "kv_quant/store_mla/fp8_656/ue8m0/p64/n30"]),
    # ue8m0 scale exactly 2^ceil(log2(amax/448)), blocks with amax exactly 448 * 2^k
    (W.KVQuantScaleTwiceTooCoarse, "kv_quant", ["kv_quant/quantize_mla/fp8_656/ue8m0/n40/edge"]),
    (W.IndexerScaleTwiceTooCoarse, "indexer", ["indexer/quantize_q/h32/t5/ue8m0/bf16/random", "indexer/quantize_k/n37/ue8m0/fp32/edge"]),
    # half an e4m3 ulp, not a whole one
    (W.KVQuantTruncates, "kv_quant", ["kv_quant/quantize_mla/fp8_656/ue8m0/n40/random", "kv_quant/store_mla/fp8_656/ue8m0/p16/n30"]),
    (W.IndexerTruncates, "indexer", ["indexer/quantize_k/n37/ue8m0/bf16/random", "indexer/quantize_q/h64/t5/float/bf16/random"]),
    (W.IndexerZeroPastLastEnd, "indexer", ["indexer/logits_ragged/h64/b3x10/early_end", "indexer/logits_ragged/h32/b2x6/early_end"]),
    (W.TopKNaNFirst, "topk", ["topk/topk/r16/l512/k32/full/nan", "topk/topk/r16/l512/k32/ragged/nan"]),
    (W.SparseAttnTop1FastPath, "sparse_attn",
     ["sparse_attn/prefill/h16/k1/t5/s48/pad", "sparse_attn/decode/fp8_656/h16/k1/q1/p64/partial_pages"]),
    (W.SparseAttnOffByOne, "sparse_attn",
     ["sparse_attn/prefill/h64/k64/t3/s1/single_key", "sparse_attn/prefill/h20/k32/t4/s80/last_row",
      "sparse_attn/decode/bf16/h20/k32/q2/p16/last_slot", "sparse_attn/decode/fp8_656/h20/k32/q2/p16/last_slot"]),
    (W.MoENaNOnUnderflow, "moe", ["moe/route/e64/g8x4/k8/t7/renorm/s2.5/underflow"]),
    (W.MoEScaleOnlyWhenRenorm, "moe", ["moe/route/e64/g8x4/k8/t9/norenorm/s2.5/random"]),
    (W.MoEBf16Bias, "moe", ["moe/route/e16/g1x1/k4/t6/renorm/s2.5/near_tie_bf16"]),
    (W.MoERoundsPartialSums, "moe", ["moe/experts/bf16/e6/k3/d256/i128/t7/shared/neg_ids/out_fp32",
                                     "moe/experts/fp8/e8/k4/d256/i128/t96/shared/neg_ids/out_fp32"]),
]
WRONG += WRONG_EDGES


@pytest.mark.parametrize(("cls", "family", "must_fail"), WRONG, ids=[w[0].__name__ for w in WRONG])
def test_wrong_backend_fails(cls, family, must_fail):
    report = run_conformance(W.make_backend("wrong", {family: cls}), families=[family], device="cpu", progress=False)
    failed = {c.id: c for c in report.cases if c.status == "failed"}
    assert report.summary["errors"] == 0, [c.message for c in report.cases if c.status == "error"]
    assert not report.ok
    for case_id in must_fail:
        assert case_id in failed, f"{case_id} passed with {cls.__name__}"
    for case in failed.values():
        assert f"family {family}" in case.message and case.id in case.message, case.message


def test_failure_messages_say_what_differed():
    cases = {c.id: c for c in run_conformance(
        W.make_backend("wrong", {"kv_quant": W.KVQuantWritesMinusOne}), families=["kv_quant"], progress=False
    ).cases}
    msg = cases["kv_quant/store_mla/bf16/p16/n30"].message
    assert "untouched" in msg and "last slot" in msg
    cases = {c.id: c for c in run_conformance(
        W.make_backend("wrong", {"indexer": W.IndexerIgnoresMTPCausal}), families=["indexer"], keyword="q2", progress=False
    ).cases}
    msg = cases["indexer/logits_paged/h64/q2/p64/b3/l150"].message
    assert "should be -inf" in msg and "logits" in msg
    only_q1 = run_conformance(
        W.make_backend("wrong", {"indexer": W.IndexerIgnoresMTPCausal}), families=["indexer"], keyword="/q1/", progress=False
    )
    assert only_q1.ok  # one query per request has no causal limit to get wrong


@pytest.mark.parametrize(("cls", "family"), [(W.TopKHighColumnTies, "topk"), (W.MoEFP8Activations, "moe"),
                                             (W.IndexerBf16Rotation, "indexer")],
                         ids=["other_tie_break", "fp8_activations", "bf16_rotation"])
def test_right_but_different_backend_passes(cls, family):
    report = run_conformance(W.make_backend("different", {family: cls}), families=[family], device="cpu", progress=False)
    assert report.ok, [c.message for c in report.cases if c.status != "passed"]


def test_base2_lse_is_named_and_out_and_lse_are_reported_together():
    cases = {c.id: c for c in run_conformance(
        W.make_backend("wrong", {"sparse_attn": W.SparseAttnLse2}), families=["sparse_attn"], keyword="prefill",
        progress=False,
    ).cases}
    assert "lse / expected = 1.4427: base-2 log?" in cases["sparse_attn/prefill/h128/k64/t4/s160/pad"].message
    msg = {c.id: c for c in run_conformance(
        W.make_backend("wrong", {"sparse_attn": W.SparseAttnPrefillMinusOneIsRowZero}), families=["sparse_attn"],
        keyword="prefill/h16/k32", progress=False,
    ).cases}["sparse_attn/prefill/h16/k32/t6/s96/pad"].message
    assert "out and lse both differ: out: " in msg and " | lse: " in msg and "base-2" not in msg


def test_float_kv_scales_fail_through_the_pow2_check():
    """A backend whose kv_quant writes amax/448 scales (and whose decode reads them) is refused."""
    report = run_conformance(W.make_backend("float_kv", {"kv_quant": W.KVQuantFloatScales}),
                             families=["kv_quant", "sparse_attn"], progress=False)
    failed = [c for c in report.cases if c.status == "failed"]
    assert failed and all(c.family == "kv_quant" for c in failed)
    assert any("scales are not 2^ceil(log2(amax/448))" in c.message and "not a power of two" in c.message for c in failed)
