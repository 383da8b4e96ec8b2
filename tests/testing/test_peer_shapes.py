"""Backends claiming only real kernels' shapes (FlashMLA, DeepGEMM's SM90 indexer, a k = 2048 top-k) still get
quick-tier cases for every method they implement: a run never certifies such a backend with nothing run."""

from __future__ import annotations

from collections import Counter

import pytest

from dsa_runtime.testing.report import method_of
from dsa_runtime.testing.runner import prepare, select_cases
from tests.testing import wrong_backends as W

PEERS = {
    "flashmla_like": (
        {"families": ("sparse_attn",), "head_counts": frozenset({64, 128}), "page_sizes": frozenset({64}),
             "topk_values": frozenset({128, 2048})},
        {"sparse_attn.prefill", "sparse_attn.decode"},
    ),
    "deepgemm_indexer_like": (
        {"families": ("indexer",), "index_heads": frozenset({32, 64}), "page_sizes": frozenset({64})},
        {"indexer.quantize_q", "indexer.quantize_k", "indexer.logits_ragged", "indexer.logits_paged"},
    ),
    "topk2048_like": ({"families": ("topk",), "topk_values": frozenset({2048})}, {"topk.topk"}),
}


@pytest.mark.parametrize("peer", sorted(PEERS))
def test_peer_shaped_claims_get_cases_for_every_method(peer):
    caps, methods = PEERS[peer]
    ctx = prepare(W.make_backend(peer, {}, **dict(caps)), device="cpu")
    claimed = [c for c in select_cases() if ctx.unclaimed_reason(c) is None]
    counts = Counter(method_of(c.family, c.id) for c in claimed)
    assert methods <= set(counts), (peer, counts)
    if peer == "flashmla_like":  # decode on both layouts with 1 and 2 queries per request, at both head counts
        decode = [c.needs for c in claimed if c.id.startswith("sparse_attn/decode/") and not ctx.padding(c)]
        for layout in ("bf16", "fp8_656"):
            assert {n["decode_queries"] for n in decode if n["kv_layout"] == layout} == {1, 2}
            assert {n["heads"] for n in decode if n["kv_layout"] == layout} == {64, 128}
        # Per-rank head counts under TP (16, 32...) run through the caller's head padding.
        padded = [c.needs["heads"] for c in claimed if c.id.startswith("sparse_attn/decode/") and ctx.padding(c)]
        assert {16, 32} <= set(padded)
    if peer == "topk2048_like":
        assert "topk/topk/r64/l65536/k2048/decode/ties_few_neginf" in {c.id for c in claimed}
