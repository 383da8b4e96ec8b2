"""``dsa-runtime conformance flashmla_sparse / flashmla_kv --full --device cuda`` with FlashMLA built from source
(tools/gpu/build_flashmla.sh) on a Hopper GPU: every claimed case passes, and the padded ones too."""

from __future__ import annotations

import pytest

from dsa_runtime.plugins.cuda_hopper.flashmla import flashmla_library
from dsa_runtime.testing import run_conformance
from tests.hopper.gpu_marks import HOPPER_GPU

pytestmark = [
    *HOPPER_GPU,
    pytest.mark.skipif(not flashmla_library()[0], reason=flashmla_library()[1]),
]


@pytest.mark.parametrize(("backend", "method"), [("flashmla_sparse", "prefill"), ("flashmla_kv", "decode")])
def test_full_tier_passes_every_claimed_case(backend, method):
    report = run_conformance(backend, full=True, families=["sparse_attn"], device="cuda", progress=False)
    bad = [f"{c.id}: {c.status}: {c.message[:300]}" for c in report.cases if c.status in ("failed", "error")]
    assert not bad, "\n".join(bad)
    ran = [c.id for c in report.cases if c.status == "passed"]
    assert ran and all(f"sparse_attn/{method}/" in i for i in ran), ran
