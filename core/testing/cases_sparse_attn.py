"""Sparse MLA attention cases: ragged prefill over a flat bf16 buffer and paged decode over both layouts.

Inputs are unit-scale random rows; ``sm_scale`` is V3.2's 0.135234. Only the selected cache slots hold data:
every other slot is poison (NaN for bf16, bytes with e4m3 NaNs for ``fp8_656``), among them always slot 0 (a
common stand-in for invalid indices: ``0 * NaN`` is NaN, so masking after the gather is not enough) and the
last slot (where a dereferenced ``-1`` lands), so reading anything outside the selection shows up as NaN.
In prefill, the row a dereferenced ``-1`` would read (the last one) is never selected and holds large values.
Indices are ``-1`` or a valid row/slot: anything else is a caller error, which the kit never sends.
Outputs are compared with the fp32-accumulated reference (``sparse_attn.out`` / ``sparse_attn.lse``); a
query with no valid index must give exact zeros and ``lse = +inf``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import D_LATENT, D_QK, D_ROPE, D_V, FP8_MLA_ROW_BYTES
from dsa_runtime.testing import data
from dsa_runtime.testing.case import Case, CheckContext, Inputs
from dsa_runtime.testing.compare import expect_tensor, out_and_lse
from dsa_runtime.testing.fp8util import pack_mla_656, random_bytes
from dsa_runtime.testing.tolerances import tolerance

FAMILY = "sparse_attn"
SM_SCALE = 0.135234


def _choose(gen: torch.Generator, dev: torch.device, limits: Tensor, width: int, k: int, pad: float) -> Tensor:
    """Per row, ``min(k, limit)`` distinct positions in ``[0, limit)`` then ``-1``; ``pad`` drops more."""
    keys = torch.rand(limits.numel(), max(width, 1), generator=gen, device=dev)
    cols = torch.arange(max(width, 1), device=dev)
    keys = torch.where(cols[None, :] < limits[:, None], keys, 2.0)
    take = min(k, max(width, 1))
    sel = keys.argsort(dim=1)[:, :take]
    ok = torch.gather(keys, 1, sel) < 1.0
    if pad:
        ok &= torch.rand(sel.shape, generator=gen, device=dev) >= pad
    out = torch.full((limits.numel(), k), -1, dtype=torch.int64, device=dev)
    out[:, :take] = torch.where(ok, sel, -1)
    return out


def _check_attn(ctx: CheckContext, out_shape: tuple[int, ...]) -> str | None:
    got = ctx.got
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"expected (out, lse), got {type(got).__name__}"
    out, lse = got
    want_out, want_lse = ctx.want
    if msg := expect_tensor("out", out, out_shape, torch.bfloat16) or expect_tensor(
        "lse", lse, out_shape[:-1], torch.float32
    ):
        return msg
    empty = torch.isposinf(want_lse)
    if bool(empty.any()):
        stray = empty[..., None] & (out != 0)
        if bool(stray.any()):
            at = tuple(int(v) for v in torch.nonzero(stray)[0])
            return f"out: query/head {at[:-1]} has no valid index but out is not zero ({float(out[at]):.4g})"
    return out_and_lse(out, lse, want_out, want_lse, tolerance("sparse_attn.out"), tolerance("sparse_attn.lse"))


def _prefill_case(heads: int, tokens: int, n_kv: int, k: int, variant: str, tier: str) -> Case:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        q = data.randn(gen, (tokens, heads, D_QK), dev).to(torch.bfloat16)
        kv = data.randn(gen, (n_kv, D_QK), dev)
        kv[-1] = 40.0  # the row a dereferenced -1 reads: never selected, and loud
        limits = torch.full((tokens,), n_kv - 1, device=dev)
        idx = _choose(gen, dev, limits, n_kv - 1, k, 0.2 if variant == "pad" else 0.0)
        if variant == "empty":
            idx[0] = -1
            idx[-1, 1:] = -1
        return {"q": q, "kv": kv.to(torch.bfloat16), "indices": idx.to(torch.int32)}

    def run(kern: object, a: Inputs) -> tuple[Tensor, Tensor]:
        return kern.prefill(a["q"], a["kv"], a["indices"], SM_SCALE)  # type: ignore[attr-defined]

    return Case(
        f"sparse_attn/prefill/h{heads}/k{k}/t{tokens}/s{n_kv}/{variant}", FAMILY, tier,
        {"kv_layout": "bf16", "heads": heads, "k": k},  # type: ignore[arg-type]
        build, run, lambda ctx: _check_attn(ctx, (tokens, heads, D_V)),
        f"ragged prefill, {heads} heads, top-{k}, {variant}",
    )


def _decode_case(
    layout: str, heads: int, n_q: int, page: int, k: int, batch: int, max_len: int, variant: str, tier: str
) -> Case:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        lo = n_q if variant != "short" else max(n_q, k // 4)
        hi = max_len if variant != "short" else min(max_len, k - 1)
        lens = data.randint(gen, lo, hi + 1, (batch,), dev).tolist()
        lens[0] = hi  # the longest request: its last page is partial unless hi % page == 0
        table, n_pages = data.page_tables(gen, lens, page, dev)
        lim = torch.tensor(lens, device=dev).repeat_interleave(n_q)
        lim = lim - n_q + 1 + torch.arange(n_q, device=dev).repeat(batch)  # causal limit of each MTP query
        pos = _choose(gen, dev, lim, max(lens), k, 0.15 if variant == "partial_pages" else 0.0)
        if variant == "empty_query":
            pos[0] = -1
        owner = torch.arange(batch, device=dev).repeat_interleave(n_q)[:, None].expand_as(pos)
        safe = pos.clamp(min=0)
        slots = table.long()[owner, safe // page] * page + safe % page
        slots = torch.where(pos >= 0, slots, -1)
        used = torch.unique(slots[slots >= 0])
        c = data.randn(gen, (used.numel(), D_LATENT), dev).to(torch.bfloat16)
        k_pe = data.randn(gen, (used.numel(), D_ROPE), dev).to(torch.bfloat16)
        if layout == "bf16":
            cache = torch.full((n_pages * page, D_QK), float("nan"), dtype=torch.bfloat16, device=dev)
            cache[used] = torch.cat([c, k_pe], dim=-1)
        else:
            cache = random_bytes(gen, (n_pages * page, FP8_MLA_ROW_BYTES), dev)
            cache[:, 0:D_LATENT:61] = 0x7F  # an e4m3 NaN in every 128-block of c
            cache[used] = pack_mla_656(c, k_pe, "ue8m0")  # the fp8_656 cache always holds power-of-two scales
        q = data.randn(gen, (batch, n_q, heads, D_QK), dev).to(torch.bfloat16)
        return {"q": q, "cache": cache.reshape(n_pages, page, -1), "indices": slots.to(torch.int32).reshape(batch, n_q, k)}

    def run(kern: object, a: Inputs) -> tuple[Tensor, Tensor]:
        return kern.decode(a["q"], a["cache"], a["indices"], SM_SCALE, layout=layout)  # type: ignore[attr-defined]

    needs = {"kv_layout": layout, "heads": heads, "k": k, "page_size": page, "decode_queries": n_q}
    return Case(
        f"sparse_attn/decode/{layout}/h{heads}/k{k}/q{n_q}/p{page}/{variant}", FAMILY, tier, needs,  # type: ignore[arg-type]
        build, run, lambda ctx: _check_attn(ctx, (batch, n_q, heads, D_V)),
        f"paged decode, {layout} cache, {heads} heads, {n_q} queries/request, page {page}, {variant}",
    )


def cases() -> list[Case]:
    out = [
        _prefill_case(*spec, "quick")
        for spec in [
            (1, 6, 96, 32, "pad"),
            (16, 6, 96, 32, "pad"),
            (20, 5, 80, 64, "pad"),
            (64, 4, 96, 64, "empty"),
            (96, 3, 64, 16, "pad"),
            (128, 4, 160, 64, "pad"),
            (128, 3, 40, 64, "short"),
            # per-rank head counts under tensor parallelism: tiny presets on tp 2, 128 heads on tp 4
            (2, 5, 64, 32, "pad"),
            (32, 4, 96, 64, "pad"),
            # FlashMLA's prefill shapes: 64 / 128 heads, k a multiple of 128
            (64, 4, 300, 128, "pad"),
            (128, 3, 200, 128, "empty"),
        ]
    ]
    out += [
        _prefill_case(*spec, "full")
        for spec in [
            (128, 512, 8192, 2048, "pad"),
            (128, 1024, 131072, 2048, "pad"),
            (64, 256, 8192, 2048, "empty"),
            (20, 256, 8192, 2048, "pad"),
            (16, 128, 1500, 2048, "short"),
        ]
    ]
    for layout in ("bf16", "fp8_656"):
        out += [
            _decode_case(layout, *spec, "quick")
            for spec in [
                (16, 1, 64, 64, 3, 200, "partial_pages"),
                (20, 2, 64, 64, 3, 200, "partial_pages"),
                (128, 2, 64, 32, 2, 150, "short"),
                (1, 1, 16, 16, 3, 100, "empty_query"),
                (96, 1, 1, 16, 2, 40, "partial_pages"),
                (64, 2, 16, 64, 2, 120, "partial_pages"),
                (2, 1, 16, 32, 2, 80, "partial_pages"),  # per-rank heads under TP (tiny on tp 2, 128 on tp 4)
                (32, 1, 64, 64, 2, 150, "partial_pages"),
                # MTP verify with 3 draft tokens: 4 queries per request, also at 8 heads (TP 16)
                (16, 4, 64, 64, 3, 200, "partial_pages"),
                (8, 4, 64, 64, 3, 200, "partial_pages"),
                (128, 4, 64, 64, 2, 150, "short"),
            ]
        ]
        out += [
            _decode_case(layout, *spec, "full")
            for spec in [
                (128, 2, 64, 2048, 64, 65536, "partial_pages"),
                (64, 1, 64, 2048, 64, 16384, "partial_pages"),
                (128, 1, 64, 2048, 16, 3000, "short"),
                (20, 2, 64, 2048, 8, 8192, "empty_query"),
                # V3.2 per rank under TP 16 / 8 / 4 at its k, with MTP verify queries
                (8, 2, 64, 2048, 16, 16384, "partial_pages"),
                (16, 4, 64, 2048, 16, 32768, "partial_pages"),
                (32, 1, 64, 2048, 32, 32768, "partial_pages"),
                (32, 4, 64, 2048, 4, 8192, "empty_query"),
            ]
        ]
    # FlashMLA's FP8 decode shapes: 64 / 128 heads, k a multiple of 64, page 64
    out += [
        _decode_case("fp8_656", 128, 2, 64, 128, 2, 200, "short", "quick"),
    ]
    return out
