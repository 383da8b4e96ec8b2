"""YaRN frequencies (V3.2 config numbers) and the two pairings (MLA interleaved, indexer half-split)."""

from __future__ import annotations

import dataclasses

import torch

from dsa_runtime.model.config import RopeScaling
from dsa_runtime.model.rope import apply_interleaved, apply_neox, rope_frequencies
from tests.model.helpers import preset


def test_yarn_frequencies_of_the_671b_config():
    cfg = dataclasses.replace(preset("tiny-v32"), rope_scaling=RopeScaling(), rope_theta=10000.0)
    freqs, scale = rope_frequencies(cfg)
    base = 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    assert scale == 1.0 and freqs.shape == (32,)
    torch.testing.assert_close(freqs[:11], base[:11])  # i <= 10 (low = 10): original frequency
    torch.testing.assert_close(freqs[23:], base[23:] / 40)  # i >= 23 (high = 23): divided by the factor
    ramp = (torch.arange(11, 23, dtype=torch.float64) - 10) / 13
    torch.testing.assert_close(freqs[11:23], base[11:23] * (1 - ramp) + base[11:23] / 40 * ramp)


def test_pairings():
    turn = torch.complex(torch.zeros(1, 32), torch.ones(1, 32))  # a 90 degree turn of every pair
    x = torch.arange(1.0, 65.0)[None]
    inter = apply_interleaved(x, turn)
    assert inter[0, 0] == -x[0, 1] and inter[0, 1] == x[0, 0]  # pair (0, 1)
    neox = apply_neox(x, turn)
    assert neox[0, 0] == -x[0, 32] and neox[0, 32] == x[0, 0]  # pair (0, 32)


def test_turns_match_the_pairwise_real_expression():
    """Random angles and values (fp32 and bf16, heads and no heads): the complex turns equal
    ``(x0 c - x1 s, x0 s + x1 c)`` on each pairing, the indexer's untouched tail included."""
    gen = torch.Generator().manual_seed(3)
    angles = torch.randn(5, 32, generator=gen, dtype=torch.float64)
    cos, sin = torch.cos(angles).float(), torch.sin(angles).float()
    turn = torch.complex(cos, sin)
    for dtype in (torch.float32, torch.bfloat16):
        for shape in ((5, 64), (5, 3, 64), (5, 3, 128)):
            x = torch.randn(*shape, generator=gen).to(dtype)
            c = cos.view([5] + [1] * (len(shape) - 2) + [32])
            s = sin.view(c.shape)
            xf = x.float()
            if shape[-1] == 64:
                x0, x1 = xf[..., 0::2], xf[..., 1::2]
                want = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1).flatten(-2)
                torch.testing.assert_close(apply_interleaved(x, turn), want.to(dtype), rtol=0, atol=1e-6)
            x0, x1 = xf[..., :32], xf[..., 32:64]
            want = torch.cat((x0 * c - x1 * s, x0 * s + x1 * c, xf[..., 64:]), dim=-1)
            torch.testing.assert_close(apply_neox(x, turn), want.to(dtype), rtol=0, atol=1e-6)
