"""KV-quant cases: MLA row packing (both layouts, FP8 edge values), paged stores with ``-1`` slots into
poisoned caches, and the ``index_k_132`` pages. The ``fp8_656`` cache always holds power-of-two (ue8m0)
scales, whatever the checkpoint's ``scale_fmt`` (ids keep ``/ue8m0/`` so that they stay stable).

FP8 rows are judged by cross-dequantization: the backend's bytes go through the *reference* dequantizer and
must reproduce the unquantized input within one e4m3 ulp (``kv_quant.fp8_row``), and the reference's bytes
go through the *backend's* dequantizer and must match the reference's reading (``kv_quant.dequant``). A
scale at the wrong offset fails both ways. Slots a store must not write (other
slots, slot ``-1``, which would land on the last slot of the cache) are compared byte for byte with the poison.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import D_LATENT, D_QK, D_ROPE, FP8_MLA_ROW_BYTES, INDEX_HEAD_DIM, INDEX_K_ROW_BYTES
from dsa_runtime.testing import data
from dsa_runtime.testing.case import Case, CheckContext, Inputs
from dsa_runtime.testing.compare import as_bytes, close, equal, expect_tensor, same_bytes, unravel
from dsa_runtime.testing.fp8util import (
    describe_index_byte,
    edge_tiles,
    index_cache_write,
    pack_mla_656,
    quant_error,
    random_bytes,
    random_e4m3,
    scale_error,
)
from dsa_runtime.testing.tolerances import tolerance

FAMILY = "kv_quant"


def _rows(gen: torch.Generator, dev: torch.device, n: int, values: str) -> tuple[Tensor, Tensor]:
    """``c`` ``[n, 512]`` and ``k_pe`` ``[n, 64]`` bf16; ``random`` rows have magnitudes from 2**-6 to 2**6."""
    if values == "edge":
        c = edge_tiles(gen, n, D_LATENT, dev)
    else:
        c = data.randn(gen, (n, D_LATENT), dev) * torch.exp2(data.uniform(gen, (n, 1), dev, -6, 6))
    k_pe = data.randn(gen, (n, D_ROPE), dev)
    return c.to(torch.bfloat16), k_pe.to(torch.bfloat16)


def _judge_fp8_rows(ctx: CheckContext, name: str, rows: Tensor, c: Tensor, k_pe: Tensor) -> str | None:
    """Backend-written 656-byte rows, read by the reference dequantizer, vs the unquantized ``c``/``k_pe``."""
    deq = ctx.to_device(ctx.oracle.dequantize_mla(ctx.to_oracle(rows), layout="fp8_656")).float()
    scales = rows[:, D_LATENT : D_LATENT + 16].contiguous().view(torch.float32).reshape(-1, D_LATENT // 128)
    # The fp8_656 cache always holds power-of-two scales (FlashMLA's SM90 decode rounds them to bf16).
    return (
        quant_error(f"{name} c (read by the reference dequantizer)", deq[:, :D_LATENT], c.float(),
                    tolerance("kv_quant.fp8_row"), scales=scales)
        or scale_error(f"{name} scales (bytes 512-527)", scales, c.float(), ctx.case.needs.get("scale_fmt", "ue8m0"))
        or same_bytes(f"{name} k_pe (bytes 528-655)", deq[:, D_LATENT:].to(torch.bfloat16), k_pe)
    )


def _quantize_case(layout: str, scale_fmt: str, values: str, n: int, tier: str) -> Case:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        c, k_pe = _rows(gen, dev, n, values)
        return {"c": c, "k_pe": k_pe}

    def run(kern: object, a: Inputs) -> Tensor:
        return kern.quantize_mla(a["c"], a["k_pe"], layout=layout)  # type: ignore[attr-defined]

    def check(ctx: CheckContext) -> str | None:
        a, got = ctx.inputs, ctx.got
        if layout == "bf16":
            return expect_tensor("rows", got, (n, D_QK), torch.bfloat16) or same_bytes(
                "rows", got, torch.cat([a["c"], a["k_pe"]], dim=-1)
            )
        if msg := expect_tensor("rows", got, (n, FP8_MLA_ROW_BYTES), torch.uint8):
            return msg
        if msg := _judge_fp8_rows(ctx, "backend rows", got, a["c"], a["k_pe"]):
            return msg
        mine = ctx.kernel.dequantize_mla(ctx.want, layout=layout)
        theirs = ctx.to_device(ctx.oracle.dequantize_mla(ctx.to_oracle(ctx.want), layout=layout))
        return expect_tensor("dequantized rows", mine, (n, D_QK), torch.bfloat16) or close(
            "reference rows read by the backend dequantizer", mine, theirs, tolerance("kv_quant.dequant")
        )

    tag = f"{layout}/{scale_fmt}" if layout == "fp8_656" else layout
    return Case(
        f"kv_quant/quantize_mla/{tag}/n{n}/{values}", FAMILY, tier, {"kv_layout": layout}, build, run, check,  # type: ignore[arg-type]
        f"pack MLA rows ({layout}, {values} values)",
    )


def _dequantize_case(layout: str, scale_fmt: str, values: str, n: int, tier: str) -> Case:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        c, k_pe = _rows(gen, dev, n, values)
        rows = torch.cat([c, k_pe], -1) if layout == "bf16" else pack_mla_656(c, k_pe, scale_fmt)
        return {"rows": rows}

    def run(kern: object, a: Inputs) -> Tensor:
        return kern.dequantize_mla(a["rows"], layout=layout)  # type: ignore[attr-defined]

    def check(ctx: CheckContext) -> str | None:
        if msg := expect_tensor("dequantized rows", ctx.got, (n, D_QK), torch.bfloat16):
            return msg
        if layout == "bf16":
            return same_bytes("dequantized rows", ctx.got, ctx.inputs["rows"])
        return close("dequantized rows", ctx.got, ctx.want, tolerance("kv_quant.dequant"))

    tag = f"{layout}/{scale_fmt}" if layout == "fp8_656" else layout
    return Case(
        f"kv_quant/dequantize_mla/{tag}/n{n}/{values}", FAMILY, tier, {"kv_layout": layout},  # type: ignore[arg-type]
        build, run, check, f"unpack kit-packed MLA rows ({layout})",
    )


def _slots(gen: torch.Generator, dev: torch.device, n: int, n_slots: int) -> Tensor:
    """``n`` distinct slots below the last slot of the cache, ~20% of them ``-1``."""
    s = data.randperm(gen, n_slots - 1, dev)[:n]
    s = torch.where(torch.rand(n, generator=gen, device=dev) < 0.2, -1, s)
    s[0] = -1
    return s


def _untouched(name: str, got: Tensor, before: Tensor, written: Tensor, row_bytes: int) -> str | None:
    """Bytes of slots not in ``written`` are unchanged (``got``/``before`` viewed as ``[slots, row_bytes]``)."""
    g, b = as_bytes(got).reshape(-1, row_bytes), as_bytes(before).reshape(-1, row_bytes).to(got.device)
    keep = torch.ones(g.shape[0], dtype=torch.bool, device=g.device)
    keep[written] = False
    diff = (g != b) & keep[:, None]
    if not bool(diff.any()):
        return None
    slot, col = unravel(int(torch.nonzero(diff.reshape(-1))[0]), g.shape)
    last = " (the last slot: is -1 dereferenced?)" if slot == g.shape[0] - 1 else ""
    return f"{name}: {int(diff.any(dim=1).sum())} slots that must stay untouched were written; first slot {slot}{last}, byte {col}"


def _store_mla_case(layout: str, scale_fmt: str, page: int, n: int, tier: str) -> Case:
    width = FP8_MLA_ROW_BYTES if layout == "fp8_656" else D_QK

    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        pages = -(-(n + n // 2) // page) + 1
        c, k_pe = _rows(gen, dev, n, "random")
        if layout == "bf16":
            cache = torch.full((pages, page, width), float("nan"), dtype=torch.bfloat16, device=dev)
        else:
            cache = random_bytes(gen, (pages, page, width), dev)
        return {"cache": cache, "slots": _slots(gen, dev, n, pages * page), "c": c, "k_pe": k_pe}

    def run(kern: object, a: Inputs) -> Tensor:
        kern.store_mla(a["cache"], a["slots"], a["c"], a["k_pe"], layout=layout)  # type: ignore[attr-defined]
        return a["cache"]

    def check(ctx: CheckContext) -> str | None:
        a, got = ctx.inputs, ctx.got
        valid = a["slots"] >= 0
        written = a["slots"][valid].long()
        if msg := _untouched("cache", got, a["cache"], written, width * got.element_size()):
            return msg
        rows = got.reshape(-1, width)[written]
        c, k_pe = a["c"][valid], a["k_pe"][valid]
        if layout == "bf16":
            return same_bytes("written rows", rows, torch.cat([c, k_pe], dim=-1))
        return _judge_fp8_rows(ctx, "written rows", rows, c, k_pe)

    needs = {"kv_layout": layout, "page_size": page}
    tag = f"{layout}/{scale_fmt}" if layout == "fp8_656" else layout
    return Case(
        f"kv_quant/store_mla/{tag}/p{page}/n{n}", FAMILY, tier, needs, build, run, check,  # type: ignore[arg-type]
        "in-place store into a poisoned paged cache, -1 slots skipped",
    )


def _index_inputs(gen: torch.Generator, dev: torch.device, n: int, page: int) -> Inputs:
    pages = -(-(n + n // 2) // page) + 1
    k8 = random_e4m3(gen, (n, INDEX_HEAD_DIM), dev)
    k_scale = torch.exp2(data.uniform(gen, (n,), dev, -12, 2))
    cache = random_bytes(gen, (pages, page * INDEX_K_ROW_BYTES), dev)
    return {"cache": cache, "slots": _slots(gen, dev, n, pages * page), "k8": k8, "k_scale": k_scale}


def _store_index_case(page: int, n: int, tier: str) -> Case:
    def run(kern: object, a: Inputs) -> Tensor:
        kern.store_index_k(a["cache"], a["slots"], a["k8"], a["k_scale"])  # type: ignore[attr-defined]
        return a["cache"]

    def check(ctx: CheckContext) -> str | None:
        a, got = ctx.inputs, ctx.got
        want = index_cache_write(a["cache"], a["slots"], a["k8"], a["k_scale"])
        if msg := expect_tensor("index cache", got, tuple(want.shape), torch.uint8):
            return msg
        diff = got != want
        if not bool(diff.any()):
            return None
        pg, col = unravel(int(torch.nonzero(diff.reshape(-1))[0]), got.shape)
        slot = pg * page + (col // INDEX_HEAD_DIM if col < page * INDEX_HEAD_DIM else (col - page * INDEX_HEAD_DIM) // 4)
        state = "written" if slot in set(a["slots"].tolist()) else "must stay untouched"
        return (
            f"index cache: {int(diff.sum())} bytes differ from the index_k_132 layout; first on page {pg} at byte {col} "
            f"({describe_index_byte(col, page)}, slot {slot}, {state}): got {int(got[pg, col])}, want {int(want[pg, col])}"
        )

    return Case(
        f"kv_quant/store_index_k/p{page}/n{n}", FAMILY, tier, {"page_size": page},  # type: ignore[arg-type]
        lambda g, d: _index_inputs(g, d, n, page), run, check, "index_k_132 page layout, -1 skipped",
    )


def _gather_index_case(page: int, n: int, tier: str) -> Case:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        a = _index_inputs(gen, dev, n, page)
        n_slots = a["cache"].shape[0] * page
        a["slots"] = data.randperm(gen, n_slots, dev)[:n]  # valid slots only, the last one included
        a["cache"] = index_cache_write(a["cache"], a["slots"], a["k8"], a["k_scale"])
        return a

    def run(kern: object, a: Inputs) -> tuple[Tensor, Tensor]:
        return kern.gather_index_k(a["cache"], a["slots"])  # type: ignore[attr-defined]

    def check(ctx: CheckContext) -> str | None:
        a, got = ctx.inputs, ctx.got
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return f"expected (k8, k_scale), got {type(got).__name__}"
        return (
            expect_tensor("k8", got[0], (n, INDEX_HEAD_DIM), torch.float8_e4m3fn)
            or expect_tensor("k_scale", got[1], (n,), torch.float32)
            or equal("k8 bytes", as_bytes(got[0]), as_bytes(a["k8"]), what="bytes")
            or same_bytes("k_scale", got[1], a["k_scale"])
        )

    return Case(
        f"kv_quant/gather_index_k/p{page}/n{n}", FAMILY, tier, {"page_size": page},  # type: ignore[arg-type]
        build, run, check, "read index_k_132 slots back",
    )


def cases() -> list[Case]:
    out: list[Case] = []
    for tier, n in (("quick", 40), ("full", 16384)):
        out.append(_quantize_case("bf16", "ue8m0", "random", n, tier))
        out.append(_dequantize_case("bf16", "ue8m0", "random", n, tier))
        for values in ("random", "edge") if tier == "quick" else ("random",):
            out.append(_quantize_case("fp8_656", "ue8m0", values, n, tier))
            out.append(_dequantize_case("fp8_656", "ue8m0", values, n, tier))
    for layout, fmt in (("bf16", "ue8m0"), ("fp8_656", "ue8m0")):
        out += [_store_mla_case(layout, fmt, page, 30, "quick") for page in (64, 16, 1)]
        out.append(_store_mla_case(layout, fmt, 64, 262144, "full"))
    out += [_store_index_case(page, 30, "quick") for page in (64, 16)]
    out += [_gather_index_case(page, 30, "quick") for page in (64, 16)]
    out += [_store_index_case(64, 65536, "full"), _gather_index_case(64, 65536, "full")]
    return out
