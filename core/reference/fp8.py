"""FP8 e4m3 helpers of the reference backend: scales, block quantization, block dequantization.

Conventions (shared with ``dsa_runtime.families``):

* a scale is an fp32 *multiplier*: ``x ~= fp32(x8) * scale``;
* ``amax`` is floored at ``1e-4`` and ``s = amax / 448`` (computed in fp32);
* ``scale_fmt="ue8m0"`` rounds ``s`` *up* to a power of two, ``"float"`` keeps it as is;
* quantized value ``= e4m3(clamp(x / s, -448, 448))`` (round to nearest even by the cast).
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import FP8_AMAX_FLOOR, FP8_MAX, QUANT_BLOCK, ScaleFmt

E4M3 = torch.float8_e4m3fn


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def round_up_pow2(s: Tensor) -> Tensor:
    """Smallest power of two ``>= s`` for positive fp32 ``s``.

    Uses ``frexp`` (s = m * 2**e, m in [0.5, 1)) rather than ``ceil(log2(s))`` so that the result is exact:
    an exact power of two has m == 0.5 and stays itself, anything else becomes ``2**e``.
    """
    mantissa, exponent = torch.frexp(s)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)
    return torch.ldexp(torch.ones_like(s), exponent)


def compute_scale(amax: Tensor, scale_fmt: ScaleFmt) -> Tensor:
    """fp32 scale for each ``amax`` (any shape): floor at 1e-4, divide by 448, optionally round up to 2**n."""
    if scale_fmt not in ("ue8m0", "float"):
        raise ValueError(f"unknown scale_fmt {scale_fmt!r}")
    # A true division by a same-device tensor: CUDA turns division by a Python scalar into a multiplication by
    # its reciprocal, which can differ from amax / 448 in the last bit and make "float" scales device-dependent.
    s = amax.float().clamp_min(FP8_AMAX_FLOOR) / torch.full_like(amax, FP8_MAX, dtype=torch.float32)
    return round_up_pow2(s) if scale_fmt == "ue8m0" else s


def quantize_with_scale(x: Tensor, scale: Tensor) -> Tensor:
    """``e4m3(clamp(x / scale, +-448))``; ``scale`` broadcasts against ``x``. Division in fp32."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(E4M3)


def quantize_blocks(
    x: Tensor, scale_fmt: ScaleFmt = "ue8m0", block: int = QUANT_BLOCK
) -> tuple[Tensor, Tensor]:
    """Quantize the last dim in blocks of ``block`` (activations, MLA latents, indexer q/k).

    Args:
        x: ``[..., n]`` bf16/fp32 with ``n % block == 0``.
    Returns:
        ``x8`` ``[..., n]`` e4m3 and ``scales`` ``[..., n // block]`` fp32.
    """
    n = x.shape[-1]
    if n % block:
        raise ValueError(f"last dim {n} is not a multiple of the block {block}")
    tiles = x.float().reshape(*x.shape[:-1], n // block, block)
    scales = compute_scale(tiles.abs().amax(dim=-1), scale_fmt)
    x8 = quantize_with_scale(tiles, scales.unsqueeze(-1))
    return x8.reshape(x.shape), scales


def dequantize_blocks(x8: Tensor, scales: Tensor, block: int = QUANT_BLOCK) -> Tensor:
    """Inverse of :func:`quantize_blocks`: ``[..., n]`` e4m3 and ``[..., n // block]`` scales -> fp32."""
    n = x8.shape[-1]
    tiles = x8.float().reshape(*x8.shape[:-1], n // block, block)
    return (tiles * scales.float().unsqueeze(-1)).reshape(x8.shape)


def _expand_block_scales(scale: Tensor, rows: int, cols: int, block: int) -> Tensor:
    """``[..., ceil(rows/b), ceil(cols/b)]`` -> ``[..., rows, cols]``; the last block of each dim may be partial."""
    expected = (ceil_div(rows, block), ceil_div(cols, block))
    if tuple(scale.shape[-2:]) != expected:
        raise ValueError(f"scale shape {tuple(scale.shape)} does not match weight {rows}x{cols}: {expected}")
    full = scale.float().repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
    return full[..., :rows, :cols]


def block_dequant_weight(w8: Tensor, scale: Tensor, block: int = QUANT_BLOCK) -> Tensor:
    """Dequantize a block-quantized weight: ``W[..., i, j] = fp32(W8[..., i, j]) * S[..., i // 128, j // 128]``.

    Args:
        w8: ``[out, in]`` or ``[E, out, in]`` e4m3.
        scale: ``[ceil(out/128), ceil(in/128)]`` (or with the leading ``E``) fp32 multipliers
            (``weight_scale_inv`` in checkpoints); edge blocks may be partial (e.g. 576 x 7168 -> [5, 56]).
    Returns:
        fp32 tensor shaped like ``w8``.
    """
    rows, cols = w8.shape[-2:]
    return w8.float() * _expand_block_scales(scale, rows, cols, block)


def block_quant_weight(
    w: Tensor, scale_fmt: ScaleFmt = "float", block: int = QUANT_BLOCK
) -> tuple[Tensor, Tensor]:
    """Quantize a ``[..., out, in]`` weight into 128x128 blocks (partial edge blocks allowed).

    The inverse of :func:`block_dequant_weight`; used to build FP8 weights for tests and conversions.
    Returns ``w8`` e4m3 like ``w`` and scales ``[..., ceil(out/128), ceil(in/128)]`` fp32.
    """
    rows, cols = w.shape[-2:]
    nr, nc = ceil_div(rows, block), ceil_div(cols, block)
    # Zero-pad to whole blocks: padding never raises an amax, so edge blocks see only their own values.
    padded = torch.zeros(*w.shape[:-2], nr * block, nc * block, dtype=torch.float32, device=w.device)
    padded[..., :rows, :cols] = w.float()
    tiles = padded.reshape(*w.shape[:-2], nr, block, nc, block)
    scales = compute_scale(tiles.abs().amax(dim=(-3, -1)), scale_fmt)
    w8 = quantize_with_scale(tiles, scales[..., :, None, :, None])
    w8 = w8.reshape(padded.shape)[..., :rows, :cols].contiguous()
    return w8, scales
