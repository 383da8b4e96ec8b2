"""Per-128 block FP8 quantization of activations (indexer q / k) with fewer kernel launches.

Same rule as ``dsa_runtime.reference.fp8.quantize_blocks``: ``s = max(amax, 1e-4) / 448`` (a true fp32
division), rounded *up* to a power of two for ``ue8m0``; ``x8 = e4m3(clamp(x / s, +-448))``. The round-up is
done on the fp32 bits (add ``2**23 - 1``, clear the mantissa): a power of two (mantissa 0) stays itself and
anything else moves to the next exponent, exactly what the reference's ``frexp``/``ldexp`` gives for the
positive normal values ``s`` can take (``s >= 1e-4 / 448``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import FP8_AMAX_FLOOR, FP8_MAX, QUANT_BLOCK, ScaleFmt

_MANTISSA = (1 << 23) - 1
_EXPONENT = 0x7F800000


def quantize_blocks(x: Tensor, scale_fmt: ScaleFmt = "ue8m0", block: int = QUANT_BLOCK) -> tuple[Tensor, Tensor]:
    """``x`` ``[..., n]`` bf16/fp32 (``n % block == 0``) -> ``x8`` ``[..., n]`` e4m3, scales ``[..., n // block]`` fp32."""
    if scale_fmt not in ("ue8m0", "float"):
        raise ValueError(f"unknown scale_fmt {scale_fmt!r}")
    n = x.shape[-1]
    if n % block:
        raise ValueError(f"last dim {n} is not a multiple of the block {block}")
    tiles = x.float().reshape(*x.shape[:-1], n // block, block)
    amax = tiles.abs().amax(dim=-1)
    scale = amax.clamp_min_(FP8_AMAX_FLOOR).div_(torch.tensor(FP8_MAX, device=x.device))
    if scale_fmt == "ue8m0":
        scale = scale.view(torch.int32).add_(_MANTISSA).bitwise_and_(_EXPONENT).view(torch.float32)
    x8 = (tiles / scale.unsqueeze(-1)).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return x8.view(x.shape), scale
