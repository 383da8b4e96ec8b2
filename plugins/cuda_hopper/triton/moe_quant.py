"""Per-(row, 128-column block) FP8 e4m3 quantization of activations, with the checkpoint's scale rule.

``s = max(amax, 1e-4) / 448`` (a correctly rounded division), rounded *up* to a power of two for ``ue8m0``
(V3.1/V3.2) and kept as is for ``float`` (V3/R1); ``x8 = e4m3(clamp(x / s, +-448))``. The last block of a row
may be partial (its amax covers only the real columns).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

FP8 = torch.float8_e4m3fn
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"  # CPU interpreter work-arounds (see fp8_quantize)


@triton.jit
def fp8_scale(amax, UE8M0: tl.constexpr):
    """Scale of a block from its ``amax`` (fp32, any shape); exact power-of-two round-up for ue8m0."""
    s = tl.math.div_rn(tl.maximum(amax, 1e-4), tl.full(amax.shape, 448.0, tl.float32))
    if UE8M0:
        bits = s.to(tl.int32, bitcast=True)
        exp_bits = bits & 0x7F800000
        bits = tl.where((bits & 0x007FFFFF) != 0, exp_bits + 0x00800000, exp_bits)
        s = bits.to(tl.float32, bitcast=True)
    return s


@triton.jit
def fp8_quantize(x, s, PRE_ROUND: tl.constexpr = False):
    """``e4m3(clamp(x / s, +-448))`` with ``s`` broadcasting against ``x``.

    ``PRE_ROUND`` (only under ``TRITON_INTERPRET=1``) rounds to the e4m3 grid in fp32 first: the CPU
    interpreter of Triton 3.6 converts wrongly when rounding carries into the exponent (127 -> 64). The GPU
    conversion (``cvt.rn.satfinite``) rounds to nearest even itself.
    """
    q = tl.minimum(tl.maximum(tl.math.div_rn(x, s), -448.0), 448.0)
    if PRE_ROUND:
        exp_bits = q.to(tl.int32, bitcast=True) & 0x7F800000
        ulp = tl.maximum((exp_bits - (3 << 23)).to(tl.float32, bitcast=True), 2.0**-9)
        magic = 12582912.0  # 1.5 * 2**23: adding and subtracting it rounds to an integer, ties to even
        q = ((q / ulp + magic) - magic) * ulp
    return q.to(tl.float8e4nv)


@triton.jit
def store_block_fp8(x, q_ptr, s_ptr, rows, cols, kb, m, R, stride_q, stride_s, UE8M0: tl.constexpr,
                    PRE_ROUND: tl.constexpr):
    """Quantize the fp32 tile ``x`` ``[BLOCK_R, 128]`` (column block ``kb`` of ``rows``) with one scale per row
    and store it and the scales."""
    s = fp8_scale(tl.max(tl.abs(x), axis=1), UE8M0)
    tl.store(q_ptr + rows[:, None].to(tl.int64) * stride_q + cols[None, :], fp8_quantize(x, s[:, None], PRE_ROUND), mask=m)
    tl.store(s_ptr + rows * stride_s + kb, s, mask=rows < R)


@triton.jit
def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, R, N, stride_x, stride_q, stride_s, UE8M0: tl.constexpr,
                       BLOCK_R: tl.constexpr, PRE_ROUND: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    kb = tl.program_id(1)
    cols = kb * 128 + tl.arange(0, 128)
    m = (rows < R)[:, None] & (cols < N)[None, :]
    x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_x + cols[None, :], mask=m, other=0.0).to(tl.float32)
    store_block_fp8(x, q_ptr, s_ptr, rows, cols, kb, m, R, stride_q, stride_s, UE8M0, PRE_ROUND)


def _launch_rows(kernel, src: Tensor, rows: int, n: int, scale_fmt: str) -> tuple[Tensor, Tensor]:
    """Allocate ``[rows, n]`` e4m3 and ``[rows, ceil(n / 128)]`` fp32 scales and run ``kernel`` over them
    (4 rows x one 128-column block per program)."""
    if scale_fmt not in ("ue8m0", "float"):
        raise ValueError(f"unknown scale_fmt {scale_fmt!r}; valid: ue8m0, float")
    nb = triton.cdiv(n, 128)
    q = torch.empty(rows, n, dtype=FP8, device=src.device)
    s = torch.empty(rows, nb, dtype=torch.float32, device=src.device)
    if rows:
        block_r = 4
        kernel[(triton.cdiv(rows, block_r), nb)](
            src, q, s, rows, n, src.stride(0), q.stride(0), s.stride(0), UE8M0=scale_fmt == "ue8m0",
            BLOCK_R=block_r, PRE_ROUND=INTERPRET, num_warps=4,
        )
    return q, s


def quantize_rows(x: Tensor, scale_fmt: str) -> tuple[Tensor, Tensor]:
    """``x`` ``[R, N]`` bf16/fp32 -> ``x8`` ``[R, N]`` e4m3 and scales ``[R, ceil(N / 128)]`` fp32."""
    return _launch_rows(_quant_rows_kernel, x, x.shape[0], x.shape[1], scale_fmt)


@triton.jit
def _swiglu_quant_kernel(h_ptr, q_ptr, s_ptr, R, INTER, stride_h, stride_q, stride_s, UE8M0: tl.constexpr,
                         BLOCK_R: tl.constexpr, PRE_ROUND: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    kb = tl.program_id(1)
    cols = kb * 128 + tl.arange(0, 128)
    m = (rows < R)[:, None] & (cols < INTER)[None, :]
    base = h_ptr + rows[:, None].to(tl.int64) * stride_h + cols[None, :]
    g = tl.load(base, mask=m, other=0.0).to(tl.float32)
    u = tl.load(base + INTER, mask=m, other=0.0).to(tl.float32)
    act = g / (1.0 + tl.exp(-g)) * u
    store_block_fp8(act, q_ptr, s_ptr, rows, cols, kb, m, R, stride_q, stride_s, UE8M0, PRE_ROUND)


def swiglu_quantize_rows(h13: Tensor, scale_fmt: str) -> tuple[Tensor, Tensor]:
    """``h13`` ``[R, 2I]`` bf16 (gate columns, then up) -> ``silu(gate) * up`` (fp32) quantized per 128:
    ``[R, I]`` e4m3 and ``[R, ceil(I / 128)]`` fp32 scales; one read of ``h13``, no fp32 temporaries."""
    return _launch_rows(_swiglu_quant_kernel, h13, h13.shape[0], h13.shape[1] // 2, scale_fmt)
