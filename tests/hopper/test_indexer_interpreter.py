"""The Triton indexer kernels on CPU through Triton's interpreter: every quick indexer kit case (both scale
rules, 1..64 heads, empty and ragged windows, MTP N=2, page sizes 1/16/64) plus direct checks of the
wide-dot ragged configs, paged N=3 (padded to 4) and page size 4, and the chunked top-k entry; then the
claims and the one-line input errors (no kernel runs)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hopper.interp_support import HAS_TRITON, NEEDS_INTERPRETER


@NEEDS_INTERPRETER[0]
@NEEDS_INTERPRETER[1]
def test_quick_indexer_cases_pass_under_the_triton_interpreter():
    from dsa_runtime.testing.registry import family_cases

    quick = sum(c.tier == "quick" for c in family_cases("indexer"))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    run = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("interp_indexer.py"))],
        capture_output=True, text=True, env=env, timeout=600,
    )
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    kit = [ln for ln in lines if ln.startswith("kit ")]
    direct = [ln for ln in lines if ln.startswith("direct ")]
    assert len(kit) == quick and len(direct) == 6, lines
    assert all(ln.split()[1] == "passed" for ln in kit + direct), lines


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed: the module imports it")
def test_claims_cover_the_kit_keys_and_bad_inputs_raise():
    import torch

    from dsa_runtime.plugins.cuda_hopper.triton.indexer import INDEXER_CLAIMS, TritonIndexer

    assert set(INDEXER_CLAIMS) == {f"indexer.{m}" for m in ("quantize_q", "quantize_k", "logits_ragged", "logits_paged")}
    paged = INDEXER_CLAIMS["indexer.logits_paged"]
    assert paged.unclaimed_reason(index_heads=64, page_size=64, decode_queries=2) is None
    assert paged.unclaimed_reason(index_heads=128, page_size=64, decode_queries=1) is not None
    assert INDEXER_CLAIMS["indexer.quantize_q"].unclaimed_reason(index_heads=1, scale_fmt="float") is None
    ix = TritonIndexer()
    with pytest.raises(ValueError, match=r"\[T, H, 128\]"):
        ix.quantize_q(torch.randn(2, 4, 64), torch.randn(2, 4))
    with pytest.raises(ValueError, match="1..64 index heads"):
        ix.quantize_q(torch.randn(2, 65, 128), torch.randn(2, 65))
    with pytest.raises(ValueError, match="unknown scale_fmt"):
        ix.quantize_k(torch.randn(3, 128), scale_fmt="e8")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="multiple of 132"):
        ix.logits_paged(torch.zeros(1, 1, 4, 128, dtype=torch.float8_e4m3fn), torch.ones(1, 4),
                        torch.zeros(2, 130, dtype=torch.uint8), torch.ones(1, dtype=torch.int32),
                        torch.zeros(1, 1, dtype=torch.int32), 4)
