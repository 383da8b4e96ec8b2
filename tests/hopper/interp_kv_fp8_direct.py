"""Direct interpreter checks of the FP8 decode and the KV stores (imported by ``interp_kv_fp8.py``)."""

from __future__ import annotations

import torch

from dsa_runtime.plugins.cuda_hopper.triton.kv_quant import TritonKVQuant
from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import DecodeConfig, decode_fp8_656
from dsa_runtime.reference.kv_quant import ReferenceKVQuant
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn

SM = 0.135234


def _problem(gen: torch.Generator, batch: int, heads: int, k: int, pages: int = 6, page: int = 16, pad: float = 0.25):
    """Random q, a cache with every slot packed by the reference, and indices with ~pad of them -1."""
    n = pages * page
    c = torch.randn(n, 512, generator=gen) * torch.exp2(torch.randint(-2, 1, (n, 1), generator=gen).float())
    k_pe = torch.randn(n, 64, generator=gen)
    cache = ReferenceKVQuant().quantize_mla(c.bfloat16(), k_pe.bfloat16(), layout="fp8_656").view(pages, page, 656)
    q = torch.randn(batch, 1, heads, 576, generator=gen).bfloat16()
    idx = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(batch)]).int().view(batch, 1, k)
    idx = torch.where(torch.rand(idx.shape, generator=gen) < pad, -1, idx).int()
    return q, cache, idx


def _close(name: str, got: tuple, want: tuple) -> str | None:
    out, lse = got
    w_out, w_lse = want
    if out.shape != w_out.shape or lse.shape != w_lse.shape or out.dtype != torch.bfloat16:
        return f"{name}: shapes {tuple(out.shape)} {tuple(lse.shape)} {out.dtype}"
    inf = torch.isposinf(w_lse)
    if not torch.equal(inf, torch.isposinf(lse)) or bool(out[inf].ne(0).any()):
        return f"{name}: empty queries not zeros/+inf"
    err = (out.float() - w_out.float()).abs().max().item()
    lerr = (lse[~inf] - w_lse[~inf]).abs().max().item() if bool((~inf).any()) else 0.0
    if err > 2e-2 or lerr > 2e-3:
        return f"{name}: max |out err| {err:.3g}, |lse err| {lerr:.3g}"
    return None


def _report(name: str, msg: str | None) -> int:
    print(f"direct {name}: {'passed' if msg is None else 'FAILED ' + msg}")
    return msg is not None


def direct_checks() -> int:
    gen = torch.Generator().manual_seed(7)
    ref = ReferenceSparseAttn()
    bad = 0
    for heads in (1, 16, 20, 128):
        q, cache, idx = _problem(gen, 2, heads, 40)
        want = ref.decode(q, cache, idx, SM, layout="fp8_656")
        bad += _report(f"heads {heads}", _close(f"h{heads}", decode_fp8_656(q, cache, idx, SM), want))
    q, cache, idx = _problem(gen, 1, 16, 96)
    one = decode_fp8_656(q, cache, idx, SM, config=DecodeConfig(16, 16, 4, 2, splits=1))
    many = decode_fp8_656(q, cache, idx, SM, config=DecodeConfig(16, 16, 4, 2, splits=5))
    msg = _close("split", many, ref.decode(q, cache, idx, SM, layout="fp8_656")) or _close("unsplit", one, many)
    bad += _report("split 5 vs unsplit", msg)
    q, cache, idx = _problem(gen, 2, 20, 24)
    idx[0] = -1
    cache.view(-1, 656)[-1] = 0x7F  # the slot a dereferenced -1 would read: e4m3 NaNs
    for splits in (1, 3):
        out, lse = decode_fp8_656(q, cache, idx, SM, d_v=512, config=DecodeConfig(32, 16, 4, 2, splits=splits))
        ok = bool(torch.isposinf(lse[0]).all()) and bool((out[0] == 0).all()) and bool(torch.isfinite(out[1]).all())
        bad += _report(f"all -1 (splits {splits})", None if ok else "request 0 not zeros/+inf or NaN leaked")
    # Both kernels explicitly (the default picks one): padded slots, a poisoned last slot, split and unsplit.
    q, cache, idx = _problem(gen, 2, 20, 72)
    cache.view(-1, 656)[-1] = 0x7F
    want = ref.decode(q, cache, idx, SM, layout="fp8_656")
    for variant in ("plain", "pipe"):
        for splits in (1, 3):
            got = decode_fp8_656(q, cache, idx, SM, config=DecodeConfig(32, 16, 4, 2, splits, variant))
            bad += _report(f"{variant} splits {splits}", _close(f"{variant}/{splits}", got, want))
    bad += _store_checks(gen)
    return bad


