"""``dsa-runtime conformance triton --family moe --full --device cuda`` on a Hopper GPU: every claimed case
passes, with both FP8 scale rules and with the shared expert fused or apart."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from dsa_runtime.testing import run_conformance
from tests.hopper.gpu_marks import HOPPER_GPU

pytestmark = [
    *HOPPER_GPU,
]


def _variant(scale_fmt: str, fuse_shared: bool):
    from dsa_runtime.plugins.cuda_hopper import triton_backend
    from dsa_runtime.plugins.cuda_hopper.triton.moe_experts import TritonMoE

    backend = triton_backend()
    # A partial of the module-level class pickles, so the kit can send this variant to its isolated worker
    # process (the default on CUDA); a lambda cannot be sent.
    moe = functools.partial(TritonMoE, scale_fmt, fuse_shared=fuse_shared)
    return dataclasses.replace(backend, kernels={**backend.kernels, "moe": moe})


def _assert_all_claimed_pass(report) -> None:
    bad = [f"{c.id}: {c.status}: {c.message[:300]}" for c in report.cases if c.status in ("failed", "error")]
    assert not bad, "\n".join(bad)
    claimed = [c for c in report.cases if c.status != "not_claimed"]
    assert claimed and all(c.status == "passed" for c in claimed)
    assert not [c for c in report.cases if c.status == "not_claimed"], "the backend claims every MoE case"


def test_registered_backend_full_tier():
    _assert_all_claimed_pass(run_conformance("triton", full=True, families=["moe"], device="cuda", progress=False))


@pytest.mark.parametrize(("scale_fmt", "fuse_shared"), [("float", True), ("ue8m0", False)])
def test_scale_rule_and_shared_variants(scale_fmt, fuse_shared):
    report = run_conformance(
        _variant(scale_fmt, fuse_shared), full=True, families=["moe"], device="cuda", keyword="experts",
        progress=False,
    )
    _assert_all_claimed_pass(report)


def test_small_alignment_compiles_every_width_on_its_first_call():
    """After the first call of a configuration, no batch size the one-program alignment takes compiles a new
    kernel (a compile in the middle of serving stalls every request)."""
    from triton import knobs

    from dsa_runtime.plugins.cuda_hopper.triton import moe_align_small as small

    compiled: list[str] = []
    before = knobs.runtime.jit_cache_hook
    knobs.runtime.jit_cache_hook = lambda *a, **k: compiled.append(str(k.get("repr"))) and False
    try:
        top_k, experts, block_m = 6, 24, 16
        gen = torch.Generator(device="cuda").manual_seed(5)
        small.align_pairs_small(torch.zeros(1, top_k, dtype=torch.int32, device="cuda"), experts, block_m,
                                shared=True)
        compiled.clear()
        for tokens in range(1, small.MAX_PAIRS // (top_k + 1) + 1):
            ids = torch.randint(-1, experts, (tokens, top_k), device="cuda", generator=gen, dtype=torch.int32)
            got = small.align_pairs_small(ids, experts, block_m, shared=True)
            # Every pair (the shared expert's too) lands in a block: the padded rows cover them all.
            assert int(got.num_padded[0]) >= int((ids >= 0).sum()) + tokens
    finally:
        knobs.runtime.jit_cache_hook = before
    assert not [c for c in compiled if "_align_small" in c], compiled
