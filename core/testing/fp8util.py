"""The kit's own FP8 and cache-layout helpers, written independently of the reference backend.

They build inputs (packed 656-byte MLA rows, ``index_k_132`` pages, random e4m3 values, FP8 scale edge
values) and judge quantizations (:func:`quant_error`). Keeping them apart from ``dsa_runtime.reference``
means a layout bug in the reference shows up as a failure of the reference's own kit run.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dsa_runtime.families import D_LATENT, FP8_AMAX_FLOOR, FP8_MAX, INDEX_HEAD_DIM, QUANT_BLOCK
from dsa_runtime.testing.tolerances import Tolerance

E4M3 = torch.float8_e4m3fn
E4M3_MIN_NORMAL_EXP = -6  # smallest normal e4m3 is 2**-6; subnormal spacing is 2**-9


def pow2_scale(amax: Tensor) -> Tensor:
    """ue8m0 scale: ``2 ** ceil(log2(max(amax, 1e-4) / 448))``, exact (frexp, no log rounding)."""
    s = amax.float().clamp_min(FP8_AMAX_FLOOR) / FP8_MAX
    mant, exp = torch.frexp(s)
    return torch.ldexp(torch.ones_like(s), torch.where(mant == 0.5, exp - 1, exp))


def block_scales(x: Tensor, scale_fmt: str, block: int = QUANT_BLOCK) -> Tensor:
    """Scales ``[..., n // block]`` of ``x`` ``[..., n]`` under ``scale_fmt``."""
    amax = x.float().reshape(*x.shape[:-1], -1, block).abs().amax(-1)
    if scale_fmt == "ue8m0":
        return pow2_scale(amax)
    return amax.clamp_min(FP8_AMAX_FLOOR) / FP8_MAX


def quantize(x: Tensor, scale_fmt: str, block: int = QUANT_BLOCK) -> tuple[Tensor, Tensor]:
    """Block-quantize the last dim: ``e4m3(clamp(x / s))`` and the scales ``[..., n // block]``."""
    s = block_scales(x, scale_fmt, block)
    tiles = x.float().reshape(*x.shape[:-1], -1, block) / s.unsqueeze(-1)
    return tiles.clamp(-FP8_MAX, FP8_MAX).to(E4M3).reshape(x.shape), s


def e4m3_ulp(v: Tensor) -> Tensor:
    """Spacing of e4m3 values at ``|v|`` (``v`` in the scaled domain): ``2**(floor(log2|v|) - 3)`` for normal
    values, ``2**-9`` below the smallest normal ``2**-6``."""
    a = v.abs().float()
    _, exp = torch.frexp(a)  # a = m * 2**exp, m in [0.5, 1): floor(log2 a) = exp - 1
    return torch.where(a >= 2.0**E4M3_MIN_NORMAL_EXP, torch.ldexp(torch.ones_like(a), exp - 4), torch.full_like(a, 2.0**-9))


def quant_error(
    name: str, deq: Tensor, x: Tensor, tol: Tolerance, block: int = QUANT_BLOCK, scales: Tensor | None = None
) -> str | None:
    """Judge a dequantized FP8 block quantization ``deq`` of the exact values ``x`` (both ``[..., n]``).

    With the scales the quantizer used (``scales`` ``[..., n // block]``, checked separately by
    :func:`scale_error`), each element may be off by ``tol.ulps`` e4m3 ulp at *its own* scaled value (a
    round-to-nearest quantizer is within half an ulp), plus ``tol.rel_slack * |x| + tol.scale_slack * s`` for
    arithmetic before the rounding (a bf16 rotation). Without them, by ``tol.ulps`` ulp at the coarsest valid
    scale, the ue8m0 one: ``max(|x| * 2**-3, s_pow2 * 2**-9)``.
    """
    from dsa_runtime.testing.compare import unravel

    assert tol.ulps is not None
    d, xf = deq.float(), x.float().to(deq.device)
    if d.shape != xf.shape:
        return f"{name}: shape {tuple(d.shape)}, expected {tuple(xf.shape)}"
    if d.numel() == 0:
        return None
    if scales is not None:
        s = scales.float().to(deq.device).reshape(*xf.shape[:-1], -1)
        s = s.repeat_interleave(block, dim=-1).reshape(xf.shape)
        bound = tol.ulps * e4m3_ulp(xf / s) * s + tol.rel_slack * xf.abs() + tol.scale_slack * s
        unit = "e4m3 ulp at the returned scale"
    else:
        s_u = pow2_scale(xf.reshape(*xf.shape[:-1], -1, block).abs().amax(-1))
        s_u = s_u.repeat_interleave(block, dim=-1).reshape(xf.shape)
        bound = tol.ulps * torch.maximum(xf.abs() * 2.0**-3, s_u * 2.0**-9)
        unit = "e4m3 ulp"
    err = (d - xf).abs()
    bad = ~(err <= bound)  # NaN counts as bad
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    ratio = torch.where(bad, (err / bound).nan_to_num(float("inf")), torch.zeros_like(err)).reshape(-1)
    worst = int(torch.argmax(ratio))
    first = unravel(int(torch.nonzero(bad.reshape(-1))[0]), d.shape)
    wi = unravel(worst, d.shape)
    return (
        f"{name}: {n_bad} of {d.numel()} dequantized values off by more than {tol.ulps:g} {unit}; worst at {wi}: "
        f"got {float(d.reshape(-1)[worst]):.6g}, exact {float(xf.reshape(-1)[worst]):.6g} "
        f"(allowed error {float(bound.reshape(-1)[worst]):.3g}); first bad element {first} (block {first[-1] // block})"
    )


def scale_error(
    name: str, scales: Tensor, x: Tensor, scale_fmt: str, *, block: int = QUANT_BLOCK, amax_rtol: float = 0.0,
    rtol: float = 0.0,
) -> str | None:
    """Judge block scales ``[..., n // block]`` of the exact values ``x`` ``[..., n]``.

    ``ue8m0``: each scale must be exactly ``2**ceil(log2(max(amax, 1e-4) / 448))``. ``float``: anything from
    ``amax / 448`` (no clipping) up to that power of two (no coarser than ue8m0), so both rules pass.
    ``amax_rtol``: how far the quantizer's own ``amax`` may be from the kit's (a rotation in lower precision);
    a block within that of a power-of-two boundary may take either neighbouring power. ``rtol``: rounding of a
    scale recovered by division.
    """
    from dsa_runtime.testing.compare import unravel

    got = scales.float().to(x.device)
    amax = x.float().reshape(*x.shape[:-1], -1, block).abs().amax(-1)
    if got.shape != amax.shape:
        return f"{name}: shape {tuple(got.shape)}, expected {tuple(amax.shape)}"
    lo_a, hi_a = amax * (1 - amax_rtol), amax * (1 + amax_rtol)
    hi = pow2_scale(hi_a) * (1 + rtol)
    if scale_fmt == "ue8m0":
        cands = (pow2_scale(lo_a), pow2_scale(amax), pow2_scale(hi_a))
        ok = torch.zeros_like(got, dtype=torch.bool)
        for c in cands:
            ok |= (got - c).abs() <= rtol * c
        rule = "2^ceil(log2(amax/448))"
    else:
        lo = lo_a.clamp_min(FP8_AMAX_FLOOR) / FP8_MAX * (1 - rtol)
        ok = (got >= lo) & (got <= hi)
        rule = "in [amax/448, 2^ceil(log2(amax/448))]"
    bad = ~ok
    if not bool(bad.any()):
        return None
    at = unravel(int(torch.nonzero(bad.reshape(-1))[0]), got.shape)
    g, want, a = float(got[at]), float(pow2_scale(amax)[at]), float(amax[at])
    if g > 0 and math.isfinite(g) and want > 0 and abs(math.log2(g / want) - round(math.log2(g / want))) < 1e-9:
        k = round(math.log2(g / want))
        how = f"{2.0 ** abs(k):g} times too {'coarse' if k > 0 else 'fine'}" if k else "wrong"
    else:
        how = "not a power of two" if scale_fmt == "ue8m0" else "outside the valid range"
    return (
        f"{name}: {int(bad.sum())} of {got.numel()} {scale_fmt} scales are not {rule}; first at {at} "
        f"(block amax {a:.6g}): got {g:.6g}, want {want:.6g} ({how})"
    )


def hadamard_rotate(x: Tensor) -> Tensor:
    """``H x / sqrt(n)`` on the last dim with the Sylvester matrix, by a float64 matmul (kit's own)."""
    n = x.shape[-1]
    h = torch.ones(1, 1, dtype=torch.float64, device=x.device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (x.double() @ h / math.sqrt(n)).float()


def random_e4m3(gen: torch.Generator, shape: tuple[int, ...], device: torch.device, spread: float = 96.0) -> Tensor:
    """Random e4m3 values over most of the range (``N(0, spread)`` clamped to +-448), a few exact zeros."""
    x = torch.randn(shape, generator=gen, device=device) * spread
    x = torch.where(torch.rand(shape, generator=gen, device=device) < 0.02, torch.zeros_like(x), x)
    return x.clamp(-FP8_MAX, FP8_MAX).to(E4M3)


def random_bytes(gen: torch.Generator, shape: tuple[int, ...], device: torch.device) -> Tensor:
    """Garbage uint8 (poison for caches; includes e4m3 NaN bit patterns 0x7f/0xff)."""
    return torch.randint(0, 256, shape, generator=gen, device=device, dtype=torch.int32).to(torch.uint8)


EDGE_PATTERNS = ("zero", "tiny", "pm448", "pow2", "normal", "amax_pow2", "large", "spike")


def edge_tiles(gen: torch.Generator, rows: int, n: int, device: torch.device) -> Tensor:
    """``[rows, n]`` fp32 whose 128-blocks cycle through FP8 scale edge patterns (:data:`EDGE_PATTERNS`).

    zero: an all-zero block (amax floored at 1e-4); tiny: |x| < 1e-4; pm448: +-448 present (scale 1 under
    both rules); pow2: random +-2**k; normal: N(0, 1); amax_pow2: amax exactly 448 * 2**j (a ue8m0 boundary);
    large: ~1e4; spike: one outlier among small values. All values are exact in bf16.
    """
    blocks = n // QUANT_BLOCK
    out = torch.empty(rows, blocks, QUANT_BLOCK, device=device)
    shape = (QUANT_BLOCK,)
    for r in range(rows):
        for b in range(blocks):
            kind = EDGE_PATTERNS[(r + 3 * b) % len(EDGE_PATTERNS)]
            sign = torch.where(torch.rand(shape, generator=gen, device=device) < 0.5, -1.0, 1.0)
            base = torch.randn(shape, generator=gen, device=device)
            if kind == "zero":
                v = torch.zeros(shape, device=device)
            elif kind == "tiny":
                v = base * 1e-5
            elif kind == "pm448":
                v = (base * 100).clamp(-447, 447)
                v[r % QUANT_BLOCK] = 448.0 if r % 2 else -448.0
            elif kind == "pow2":
                exps = torch.randint(-10, 11, shape, generator=gen, device=device).float()
                v = sign * torch.exp2(exps)
            elif kind == "normal":
                v = base
            elif kind == "amax_pow2":
                j = (r + b) % 7 - 3
                v = (base * 0.2 * 448 * 2.0**j).clamp(-440 * 2.0**j, 440 * 2.0**j)
                v[(7 * r + b) % QUANT_BLOCK] = 448.0 * 2.0**j
            elif kind == "large":
                v = base * 1e4
            else:  # spike
                v = base * 1e-2
                v[(5 * r + b) % QUANT_BLOCK] = 300.0
            out[r, b] = v
    return out.reshape(rows, n).to(torch.bfloat16).float()


def pack_mla_656(c: Tensor, k_pe: Tensor, scale_fmt: str) -> Tensor:
    """Kit's packer of 656-byte rows: 512 e4m3 of ``c``, 4 fp32 scales, 64 bf16 of ``k_pe``."""
    c8, s = quantize(c.float(), scale_fmt)
    return torch.cat(
        [
            c8.view(torch.uint8),
            s.contiguous().view(torch.uint8).reshape(c.shape[0], -1),
            k_pe.to(torch.bfloat16).contiguous().view(torch.uint8),
        ],
        dim=-1,
    )


def unpack_mla_656(rows: Tensor) -> Tensor:
    """Kit's reader of 656-byte rows -> ``[N, 576]`` fp32."""
    n = rows.shape[0]
    c = rows[:, :D_LATENT].contiguous().view(E4M3).float().reshape(n, 4, QUANT_BLOCK)
    s = rows[:, D_LATENT : D_LATENT + 16].contiguous().view(torch.float32).reshape(n, 4, 1)
    k_pe = rows[:, D_LATENT + 16 :].contiguous().view(torch.bfloat16).float()
    return torch.cat([(c * s).reshape(n, D_LATENT), k_pe], dim=-1)


def index_cache_write(cache: Tensor, slots: Tensor, k8: Tensor, k_scale: Tensor) -> Tensor:
    """Kit's writer of ``index_k_132`` pages (returns a new tensor; slot -1 skipped).

    Page ``p`` row: ``page_size * 128`` key bytes (token-major), then ``page_size`` fp32 scales.
    """
    out = cache.clone()
    page_size = cache.shape[1] // (INDEX_HEAD_DIM + 4)
    keep = slots.long() >= 0
    slot = slots.long()[keep].to(cache.device)
    page, off = (slot // page_size)[:, None], (slot % page_size)[:, None]
    key_at = off * INDEX_HEAD_DIM + torch.arange(INDEX_HEAD_DIM, device=cache.device)
    scale_at = page_size * INDEX_HEAD_DIM + 4 * off + torch.arange(4, device=cache.device)
    out[page, key_at] = k8[keep].contiguous().view(torch.uint8)
    out[page, scale_at] = k_scale[keep].float().contiguous().reshape(-1, 1).view(torch.uint8)
    return out


def describe_index_byte(col: int, page_size: int) -> str:
    """Human name of byte ``col`` inside an ``index_k_132`` page."""
    keys = page_size * INDEX_HEAD_DIM
    if col < keys:
        return f"key byte {col % INDEX_HEAD_DIM} of token {col // INDEX_HEAD_DIM}"
    return f"scale byte {(col - keys) % 4} of token {(col - keys) // 4}"
