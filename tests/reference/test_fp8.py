"""FP8 helpers and the Hadamard rotation against the float64 oracle, plus their defining properties."""

from __future__ import annotations

import math

import pytest
import torch

from dsa_runtime.reference import fp8
from dsa_runtime.reference.hadamard import hadamard_matrix, hadamard_rotate

from . import oracle64 as o


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("fmt", ["ue8m0", "float"])
def test_scale_edge_values(fmt):
    amax = torch.tensor([0.0, 448.0, 448.0 * 2.0**-5, 448.0 * 2.0**7, 1e-6, 1e-4, 2e-4, 449.0, 3.0, 1e30])
    got = fp8.compute_scale(amax, fmt)
    want = torch.tensor([o.scale_of(a, fmt) for a in amax.tolist()], dtype=torch.float64)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=0, atol=0)
    # An all-zero block and a tiny one both use the 1e-4 floor; 448 (and 448 * 2**k) map to 2**k exactly.
    assert got[0] == got[4] == got[5] == fp8.compute_scale(torch.tensor([1e-4]), fmt)[0] > 0
    assert got[1] == 1.0 and got[2] == 2.0**-5 and got[3] == 2.0**7


def test_ue8m0_scales_are_powers_of_two_at_least_amax_over_448():
    amax = torch.rand(4000, generator=_gen(0), dtype=torch.float64).mul(30).sub(20).exp2().float()
    s = fp8.compute_scale(amax, "ue8m0").double()
    exponent = torch.log2(s)
    assert torch.equal(exponent, exponent.round())  # a power of two
    need = amax.double().clamp_min(1e-4) / 448
    assert bool((s >= need * (1 - 1e-7)).all())  # rounded up (1e-7: the fp32 rounding of amax / 448)
    assert bool((s < 2 * need).all())  # ... by less than one binade


@pytest.mark.parametrize("fmt", ["ue8m0", "float"])
def test_quantize_blocks_matches_oracle(fmt):
    x = torch.randn(6, 512, generator=_gen(1)) * torch.logspace(-6, 3, 6)[:, None]
    x[0, :128] = 0.0  # all-zero block: floored scale, all-zero codes
    x[1, 128] = 448.0  # exactly the e4m3 max at scale 1
    x[2, 256:384] = -(2.0 ** torch.arange(128) % 17)  # powers of two
    x8, scales = fp8.quantize_blocks(x, fmt)
    want8, want_s = o.quantize_rows(x, fmt)
    assert x8.dtype == torch.float8_e4m3fn and scales.shape == (6, 4)
    assert torch.equal(scales.double(), want_s)
    assert torch.equal(x8.double(), want8)
    assert bool((x8[0, :128].float() == 0).all()) and x8[1, 128].float() == 448.0
    back = fp8.dequantize_blocks(x8, scales)  # one fp32 rounding of the exact product
    torch.testing.assert_close(
        back.double(), want8 * want_s.repeat_interleave(128, dim=1), rtol=2**-24, atol=0
    )


def test_quantize_clamps_to_448():
    x = torch.full((1, 128), 3.0)
    x8 = fp8.quantize_with_scale(x, torch.tensor(2.0**-8))  # 3 * 256 = 768 > 448
    assert bool((x8.float() == 448.0).all())
    assert bool((fp8.quantize_with_scale(-x, torch.tensor(2.0**-8)).float() == -448.0).all())


@pytest.mark.parametrize(
    ("shape", "fmt"), [((3, 200, 300), "float"), ((144, 200), "ue8m0"), ((130, 129), "float")]
)
def test_block_dequant_partial_edge_blocks(shape, fmt):
    """576 x 7168-like shapes scaled down: out and in not multiples of 128 give partial edge blocks."""
    w = torch.randn(*shape, generator=_gen(2)) * 0.05
    w[..., -1, -1] = 9.0  # a large value alone in the corner (partial) block
    w8, scale = fp8.block_quant_weight(w, fmt)
    rows, cols = shape[-2:]
    assert scale.shape == (*shape[:-2], math.ceil(rows / 128), math.ceil(cols / 128))
    got = fp8.block_dequant_weight(w8, scale)
    torch.testing.assert_close(got.double(), o.dequant_blocks(w8, scale), rtol=2**-24, atol=0)
    assert scale[..., -1, -1].max() >= 9.0 / 448 and scale[..., 0, 0].max() < 9.0 / 448
    # Round trip: e4m3 keeps 3 mantissa bits (1/16 relative), subnormals a step of 2**-9 times the scale.
    per_element_scale = o.dequant_blocks(torch.ones(shape), scale)
    assert bool(((got.double() - w.double()).abs() <= w.double().abs() / 16 + per_element_scale / 1024).all())


def test_block_dequant_rejects_wrong_scale_shape():
    with pytest.raises(ValueError):
        fp8.block_dequant_weight(torch.zeros(200, 300).to(torch.float8_e4m3fn), torch.ones(1, 2))


def test_hadamard_matches_sylvester_and_preserves_dots():
    assert torch.equal(hadamard_matrix(128).double(), o.sylvester(128))
    q = torch.randn(7, 3, 128, generator=_gen(3))
    k = torch.randn(5, 128, generator=_gen(4))
    rq, rk = hadamard_rotate(q), hadamard_rotate(k)
    torch.testing.assert_close(rq.double(), o.rotate(q), rtol=0, atol=1e-5)
    dots = torch.einsum("thd,sd->ths", q.double(), k.double())
    torch.testing.assert_close(torch.einsum("thd,sd->ths", rq.double(), rk.double()), dots, rtol=0, atol=1e-4)
    torch.testing.assert_close(hadamard_rotate(rq).double(), q.double(), rtol=0, atol=1e-5)  # involution
    assert hadamard_rotate(q.bfloat16()).dtype == torch.float32
