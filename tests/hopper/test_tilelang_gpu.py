"""``dsa-runtime conformance tilelang --full --device cuda`` on a Hopper GPU with tilelang installed: every
claimed sparse_attn case passes (prefill, bf16 decode and fp8_656 decode), padded ones included."""

from __future__ import annotations

import pytest

from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_attn import tilelang_library
from dsa_runtime.testing import run_conformance
from tests.hopper.gpu_marks import HOPPER_GPU

pytestmark = [
    *HOPPER_GPU,
    pytest.mark.skipif(not tilelang_library()[0], reason=tilelang_library()[1]),
]


def test_full_tier_passes_every_claimed_case():
    report = run_conformance("tilelang", full=True, families=["sparse_attn"], device="cuda", progress=False)
    bad = [f"{c.id}: {c.status}: {c.message[:300]}" for c in report.cases if c.status in ("failed", "error")]
    assert not bad, "\n".join(bad)
    ran = {c.id.split("/")[1] for c in report.cases if c.status == "passed"}
    assert ran == {"prefill", "decode"}, ran
    layouts = {c.id.split("/")[2] for c in report.cases if c.status == "passed" and "/decode/" in c.id}
    assert layouts == {"bf16", "fp8_656"}, layouts
