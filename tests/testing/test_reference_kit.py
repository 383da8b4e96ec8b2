"""The reference backend passes its own kit, and the case table covers the matrix the contract asks for."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from dsa_runtime.families import FAMILIES
from dsa_runtime.testing import all_cases, run_conformance
from dsa_runtime.testing.compare import as_bytes


def test_reference_passes_quick_tier():
    t0 = time.perf_counter()
    report = run_conformance("reference", device="cpu", progress=False)
    elapsed = time.perf_counter() - t0
    bad = [f"{c.status}: {c.message}" for c in report.cases if c.status != "passed"]
    assert not bad, "\n".join(bad)
    assert report.summary["passed"] == len(all_cases()) > 80
    assert elapsed < 60, f"quick tier took {elapsed:.1f}s on CPU"


def test_ids_unique_stable_and_tiered():
    cases = all_cases(full=True)
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids))
    for family in FAMILIES:
        tiers = {c.tier for c in cases if c.family == family}
        assert tiers == {"quick", "full"}, family
    assert all(c.id.startswith(f"{c.family}/") for c in cases)
    assert all(" " not in c.id for c in cases)
    assert "sparse_attn/decode/fp8_656/h20/k64/q2/p64/partial_pages" in ids
    assert len({c.seed for c in cases}) == len(cases)


@pytest.mark.parametrize(
    "needle",
    [
        # top-k: rows shorter than k, empty windows, ragged batches, ties, -inf in windows, k = 2048
        "topk/topk/r12/l100/k64/short", "/empty/", "ragged_batch", "/ties", "neginf", "k2048",
        "topk/page_table_transform/", "topk/topk_transform/",
        # sparse attention: head counts needing padding, MTP, page sizes, both layouts, both scale rules
        "sparse_attn/prefill/h1/", "/h16/", "/h20/", "/h96/", "/h128/", "/q2/", "/q4/", "/p16/", "/p1/",
        "decode/bf16/", "decode/fp8_656/", "empty_query",
        # KV quant: layouts, scale rules, FP8 edge values, page sizes, index-K pages
        "quantize_mla/fp8_656/ue8m0", "/edge", "store_mla/bf16/p16",
        "store_index_k/p16", "gather_index_k/p64",
        # indexer
        "quantize_q/h64", "quantize_q/h1/", "quantize_k/", "logits_ragged/", "logits_paged/h64/q2", "logits_paged/h64/q4",
        # MoE: routing at E = 256, ties, bf16 / FP8 experts with partial blocks, -1 ids, shared on/off
        "moe/route/e256/g8x4/k8", "moe/route/e48/g8x4/k8/t12/renorm/s2.5/ties", "experts/bf16/", "experts/fp8/",
        "d320/i96", "/shared/", "/noshared/", "all_neg",
    ],
)
def test_quick_tier_covers(needle):
    assert any(needle in c.id for c in all_cases()), needle


def test_full_tier_has_real_shapes():
    full = [c.id for c in all_cases(full=True) if c.tier == "full"]
    for needle in ("h128/k2048", "moe/route/e256/g8x4/k8/t4096", "d7168/i2048", "logits_paged/h64/q2/p64/b32/l32768",
                   "l131072/k2048"):
        assert any(needle in i for i in full), needle


def test_inputs_are_seeded_and_never_all_zero():
    dev = torch.device("cpu")
    for case in all_cases()[::5]:
        a = case.build(torch.Generator().manual_seed(case.seed), dev)
        b = case.build(torch.Generator().manual_seed(case.seed), dev)
        for key, value in a.items():
            if not isinstance(value, torch.Tensor):
                continue
            assert torch.equal(as_bytes(value), as_bytes(b[key])), (case.id, key)
            if value.numel() > 16 and value.dtype.is_floating_point:
                assert bool((value.float() != 0).any()), (case.id, key)


@pytest.mark.parametrize("module", ["dsa_runtime.testing", "dsa_runtime.testing.pytest_plugin",
                                    "dsa_runtime.cli.conformance_cmd"])
def test_import_is_cheap(module):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
