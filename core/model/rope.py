"""YaRN rotary embeddings shared by MLA and the lightning indexer.

One table of frequencies serves both; they differ in which dims they rotate and how they pair them:

* MLA: the LAST ``qk_rope_head_dim`` dims of each q head and ``k_pe``, interleaved pairs ``(2i, 2i+1)``.
* indexer: the FIRST ``qk_rope_head_dim`` dims of q heads and k, NeoX half-split pairs ``(i, i + d/2)``.

YaRN is always applied when ``rope_scaling`` is set (HF / SGLang behaviour).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dsa_runtime.model.config import ModelConfig


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


def rope_frequencies(config: ModelConfig) -> tuple[Tensor, float]:
    """``[rope_dim / 2]`` fp64 angular frequencies and the cos/sin multiplier (1.0 for DeepSeek's configs)."""
    dim = config.qk_rope_head_dim
    base = config.rope_theta
    freqs = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    rs = config.rope_scaling
    if rs is None:
        return freqs, 1.0

    def correction_dim(rotations: float) -> float:
        return dim * math.log(rs.original_max_position_embeddings / (rotations * 2 * math.pi)) / (
            2 * math.log(base)
        )

    low = max(math.floor(correction_dim(rs.beta_fast)), 0)
    high = min(math.ceil(correction_dim(rs.beta_slow)), dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    freqs = freqs * (1 - ramp) + freqs / rs.factor * ramp
    scale = _yarn_mscale(rs.factor, rs.mscale) / _yarn_mscale(rs.factor, rs.mscale_all_dim)
    return freqs, scale


class Rope:
    """cos/sin for absolute positions, computed on demand in fp32 (angles in fp64 for long contexts)."""

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu") -> None:
        freqs, self.scale = rope_frequencies(config)
        self.freqs = freqs.to(device)
        self.dim = config.qk_rope_head_dim

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions ``[T]`` int -> cos, sin ``[T, rope_dim / 2]`` fp32."""
        angles = positions.to(torch.float64)[:, None] * self.freqs[None, :]
        return (torch.cos(angles) * self.scale).float(), (torch.sin(angles) * self.scale).float()


def apply_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs ``(2i, 2i+1)`` of ``x`` ``[T, ..., d]``; cos/sin ``[T, d/2]``. Returns x's dtype."""
    # Each pair is a complex number turned by cos + i sin: three kernels (complex, product, cast back) where
    # the pairwise real expression takes eight, which an eager decode step pays per layer.
    turn = torch.complex(cos, sin).view([cos.shape[0]] + [1] * (x.dim() - 2) + [cos.shape[1]])
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * turn).flatten(-2).to(x.dtype)


def apply_neox(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs ``(i, i + r/2)`` of the first ``r = 2 * cos.shape[1]`` dims of ``x`` ``[T, ..., d]`` (``d >= r``),
    leaving the rest; cos/sin ``[T, r/2]``. Returns x's dtype."""
    half = cos.shape[1]
    r = 2 * half
    turn = torch.complex(cos, sin).view([cos.shape[0]] + [1] * (x.dim() - 2) + [half])
    xf = x.float()
    # (x_i, x_{i+half}) as one complex number: the same products and sums as the real expression, in the
    # fewer kernels an eager step pays per layer.
    turned = torch.view_as_real(torch.complex(xf[..., :half], xf[..., half:r]) * turn)  # [..., half, 2]
    return torch.cat([turned.transpose(-1, -2).flatten(-2), xf[..., r:]], dim=-1).to(x.dtype)
