"""Dequantised expert weights, computed once per :class:`ExpertWeights` and reused by every call.

The reference dequantises FP8 experts (``repeat_interleave`` of the block scales, fp32 products) on every
call; a decode step calls the MoE once per layer, so that work dominated CPU decode. Here the copy is made
on first use and kept while the weight tensor lives (a weak reference on ``w13``), and dropped when the
weights change in place (tensor version counters, where the tensor has one). The copy is in the dtype of
the activations: bf16 for bf16 models (CPUs with AVX512-BF16/AMX run bf16 GEMMs several times faster than
fp32, and the contract allows bf16 intermediates), fp32 for a float32 model (its verification mode).
``small_fp32`` gives an fp32 copy for bf16 models too, for experts with only a few tokens (a bf16 GEMM has a
fixed cost of ~15 us on CPU, an fp32 GEMV of a few rows is faster), unless that copy would be large.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

from dsa_runtime.families import ExpertWeights
from dsa_runtime.reference.fp8 import block_dequant_weight

# w13 tensor -> {dtype: (versions of the four tensors, w13 [E, 2I, D], w2 [E, D, I])}
_CACHE = WeakIdKeyDictionary()  # keyed by identity: Tensor.__eq__ is elementwise


def _version(t: Tensor | None) -> int:
    # Inference tensors (weights loaded under torch.inference_mode) have no version counter; they are
    # not changed in place after loading, and new weights are new tensors (a new cache key).
    return -1 if t is None or t.is_inference() else t._version


def _versions(experts: ExpertWeights) -> tuple[int, ...]:
    return tuple(_version(t) for t in (experts.w13, experts.w2, experts.w13_scale, experts.w2_scale))


def _dequant(w: Tensor, scale: Tensor | None, dtype: torch.dtype) -> Tensor:
    if scale is None:
        return w.to(dtype)
    return block_dequant_weight(w, scale).to(dtype)


FP32_COPY_LIMIT = 256 << 20  # bytes: above this, bf16 models do not keep a second (fp32) copy


def small_fp32(experts: ExpertWeights) -> bool:
    """Whether a bf16 model may also keep an fp32 copy of these experts (for few-token GEMMs)."""
    return (experts.w13.numel() + experts.w2.numel()) * 4 <= FP32_COPY_LIMIT


def compute_weights(experts: ExpertWeights, dtype: torch.dtype = torch.bfloat16) -> tuple[Tensor, Tensor]:
    """``w13`` ``[E, 2I, D]`` and ``w2`` ``[E, D, I]`` in ``dtype`` (block-dequantised when FP8), cached."""
    if experts.is_fp8 and experts.w2_scale is None:
        raise ValueError("FP8 experts need both w13_scale and w2_scale")
    if not experts.is_fp8 and experts.w13.dtype == dtype and experts.w2.dtype == dtype:
        return experts.w13, experts.w2
    versions = _versions(experts)
    per_dtype = _CACHE.get(experts.w13)
    if per_dtype is None:
        per_dtype = _CACHE[experts.w13] = {}
    hit = per_dtype.get(dtype)
    if hit is not None and hit[0] == versions:
        return hit[1], hit[2]
    w13 = _dequant(experts.w13, experts.w13_scale, dtype)
    w2 = _dequant(experts.w2, experts.w2_scale, dtype)
    per_dtype[dtype] = (versions, w13, w2)
    return w13, w2
