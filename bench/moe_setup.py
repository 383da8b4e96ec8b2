"""Inputs and plain-PyTorch baselines of ``bench/moe.py`` at DeepSeek-V3.2 sizes."""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import ExpertWeights


def random_experts(n: int, dim: int, inter: int, fp8: bool, seed: int) -> ExpertWeights:
    """``n`` experts of random weights (never zeros), built one expert at a time to bound temporaries.

    FP8: e4m3 values of std ~96 and 128x128 block scales near ``cols**-0.5 / 96`` (half powers of two);
    bf16: std ``cols**-0.5``. Either way ``w @ x`` keeps unit scale.
    """
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.float8_e4m3fn if fp8 else torch.bfloat16
    w13 = torch.empty(n, 2 * inter, dim, dtype=dt, device="cuda")
    w2 = torch.empty(n, dim, inter, dtype=dt, device="cuda")
    for e in range(n):
        for w, cols in ((w13, dim), (w2, inter)):
            r = torch.randn(w.shape[1:], generator=gen, device="cuda")
            w[e] = (r * 96).clamp(-448, 448).to(dt) if fp8 else (r * cols**-0.5).to(dt)
    if not fp8:
        return ExpertWeights(w13, w2)

    def scales(rows: int, cols: int) -> Tensor:
        j = torch.rand(n, -(-rows // 128), -(-cols // 128), generator=gen, device="cuda") * 2 - 1
        return torch.exp2(j.round()) * (cols**-0.5 / 96)

    return ExpertWeights(w13, w2, scales(2 * inter, dim), scales(dim, inter))


def expert_bytes(experts: ExpertWeights) -> int:
    """Bytes of one expert's weights and scales."""
    n = experts.w13.shape[0]
    total = experts.w13.numel() * experts.w13.element_size() + experts.w2.numel() * experts.w2.element_size()
    if experts.is_fp8:
        total += (experts.w13_scale.numel() + experts.w2_scale.numel()) * 4
    return total // n


def _dequant_bf16(w: Tensor, s: Tensor | None) -> Tensor:
    if s is None:
        return w
    rows, cols = w.shape
    full = s.repeat_interleave(128, 0).repeat_interleave(128, 1)[:rows, :cols]
    return (w.to(torch.bfloat16) * full.to(torch.bfloat16))


def torch_loop(x: Tensor, w: Tensor, ids: Tensor, experts: ExpertWeights, shared: ExpertWeights | None) -> Tensor:
    """What a user writes in plain PyTorch: per used expert, gather its tokens, dequantize its weights to bf16
    on the fly, two bf16 matmuls with SwiGLU, scale and scatter-add in fp32."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    inter = experts.w2.shape[2]

    def ffn(xs: Tensor, ex: ExpertWeights, e: int) -> Tensor:
        w13 = _dequant_bf16(ex.w13[e], ex.w13_scale[e] if ex.is_fp8 else None)
        w2 = _dequant_bf16(ex.w2[e], ex.w2_scale[e] if ex.is_fp8 else None)
        h = xs @ w13.T
        return (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]) @ w2.T

    flat = ids.flatten().long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat[flat >= 0], minlength=experts.w13.shape[0]).tolist()
    start = int((flat < 0).sum())
    for e, c in enumerate(counts):
        if c:
            sel = order[start : start + c]
            start += c
            tok = sel // ids.shape[1]
            out.index_add_(0, tok, ffn(x[tok], experts, e).float() * w.flatten()[sel, None])
    if shared is not None:
        out += ffn(x, shared, 0).float()
    return out.to(torch.bfloat16)


def rel_l2_rows(got: Tensor, want: Tensor) -> tuple[float, float]:
    """(median, max) over rows of ``||got - want|| / ||want||``."""
    err = (got.float() - want.float()).norm(dim=1) / want.float().norm(dim=1).clamp_min(1e-30)
    return float(err.median()), float(err.max())
