"""Triton kernels of :mod:`.kv_quant` (imported on first use, so that the claims there need no triton).

Each kernel addresses one byte buffer through typed views of it (e4m3 / fp32 / bf16: every field of the
656-byte row and of the index_k_132 page starts at a multiple of its own size), so nothing is reinterpreted
inside a kernel. Slot ``-1`` rows are masked out; launches are sized from shapes only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from dsa_runtime.plugins.cuda_hopper.triton.moe_quant import INTERPRET, fp8_quantize, fp8_scale

E4M3 = torch.float8_e4m3fn
BLOCK_R = 4  # rows per program of the MLA row kernels
BLOCK_I = 16  # tokens per program of the index-K kernels


@triton.jit
def _pack_fp8_kernel(c_ptr, kpe_ptr, slot_ptr, o8_ptr, o32_ptr, o16_ptr, N, stride_c, stride_kpe,
                     HAS_SLOTS: tl.constexpr, BLOCK_R: tl.constexpr, PRE_ROUND: tl.constexpr):
    """Rows ``r`` of c/k_pe -> 656-byte row ``slot[r]`` (or ``r``) of the output, through three typed views."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = r < N
    if HAS_SLOTS:
        dst = tl.load(slot_ptr + r, mask=ok, other=-1).to(tl.int64)
        ok = ok & (dst >= 0)
    else:
        dst = r.to(tl.int64)
    j = tl.arange(0, 4)
    t = tl.arange(0, 128)
    cols = j[None, :, None] * 128 + t[None, None, :]
    m3 = ok[:, None, None]
    x = tl.load(c_ptr + r[:, None, None].to(tl.int64) * stride_c + cols, mask=m3, other=0.0).to(tl.float32)
    s = fp8_scale(tl.max(tl.abs(x), axis=2), True)  # [R, 4]
    tl.store(o8_ptr + dst[:, None, None] * 656 + cols, fp8_quantize(x, s[:, :, None], PRE_ROUND), mask=m3)
    tl.store(o32_ptr + dst[:, None] * 164 + 128 + j[None, :], s, mask=ok[:, None])
    p = tl.arange(0, 64)
    kpe = tl.load(kpe_ptr + r[:, None].to(tl.int64) * stride_kpe + p[None, :], mask=ok[:, None])
    tl.store(o16_ptr + dst[:, None] * 328 + 264 + p[None, :], kpe.to(tl.bfloat16), mask=ok[:, None])


