"""Small numeric building blocks: RMSNorm, LayerNorm and the SwiGLU MLP (model dtype in, model dtype out)."""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

FEW_ROWS = 8  # bf16 inputs with at most this many rows multiply in fp32 on CPU (see ``linear``)
FP32_COPY_LIMIT = 16 << 20  # bytes: larger weights are never given an fp32 copy
_FP32 = WeakIdKeyDictionary()  # weight tensor -> its fp32 copy (kept while the weight lives)


def fp32_copy(w: Tensor) -> Tensor | None:
    """A cached fp32 copy of a small bf16 CPU weight (None for others): a CPU bf16 GEMM has a fixed cost of
    ~20-30 us that dominates few-row products (decode), where an fp32 GEMV of the same values takes 4-12 us."""
    if w.dtype != torch.bfloat16 or w.device.type != "cpu" or w.numel() * 4 > FP32_COPY_LIMIT:
        return None
    got = _FP32.get(w)
    if got is None:
        got = _FP32[w] = w.float()
    return got


_MM_OUT_DTYPE: dict[str, bool] = {}  # device type -> torch.mm(..., out_dtype=) works there


def linear_fp32(x: Tensor, w: Tensor) -> Tensor:
    """``x @ w.T`` returned in fp32 without rounding to x's dtype: the fp32 accumulator of a bf16 GEMM (CUDA:
    ``torch.mm(out_dtype=float32)``), or an fp32 GEMM of the same bf16 values (CPU has no bf16 GEMM with an
    fp32 output; bf16 x bf16 products are exact in fp32, so only the summation order differs)."""
    if x.dtype == torch.float32 and w.dtype == torch.float32:
        return x @ w.T
    dev = x.device.type
    if dev == "cuda" and _MM_OUT_DTYPE.get(dev, True) and x.dtype == w.dtype == torch.bfloat16:
        try:
            return torch.mm(x.reshape(-1, x.shape[-1]), w.T, out_dtype=torch.float32).view(*x.shape[:-1], w.shape[0])
        except (RuntimeError, TypeError):
            _MM_OUT_DTYPE[dev] = False  # this torch build has no bf16 -> fp32 mm: fp32 GEMM below
    wf = fp32_copy(w)
    return x.float() @ (wf if wf is not None else w.float()).T


def linear(x: Tensor, w: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
    """``x @ w.T`` (x ``[T, in]``, w ``[out, in]``) in x's dtype (``out_dtype`` float32: the unrounded fp32
    result, for row-parallel partial sums; see :func:`linear_fp32`). Few bf16 rows on CPU use the fp32 copy
    of ``w``: the inputs are bf16 values either way and both accumulate in fp32, then round once to bf16."""
    if out_dtype == torch.float32 and x.dtype != torch.float32:
        return linear_fp32(x, w)
    if x.shape[0] <= FEW_ROWS and x.dtype == torch.bfloat16:
        wf = fp32_copy(w)
        if wf is not None:
            return (x.float() @ wf.T).to(x.dtype)
    return x @ w.T


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``x / rms(x) * weight`` computed in fp32 ([REF]'s rounding: normalise and scale, then cast once)."""
    # PyTorch's fused kernel computes the same fp32 expression (bit-identical bf16 outputs, measured) about
    # 6x faster on CPU than the five separate elementwise ops.
    return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """LayerNorm with weight and bias in fp32 (the indexer's ``k_norm``); returns fp32."""
    return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps)


def swiglu_mlp(x: Tensor, w1: Tensor, w3: Tensor, w2: Tensor, out_dtype: torch.dtype | None = None) -> Tensor:
    """Dense FFN ``w2 @ (silu(w1 @ x) * (w3 @ x))``; x ``[T, D]``, w1/w3 ``[I, D]``, w2 ``[D, I]``. Output in
    x's dtype, or unrounded fp32 with ``out_dtype`` float32 (a TP rank's partial sum)."""
    return linear(torch.nn.functional.silu(linear(x, w1)) * linear(x, w3), w2, out_dtype)
