"""bench/fewhead_variants.py without a GPU: variants named or spelt as field=value pairs become configurations and a
bad one is refused (its no-GPU exit is tested beside fewhead_wgmma.py's, in test_bench_fewhead_wgmma.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="needs the triton package (pip install -e '.[test]')")
torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import fewhead_variants  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.cuda.fewhead_fp8 import CudaFewHeadConfig  # noqa: E402


def test_variants_by_name_and_by_fields():
    assert fewhead_variants.variant("default") == CudaFewHeadConfig()
    assert fewhead_variants.variant("fp32_partials") == CudaFewHeadConfig(stages=3, partial_fp16=False)
    cfg = fewhead_variants.variant("partial_fp16=0,stages=4,rescale_slack=2.5")
    assert cfg == CudaFewHeadConfig(partial_fp16=False, stages=4, rescale_slack=2.5)
    assert fewhead_variants.variant("pdl_merge=true").pdl_merge is True


@pytest.mark.parametrize("spec", ["nonsense", "stages", "stages=", "warps=8"])
def test_bad_variants_are_refused(spec):
    with pytest.raises(argparse.ArgumentTypeError, match="field=value"):
        fewhead_variants.variant(spec)