@triton.jit
def _pack_bf16_kernel(c_ptr, kpe_ptr, slot_ptr, o_ptr, N, stride_c, stride_kpe,
                      HAS_SLOTS: tl.constexpr, BLOCK_R: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = r < N
    if HAS_SLOTS:
        dst = tl.load(slot_ptr + r, mask=ok, other=-1).to(tl.int64)
        ok = ok & (dst >= 0)
    else:
        dst = r.to(tl.int64)
    d = tl.arange(0, 512)
    c = tl.load(c_ptr + r[:, None].to(tl.int64) * stride_c + d[None, :], mask=ok[:, None])
    tl.store(o_ptr + dst[:, None] * 576 + d[None, :], c.to(tl.bfloat16), mask=ok[:, None])
    p = tl.arange(0, 64)
    kpe = tl.load(kpe_ptr + r[:, None].to(tl.int64) * stride_kpe + p[None, :], mask=ok[:, None])
    tl.store(o_ptr + dst[:, None] * 576 + 512 + p[None, :], kpe.to(tl.bfloat16), mask=ok[:, None])


@triton.jit
def _unpack_fp8_kernel(i8_ptr, i32_ptr, i16_ptr, out_ptr, N, stride8, stride32, stride16, BLOCK_R: tl.constexpr):
    """656-byte rows (row stride given per view, so rows gathered out of pages need no copy) -> [N, 576] bf16."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = r < N
    r64 = r.to(tl.int64)
    j = tl.arange(0, 4)
    t = tl.arange(0, 128)
    cols = j[None, :, None] * 128 + t[None, None, :]
    x8 = tl.load(i8_ptr + r64[:, None, None] * stride8 + cols, mask=ok[:, None, None], other=0.0)
    s = tl.load(i32_ptr + r64[:, None] * stride32 + 128 + j[None, :], mask=ok[:, None], other=0.0)
    c = (x8.to(tl.float32) * s[:, :, None]).to(tl.bfloat16)
    tl.store(out_ptr + r64[:, None, None] * 576 + cols, c, mask=ok[:, None, None])
    p = tl.arange(0, 64)
    kpe = tl.load(i16_ptr + r64[:, None] * stride16 + 264 + p[None, :], mask=ok[:, None])
    tl.store(out_ptr + r64[:, None] * 576 + 512 + p[None, :], kpe, mask=ok[:, None])


@triton.jit(do_not_specialize=["N"])  # the row count varies every step: no recompiles mid-serving
def _index_k_kernel(cache8_ptr, cache32_ptr, slot_ptr, k8_ptr, ks_ptr, N, PAGE: tl.constexpr,
                    STORE: tl.constexpr, BLOCK_R: tl.constexpr):
    """Store (``STORE``) or gather ``k8`` [N, 128] bytes and ``k_scale`` [N] at ``slots`` of index_k_132 pages."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = r < N
    slot = tl.load(slot_ptr + r, mask=ok, other=-1).to(tl.int64)
    ok = ok & (slot >= 0)
    slot = tl.where(ok, slot, 0)
    page = slot // PAGE
    off = slot % PAGE
    d = tl.arange(0, 128)
    key = page[:, None] * (PAGE * 132) + off[:, None] * 128 + d[None, :]  # byte address of each key byte
    word = page * (PAGE * 33) + PAGE * 32 + off  # fp32 word address of the scale
    r64 = r.to(tl.int64)
    if STORE:
        k = tl.load(k8_ptr + r64[:, None] * 128 + d[None, :], mask=ok[:, None])
        tl.store(cache8_ptr + key, k, mask=ok[:, None])
        tl.store(cache32_ptr + word, tl.load(ks_ptr + r, mask=ok), mask=ok)
    else:
        k = tl.load(cache8_ptr + key, mask=ok[:, None], other=0)
        tl.store(k8_ptr + r64[:, None] * 128 + d[None, :], k, mask=(r < N)[:, None])
        tl.store(ks_ptr + r, tl.load(cache32_ptr + word, mask=ok, other=0.0), mask=r < N)


def pack_rows(c: Tensor, k_pe: Tensor, slots: Tensor | None, out: Tensor, layout: str) -> None:
    """Write the rows of c/k_pe into ``out`` viewed as ``[rows, W]`` (at ``slots`` when given)."""
    n = c.shape[0]
    if n == 0:
        return
    c = c if c.stride(1) == 1 else c.contiguous()
    k_pe = k_pe if k_pe.stride(1) == 1 else k_pe.contiguous()
    if slots is not None:
        slots = slots.to(device=c.device, dtype=torch.int64).contiguous()
    grid = (triton.cdiv(n, BLOCK_R),)
    flat = out.view(-1, out.shape[-1])
    sl = slots if slots is not None else flat  # any pointer: unused when HAS_SLOTS is False
    if layout == "fp8_656":
        _pack_fp8_kernel[grid](c, k_pe, sl, flat.view(E4M3), flat.view(torch.float32), flat.view(torch.bfloat16),
                               n, c.stride(0), k_pe.stride(0), HAS_SLOTS=slots is not None, BLOCK_R=BLOCK_R,
                               PRE_ROUND=INTERPRET, num_warps=4)
    else:
        _pack_bf16_kernel[grid](c, k_pe, sl, flat, n, c.stride(0), k_pe.stride(0), HAS_SLOTS=slots is not None,
                                BLOCK_R=BLOCK_R, num_warps=4)


def unpack_fp8(rows: Tensor, out: Tensor) -> None:
    """``[N, 656]`` uint8 rows (16-byte aligned, unit column stride) -> ``out`` ``[N, 576]`` bf16."""
    n = rows.shape[0]
    r8, r32, r16 = (rows.view(t) for t in (E4M3, torch.float32, torch.bfloat16))
    _unpack_fp8_kernel[(triton.cdiv(n, BLOCK_R),)](r8, r32, r16, out, n, r8.stride(0), r32.stride(0), r16.stride(0),
                                                   BLOCK_R=BLOCK_R, num_warps=4)


def index_k(index_cache: Tensor, slots: Tensor, k8: Tensor, k_scale: Tensor, page: int, store: bool) -> None:
    """Store ``k8`` (uint8 ``[N, 128]``) / ``k_scale`` at ``slots`` of the pages, or gather them (``store=False``)."""
    n = slots.shape[0]
    _index_k_kernel[(triton.cdiv(n, BLOCK_I),)](index_cache, index_cache.view(torch.float32), slots, k8, k_scale, n,
                                                PAGE=page, STORE=store, BLOCK_R=BLOCK_I, num_warps=4)