def _store_checks(gen: torch.Generator) -> int:
    kq, ref = TritonKVQuant(), ReferenceKVQuant()
    bad = 0
    n, pages, page = 12, 4, 8
    c = (torch.randn(n, 512, generator=gen) * 3).bfloat16()
    c[0, :128] = 448.0  # amax == 448 * 2**0: scale exactly 1
    c[1, 128:256] = 0.0  # amax floored at 1e-4
    c[2, 256:384] = 2.0**-20
    k_pe = torch.randn(n, 64, generator=gen).bfloat16()
    slots = torch.randperm(pages * page - 1, generator=gen)[:n]
    slots[3] = slots[7] = -1
    for layout, fill in (("fp8_656", 0xA5), ("bf16", float("nan"))):
        width, dtype = (656, torch.uint8) if layout == "fp8_656" else (576, torch.bfloat16)
        cache = torch.full((pages, page, width), fill, dtype=dtype)
        want = cache.clone()
        kq.store_mla(cache, slots, c, k_pe, layout=layout)
        ref.store_mla(want, slots, c, k_pe, layout=layout)
        same = torch.equal(cache.view(torch.uint8), want.view(torch.uint8))
        bad += _report(f"store_mla {layout} bit-exact, -1 skipped", None if same else "bytes differ from the reference")
    idx_cache = torch.randint(0, 256, (pages, page * 132), generator=gen, dtype=torch.uint8)
    want = idx_cache.clone()
    k8 = torch.randn(n, 128, generator=gen).to(torch.float8_e4m3fn)
    ks = torch.rand(n, generator=gen)
    kq.store_index_k(idx_cache, slots, k8, ks)
    ref.store_index_k(want, slots, k8, ks)
    bad += _report("store_index_k bit-exact", None if torch.equal(idx_cache, want) else "bytes differ")
    got8, gots = kq.gather_index_k(idx_cache, slots.clamp(min=0))
    w8, ws = ref.gather_index_k(want, slots.clamp(min=0))
    ok = torch.equal(got8.view(torch.uint8), w8.view(torch.uint8)) and torch.equal(gots, ws)
    bad += _report("gather_index_k round trip", None if ok else "differs")
    rows = ref.quantize_mla(c, k_pe, layout="fp8_656")
    paged = torch.full((pages * page, 656), 0x7F, dtype=torch.uint8)  # e4m3 NaNs outside the written slots
    live = slots[slots >= 0]
    paged[live] = rows[slots >= 0]
    deq = kq.dequantize_mla(paged[live], layout="fp8_656")
    same = torch.equal(deq, ref.dequantize_mla(rows[slots >= 0], layout="fp8_656"))
    bad += _report("dequantize_mla gathered rows bit-exact", None if same else "differs")
    cache3 = paged.view(pages, page, 656).clone()
    cache3.view(-1, 656)[:] = ref.quantize_mla(
        torch.randn(pages * page, 512, generator=gen).bfloat16(), torch.randn(pages * page, 64, generator=gen).bfloat16(),
        layout="fp8_656")
    view = cache3[1, ::3]  # rows of one page with a row stride of 3 * 656 bytes
    same = torch.equal(kq.dequantize_mla(view, layout="fp8_656"), ref.dequantize_mla(view.contiguous(), layout="fp8_656"))
    bad += _report("dequantize_mla strided rows", None if same else "differs")
    return bad
