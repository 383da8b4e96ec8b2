"""Fused Hadamard rotation + per-row FP8 quantization of the indexer's q (with the head-weight fold) and k.

One program rotates ``ITERS`` blocks of ``BLOCK_R`` rows of 128 channels: ``y = x @ H * 128**-0.5`` as a
tensor-core ``tl.dot`` with the ``+-1`` Sylvester matrix in bf16 (exact entries; loaded once per program
from a per-device cache). A bf16 input is multiplied as is (exact products, fp32 sums); an fp32 input is
split into ``hi + lo`` bf16 halves and multiplied twice (the residue is below ``2**-17 |x|``, far inside the
kit's ``2**-8 |x|`` slack; TF32 would not be). Then one scale per row (``max(amax, 1e-4) / 448``, rounded
up to a power of two for ``ue8m0``) and ``e4m3(clamp(y / s, +-448))`` -- the rule of
:mod:`.moe_quant`, whose device helpers are reused. Under ``TRITON_INTERPRET=1`` (CPU tests) the rotation
runs as an fp32 dot: Triton 3.6's interpreter mis-computes bf16 ``tl.dot``. For q the row is a (token, head) pair and the kernel
also writes ``w = head_weights * s * H**-0.5 * 128**-0.5``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dsa_runtime.families import INDEX_HEAD_DIM
from dsa_runtime.plugins.cuda_hopper.triton.moe_quant import INTERPRET, fp8_quantize, fp8_scale
from dsa_runtime.reference.hadamard import hadamard_matrix

FP8 = torch.float8_e4m3fn
D = INDEX_HEAD_DIM
INV_SQRT_D = D**-0.5
_HADAMARD: dict[str, Tensor] = {}


def hadamard_bf16(device: torch.device) -> Tensor:
    """The ``[128, 128]`` ``+-1`` Sylvester matrix in bf16, built once per device."""
    key = str(device)
    m = _HADAMARD.get(key)
    if m is None:
        m = hadamard_matrix(D, device).to(torch.bfloat16).contiguous()
        _HADAMARD[key] = m
    return m


# The row count varies every step, and so does ITERS (1 .. iters for few rows): neither is specialised, so a
# new row count never compiles a new variant mid-serving.
@triton.jit(do_not_specialize=["R", "ITERS"])
def _rotate_quant_kernel(
    x_ptr, h_ptr, q_ptr, s_ptr, hw_ptr, w_ptr, R, stride_x, w_const, ITERS,
    FP32_IN: tl.constexpr, UE8M0: tl.constexpr, HAS_W: tl.constexpr, BLOCK_R: tl.constexpr,
    PRE_ROUND: tl.constexpr, UPCAST: tl.constexpr,
):
    d = tl.arange(0, 128)
    hmat = tl.load(h_ptr + d[:, None] * 128 + d[None, :])  # bf16 +-1, symmetric
    for it in range(ITERS):
        rows = (tl.program_id(0) * ITERS + it) * BLOCK_R + tl.arange(0, BLOCK_R)
        live = rows < R
        r64 = rows.to(tl.int64)
        x = tl.load(x_ptr + r64[:, None] * stride_x + d[None, :], mask=live[:, None], other=0.0)
        if UPCAST:  # interpreter only: its bf16 tl.dot is wrong; numpy's fp32 product is exact enough
            y = tl.dot(x.to(tl.float32), hmat.to(tl.float32), input_precision="ieee", out_dtype=tl.float32)
        elif FP32_IN:
            hi = x.to(tl.bfloat16)
            lo = (x - hi.to(tl.float32)).to(tl.bfloat16)
            y = tl.dot(hi, hmat, out_dtype=tl.float32)
            y = tl.dot(lo, hmat, y, out_dtype=tl.float32)
        else:
            y = tl.dot(x.to(tl.bfloat16), hmat, out_dtype=tl.float32)
        y = y * 0.08838834764831845  # 128 ** -0.5 (one fp32 rounding)
        s = fp8_scale(tl.max(tl.abs(y), axis=1), UE8M0)
        tl.store(q_ptr + r64[:, None] * 128 + d[None, :], fp8_quantize(y, s[:, None], PRE_ROUND), mask=live[:, None])
        tl.store(s_ptr + rows, s, mask=live)
        if HAS_W:
            hw = tl.load(hw_ptr + rows, mask=live, other=0.0).to(tl.float32)
            tl.store(w_ptr + rows, hw * (s * w_const), mask=live)


def rotate_quantize(
    x: Tensor, scale_fmt: str, head_weights: Tensor | None = None, heads: int = 1,
    *, block_r: int = 64, iters: int = 4, num_warps: int = 4,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``x`` ``[R, 128]`` bf16/fp32 -> ``x8`` ``[R, 128]`` e4m3, scales ``[R]`` fp32 and, when
    ``head_weights`` ``[R]`` is given, ``w`` ``[R]`` fp32 = ``head_weights * s * heads**-0.5 * 128**-0.5``."""
    if scale_fmt not in ("ue8m0", "float"):
        raise ValueError(f"unknown scale_fmt {scale_fmt!r}; valid: ue8m0, float")
    if x.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"indexer inputs must be bf16 or fp32, got {x.dtype}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows = x.shape[0]
    q = torch.empty(rows, D, dtype=FP8, device=x.device)
    s = torch.empty(rows, dtype=torch.float32, device=x.device)
    w = None
    if head_weights is not None:
        head_weights = head_weights.reshape(rows).contiguous()
        w = torch.empty(rows, dtype=torch.float32, device=x.device)
    if rows:
        iters = max(1, min(iters, triton.cdiv(rows, block_r)))
        grid = (triton.cdiv(rows, block_r * iters),)
        _rotate_quant_kernel[grid](
            x, hadamard_bf16(x.device), q, s, head_weights if w is not None else s, w if w is not None else s,
            rows, x.stride(0), float(heads**-0.5 * INV_SQRT_D), iters,
            FP32_IN=x.dtype == torch.float32, UE8M0=scale_fmt == "ue8m0", HAS_W=w is not None,
            BLOCK_R=block_r, PRE_ROUND=INTERPRET, UPCAST=INTERPRET, num_warps=num_warps,
        )
    return q, s, w
