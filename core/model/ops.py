"""Small numeric building blocks: RMSNorm, LayerNorm and the SwiGLU MLP (model dtype in, model dtype out)."""

from __future__ import annotations

import torch
from torch import Tensor


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """``x / rms(x) * weight`` computed in fp32 ([REF]'s rounding: normalise and scale, then cast once)."""
    # PyTorch's fused kernel computes the same fp32 expression (bit-identical bf16 outputs, measured) about
    # 6x faster on CPU than the five separate elementwise ops.
    return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps).to(x.dtype)


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    """LayerNorm with weight and bias in fp32 (the indexer's ``k_norm``); returns fp32."""
    return torch.nn.functional.layer_norm(x.float(), (x.shape[-1],), weight.float(), bias.float(), eps)


def swiglu_mlp(x: Tensor, w1: Tensor, w3: Tensor, w2: Tensor) -> Tensor:
    """Dense FFN ``w2 @ (silu(w1 @ x) * (w3 @ x))``; x ``[T, D]``, w1/w3 ``[I, D]``, w2 ``[D, I]``."""
    return (torch.nn.functional.silu(x @ w1.T) * (x @ w3.T)) @ w2.T
