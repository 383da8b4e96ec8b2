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
    """Rotations for absolute positions, computed on demand (angles in fp64 for long contexts)."""

    def __init__(self, config: ModelConfig, device: torch.device | str = "cpu") -> None:
        freqs, self.scale = rope_frequencies(config)
        self.freqs = freqs.to(device)
        self.dim = config.qk_rope_head_dim

    def turns(self, positions: Tensor) -> Tensor:
        """positions ``[T]`` int -> complex64 ``[T, rope_dim / 2]``: ``scale * (cos + i sin)`` of each pair's angle,
        built once a step for every layer (each pair of dims turns as a complex number: the same products and
        sums as the real expression, in fewer kernels, which an eager step pays per layer)."""
        angles = positions.to(torch.float64)[:, None] * self.freqs[None, :]
        return torch.complex((torch.cos(angles) * self.scale).float(), (torch.sin(angles) * self.scale).float())


def _broadcast(turn: Tensor, x: Tensor) -> Tensor:
    return turn.view([turn.shape[0]] + [1] * (x.dim() - 2) + [turn.shape[1]])


def apply_interleaved(x: Tensor, turn: Tensor) -> Tensor:
    """Rotate pairs ``(2i, 2i+1)`` of ``x`` ``[T, ..., d]`` by ``turn`` ``[T, d/2]`` complex. Returns x's dtype."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * _broadcast(turn, x)).flatten(-2).to(x.dtype)


def apply_neox(x: Tensor, turn: Tensor) -> Tensor:
    """Rotate pairs ``(i, i + r/2)`` of the first ``r = 2 * turn.shape[1]`` dims of ``x`` ``[T, ..., d]``
    (``d >= r``) by ``turn`` ``[T, r/2]`` complex, leaving the rest. Returns x's dtype."""
    half = turn.shape[1]
    xf = x.float()
    turned = torch.view_as_real(torch.complex(xf[..., :half], xf[..., half:2 * half]) * _broadcast(turn, x))
    return torch.cat([turned.transpose(-1, -2).flatten(-2), xf[..., 2 * half:]], dim=-1).to(x.dtype)
