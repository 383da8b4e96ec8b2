"""MLA cache rows -> fp32 ``[N, 576]`` for attention (``fp8_656`` through the e4m3 lookup table).

Same values as the reference's ``unpack_mla_fp32``: ``c = fp32(c8) * scale`` per 128-tile (exact: the scales
are powers of two), ``k_pe`` copied from its bf16 bytes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import D_LATENT, D_QK, FP8_MLA_ROW_BYTES, QUANT_BLOCK, MLALayout
from dsa_runtime.torch_kernels import e4m3

_SCALES_AT = D_LATENT  # 512
_ROPE_AT = D_LATENT + 4 * (D_LATENT // QUANT_BLOCK)  # 528


def rows_to_float(rows: Tensor, layout: MLALayout) -> Tensor:
    """``[N, 576]`` bf16 or ``[N, 656]`` uint8 rows -> ``[N, 576]`` fp32."""
    if layout == "bf16":
        if rows.dtype != torch.bfloat16 or rows.shape[-1] != D_QK:
            raise ValueError(f"bf16 rows must be [N, 576] bfloat16, got {tuple(rows.shape)} {rows.dtype}")
        return rows.float()
    if layout != "fp8_656":
        raise ValueError(f"unknown MLA layout {layout!r}")
    if rows.dtype != torch.uint8 or rows.shape[-1] != FP8_MLA_ROW_BYTES:
        raise ValueError(f"fp8_656 rows must be [N, 656] uint8, got {tuple(rows.shape)} {rows.dtype}")
    n = rows.shape[0]
    out = torch.empty(n, D_QK, dtype=torch.float32, device=rows.device)
    scales = rows[:, _SCALES_AT:_ROPE_AT].contiguous().view(torch.float32)  # [N, 4]
    c = e4m3.to_float(rows[:, :_SCALES_AT].contiguous()).view(n, D_LATENT // QUANT_BLOCK, QUANT_BLOCK)
    torch.mul(c, scales.unsqueeze(-1), out=out[:, :D_LATENT].view(n, D_LATENT // QUANT_BLOCK, QUANT_BLOCK))
    out[:, D_LATENT:] = rows[:, _ROPE_AT:].contiguous().view(torch.bfloat16)
    return out
