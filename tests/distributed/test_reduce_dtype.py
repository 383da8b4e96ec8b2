"""The pieces of ``--tp-reduce-dtype fp32``: unrounded fp32 partial sums from the row-parallel producers."""

from __future__ import annotations

import pytest
import torch

from dsa_runtime.distributed import ParallelConfig
from dsa_runtime.families import ExpertWeights
from dsa_runtime.model.ops import linear, swiglu_mlp


def test_reduce_dtype_is_checked():
    assert ParallelConfig(tp=2).reduce_dtype == "fp32"
    with pytest.raises(ValueError, match="--tp-reduce-dtype"):
        ParallelConfig(tp=2, reduce_dtype="fp16")


@pytest.mark.parametrize("rows", [3, 40])  # few-row (fp32 copy) and GEMM paths
def test_linear_fp32_partials_sum_to_the_unsplit_product(rows):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 256, generator=g).bfloat16()
    w = (torch.randn(96, 256, generator=g) / 16).bfloat16()
    exact = x.double() @ w.double().T
    halves = [linear(x[:, i:i + 128], w[:, i:i + 128], torch.float32) for i in (0, 128)]
    assert all(h.dtype == torch.float32 for h in halves)
    fp32_sum = (halves[0] + halves[1]).double()
    assert float((fp32_sum - exact).abs().max()) < 1e-5 * float(exact.abs().max())
    # bf16 partials (the old rounding) are off by about a bf16 ulp: the fp32 path is far closer.
    bf16_sum = (linear(x[:, :128], w[:, :128]).double() + linear(x[:, 128:], w[:, 128:]).double())
    assert float((bf16_sum - exact).abs().max()) > 50 * float((fp32_sum - exact).abs().max())
    assert linear(x, w).dtype == torch.bfloat16


def test_split_dense_ffn_and_moe_partials_match_tp1_rounding():
    """Intermediate-split FFN / MoE halves in fp32, summed and rounded once == the unsplit result (up to
    fp32 order: at most one bf16 ulp on a few elements), for the torch and reference MoE backends."""
    from dsa_runtime.reference.moe import ReferenceMoE
    from dsa_runtime.torch_kernels.moe import TorchMoE

    g = torch.Generator().manual_seed(1)
    d, inter, n_exp, t = 64, 32, 4, 24
    x = torch.randn(t, d, generator=g).bfloat16()
    w1, w3 = ((torch.randn(inter, d, generator=g) / 8).bfloat16() for _ in range(2))
    w2 = (torch.randn(d, inter, generator=g) / 6).bfloat16()
    full = swiglu_mlp(x, w1, w3, w2)
    h = inter // 2
    parts = sum(swiglu_mlp(x, w1[s:s + h], w3[s:s + h], w2[:, s:s + h], torch.float32) for s in (0, h))
    ulp = full.float().abs() * 2.0 ** -7
    assert float(((parts.to(torch.bfloat16).float() - full.float()).abs() > ulp).float().mean()) == 0
    w13 = (torch.randn(n_exp, 2 * inter, d, generator=g) / 8).bfloat16()
    w2e = (torch.randn(n_exp, d, inter, generator=g) / 6).bfloat16()
    ids = torch.randint(0, n_exp, (t, 2), generator=g, dtype=torch.int32)
    wts = torch.rand(t, 2, generator=g)

    def half(s):  # one rank's slice of every expert's intermediate (gate rows, up rows, down columns)
        return ExpertWeights(w13=torch.cat([w13[:, s:s + h], w13[:, inter + s:inter + s + h]], 1),
                             w2=w2e[:, :, s:s + h].contiguous())

    for moe in (TorchMoE(), ReferenceMoE()):
        ref = moe.experts(x, wts, ids, ExpertWeights(w13=w13, w2=w2e), out_dtype=torch.float32)
        split = sum(moe.experts(x, wts, ids, half(s), out_dtype=torch.float32) for s in (0, h))
        assert ref.dtype == split.dtype == torch.float32
        assert float((split - ref).abs().max()) < 1e-5 * float(ref.abs().max()), type(moe).__name__
        assert moe.experts(x, wts, ids, half(0)).dtype == torch.bfloat16
