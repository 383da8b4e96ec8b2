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
    cos = torch.zeros(1, 32)
    sin = torch.ones(1, 32)  # a 90 degree turn of every pair
    x = torch.arange(1.0, 65.0)[None]
    inter = apply_interleaved(x, cos, sin)
    assert inter[0, 0] == -x[0, 1] and inter[0, 1] == x[0, 0]  # pair (0, 1)
    neox = apply_neox(x, cos, sin)
    assert neox[0, 0] == -x[0, 32] and neox[0, 32] == x[0, 0]  # pair (0, 32)
