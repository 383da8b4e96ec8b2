"""MoE routing and experts against per-token float64 loops (explicit per-element block dequantization)."""

from __future__ import annotations

import math

import pytest
import torch

from dsa_runtime.families import ExpertWeights
from dsa_runtime.reference.moe import ReferenceMoE

from . import oracle64 as o

MOE = ReferenceMoE()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _pairs(weights: torch.Tensor, ids: torch.Tensor) -> list[dict[int, float]]:
    return [dict(zip(i, w, strict=True)) for i, w in zip(ids.tolist(), weights.tolist(), strict=True)]


def _assert_route_matches(weights, ids, want) -> None:
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    for got_row, want_row in zip(_pairs(weights, ids), want, strict=True):
        want_row = dict(want_row)
        assert sorted(got_row) == sorted(want_row)
        for e, w in want_row.items():
            assert math.isclose(got_row[e], w, rel_tol=1e-6, abs_tol=1e-7)


@pytest.mark.parametrize(
    ("n_exp", "n_group", "topk_group", "top_k", "renorm"),
    [(256, 8, 4, 8, True), (64, 8, 2, 6, True), (48, 1, 1, 4, False), (32, 4, 4, 8, True)],
)
def test_route_matches_oracle(n_exp, n_group, topk_group, top_k, renorm):
    g = _gen(n_exp + top_k)
    logits = torch.randn(24, n_exp, generator=g) * 2
    bias = torch.randn(n_exp, generator=g) * 0.3
    weights, ids = MOE.route(
        logits,
        bias,
        top_k=top_k,
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=2.5,
        renormalize=renorm,
    )
    assert weights.shape == ids.shape == (24, top_k)
    _assert_route_matches(weights, ids, o.route(logits, bias, top_k, n_group, topk_group, 2.5, renorm))
    if renorm:
        torch.testing.assert_close(weights.sum(1), torch.full((24,), 2.5))


def test_route_ties_go_to_the_lower_index():
    logits = torch.zeros(2, 16)  # every score equal, every group equal
    weights, ids = MOE.route(
        logits, torch.zeros(16), top_k=3, n_group=4, topk_group=2, routed_scaling_factor=1.0
    )
    assert sorted(ids[0].tolist()) == [0, 1, 2]  # groups 0 and 1 kept, then experts 0, 1, 2
    torch.testing.assert_close(weights, torch.full((2, 3), 1 / 3))
    # Tie between groups only: groups 1 and 3 hold the same scores; the lower (1) is kept.
    logits = torch.full((1, 8), -5.0)
    logits[0, [2, 3]] = 1.0
    logits[0, [6, 7]] = 1.0
    _, ids = MOE.route(logits, torch.zeros(8), top_k=2, n_group=4, topk_group=1, routed_scaling_factor=1.0)
    assert sorted(ids[0].tolist()) == [2, 3]


def test_route_bias_chooses_but_does_not_weigh_and_groups_limit_choice():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0, -3.0, -3.0, -3.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0, 0.0, 0.0, 0.0, 0.0])  # lifts expert 3 to the top
    weights, ids = MOE.route(logits, bias, top_k=2, n_group=2, topk_group=1, routed_scaling_factor=1.0)
    # Group 0 = {0..3} scores 5.27 + 0.88 vs group 1 = {4..7} 0.95 + 0.05: expert 4 (p=0.95) is excluded.
    assert sorted(ids[0].tolist()) == [0, 3]
    p = torch.sigmoid(logits[0, [0, 3]])
    got = dict(zip(ids[0].tolist(), weights[0].tolist(), strict=True))
    assert math.isclose(got[3], float(p[1] / p.sum()), rel_tol=1e-6)  # the unbiased sigmoid


def test_route_rejects_top_k_beyond_kept_groups():
    with pytest.raises(ValueError):
        MOE.route(
            torch.randn(1, 8), torch.zeros(8), top_k=3, n_group=4, topk_group=1, routed_scaling_factor=1.0
        )


def _weights(n_exp: int, inter: int, dim: int, fp8: bool, seed: int) -> tuple[ExpertWeights, tuple]:
    """Random experts, either bf16 or FP8 codes with random block scales; also their f64 dequantized form."""
    g = _gen(seed)
    if not fp8:
        w13 = (torch.randn(n_exp, 2 * inter, dim, generator=g) / math.sqrt(dim)).bfloat16()
        w2 = (torch.randn(n_exp, dim, inter, generator=g) / math.sqrt(inter)).bfloat16()
        return ExpertWeights(w13, w2), (w13.double(), w2.double())
    # Clamp before the cast: out-of-range values become NaN (not 448) in some torch versions.
    w13 = (torch.randn(n_exp, 2 * inter, dim, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    w2 = (torch.randn(n_exp, dim, inter, generator=g) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    s13 = (torch.rand(n_exp, -(-2 * inter // 128), -(-dim // 128), generator=g) + 0.5) / (
        100 * math.sqrt(dim)
    )
    s2 = (torch.rand(n_exp, -(-dim // 128), -(-inter // 128), generator=g) + 0.5) / (100 * math.sqrt(inter))
    return ExpertWeights(w13, w2, s13, s2), (o.dequant_blocks(w13, s13), o.dequant_blocks(w2, s2))


@pytest.mark.parametrize(("fp8", "dim", "inter"), [(False, 256, 64), (True, 200, 80), (True, 320, 144)])
def test_experts_match_oracle(fp8, dim, inter):
    """FP8 shapes are not multiples of 128 (partial edge blocks in both dims of w13 and w2)."""
    n_exp, tokens, k = 6, 10, 3
    experts, (w13, w2) = _weights(n_exp, inter, dim, fp8, dim)
    shared, shared64 = _weights(1, inter, dim, fp8, dim + 1)
    g = _gen(dim + 2)
    x = torch.randn(tokens, dim, generator=g).bfloat16()
    ids = torch.randint(0, n_exp, (tokens, k), generator=g).int()
    ids[0, 1] = -1  # an expert on another rank
    ids[1] = -1  # a token with no local expert: only the shared expert
    ids[2, 1] = ids[2, 0]  # the same expert twice: both terms count
    weights = torch.rand(tokens, k, generator=g) + 0.1
    out = MOE.experts(x, weights, ids, experts, shared)
    assert out.shape == (tokens, dim) and out.dtype == torch.bfloat16
    want = o.experts(x, weights, ids, w13, w2, shared64)
    assert bool(torch.isfinite(want).all())
    scale = float(want.abs().max())
    torch.testing.assert_close(out.double(), want, rtol=2**-8, atol=1e-3 * scale)
    # Without the shared expert, token 1 (all ids -1) gets exactly zero.
    routed_only = MOE.experts(x, weights, ids, experts)
    assert bool((routed_only[1] == 0).all()) and bool((routed_only[0] != 0).any())
    torch.testing.assert_close(
        routed_only.double(), o.experts(x, weights, ids, w13, w2), rtol=2**-8, atol=1e-3 * scale
    )
