"""The decode-path kernel calls of one engine step, on fixed-shape inputs, for CUDA-graph capture tests.

Every :class:`Step` builds inputs whose *shapes* depend only on :class:`Shape` and whose *values* (context
lengths, page tables, slots, ``-1`` entries, data) change with the seed, so a graph captured on one set of
inputs and replayed on another shows any kernel that sized or scheduled its work from the data at capture
time. Results are judged with the conformance kit's own checkers and tolerances.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from dsa_runtime.families import D_LATENT, D_QK, D_ROPE, FP8_MLA_ROW_BYTES, INDEX_HEAD_DIM, INDEX_K_ROW_BYTES
from dsa_runtime.testing import data
from dsa_runtime.testing.case import CheckContext, Inputs
from dsa_runtime.testing.cases_indexer import _check_logits
from dsa_runtime.testing.cases_kv_quant import _store_index_case, _store_mla_case
from dsa_runtime.testing.cases_sparse_attn import SM_SCALE, _check_attn
from dsa_runtime.testing.cases_topk import _fused_case
from dsa_runtime.testing.fp8util import index_cache_write, pack_mla_656, random_bytes, random_e4m3


@dataclass(frozen=True)
class Shape:
    """One decode step: ``batch`` requests of one query each, up to ``max_len`` tokens, page ``page``."""

    batch: int = 4
    max_len: int = 4096
    k: int = 2048
    heads: int = 128
    index_heads: int = 64
    page: int = 64

    @property
    def pages(self) -> int:
        return 1 + self.batch * (self.max_len // self.page)  # page 0 is never used


@dataclass(frozen=True)
class Step:
    name: str
    method: str  # "family.method"
    layout: str  # KV layout the step needs (bf16 when the method does not read the MLA cache)
    needs: dict[str, object]
    build: Callable[[torch.Generator, torch.device], Inputs]
    run: Callable[[Callable[..., object], Inputs], object]  # fn is the resolved bound method
    check: Callable[[CheckContext], str | None]
    case: object = None  # the kit case whose checker is used (some checkers read ``ctx.case.needs``)


def _request_state(gen: torch.Generator, dev: torch.device, s: Shape) -> Inputs:
    """Context lengths (the new token included), a random page table and the new token's slot per request."""
    lens = data.randint(gen, 1, s.max_len + 1, (s.batch,), dev)
    lens[0] = s.max_len if s.batch > 1 else lens[0]
    table = (data.randperm(gen, s.pages - 1, dev) + 1).reshape(s.batch, -1).to(torch.int32)
    last = lens.long() - 1
    slots = table.long().gather(1, (last // s.page)[:, None])[:, 0] * s.page + last % s.page
    slots = torch.cat([slots, torch.full((1,), -1, dtype=torch.int64, device=dev)])  # a padding slot
    return {"lens": lens.to(torch.int32), "table": table, "slots": slots}


def _store_mla(layout: str, s: Shape) -> Step:
    width = D_QK if layout == "bf16" else FP8_MLA_ROW_BYTES

    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        st = _request_state(gen, dev, s)
        n = st["slots"].numel()
        c = (data.randn(gen, (n, D_LATENT), dev) * torch.exp2(data.uniform(gen, (n, 1), dev, -4, 4))).bfloat16()
        if layout == "bf16":
            cache = data.randn(gen, (s.pages, s.page, width), dev).bfloat16()
        else:
            cache = random_bytes(gen, (s.pages, s.page, width), dev)
        return {"cache": cache, "slots": st["slots"], "c": c, "k_pe": data.randn(gen, (n, D_ROPE), dev).bfloat16()}

    def run(fn, a: Inputs) -> Tensor:
        fn(a["cache"], a["slots"], a["c"], a["k_pe"], layout=layout)
        return a["cache"]

    case = _store_mla_case(layout, "ue8m0", s.page, 1, "quick")
    return Step(f"store_mla_{layout}", "kv_quant.store_mla", layout, {"page_size": s.page}, build, run, case.check,
                case)


def _store_index_k(s: Shape) -> Step:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        st = _request_state(gen, dev, s)
        n = st["slots"].numel()
        return {
            "cache": random_bytes(gen, (s.pages, s.page * INDEX_K_ROW_BYTES), dev), "slots": st["slots"],
            "k8": random_e4m3(gen, (n, INDEX_HEAD_DIM), dev), "k_scale": torch.exp2(data.uniform(gen, (n,), dev, -12, 2)),
        }

    def run(fn, a: Inputs) -> Tensor:
        fn(a["cache"], a["slots"], a["k8"], a["k_scale"])
        return a["cache"]

    case = _store_index_case(s.page, 1, "quick")
    return Step("store_index_k", "kv_quant.store_index_k", "bf16", {"page_size": s.page}, build, run, case.check,
                case)


def _logits_paged(s: Shape) -> Step:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        st = _request_state(gen, dev, s)
        all_slots = torch.arange(s.pages * s.page, device=dev)
        k8 = random_e4m3(gen, (all_slots.numel(), INDEX_HEAD_DIM), dev)
        scale = torch.exp2(data.uniform(gen, (all_slots.numel(),), dev, -8, 0))
        cache = index_cache_write(random_bytes(gen, (s.pages, s.page * INDEX_K_ROW_BYTES), dev), all_slots, k8, scale)
        q8 = random_e4m3(gen, (s.batch, 1, s.index_heads, INDEX_HEAD_DIM), dev)
        w = data.randn(gen, (s.batch, s.index_heads), dev) * s.index_heads**-0.5 * 2e-3 * INDEX_HEAD_DIM**-0.5
        return {"q8": q8, "w": w, "cache": cache, "lens": st["lens"], "table": st["table"]}

    def run(fn, a: Inputs) -> Tensor:
        return fn(a["q8"], a["w"], a["cache"], a["lens"], a["table"], s.max_len)  # type: ignore[return-value]

    needs = {"decode_queries": 1, "index_heads": s.index_heads, "page_size": s.page}
    return Step("logits_paged", "indexer.logits_paged", "bf16", needs, build, run,
                lambda ctx: _check_logits(ctx, (s.batch, s.max_len)))


def _topk_transform(s: Shape) -> Step:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        st = _request_state(gen, dev, s)
        table = st["table"]
        inverse = torch.full((s.batch, s.pages * s.page), -1, dtype=torch.int64, device=dev)
        pos = torch.arange(s.max_len, device=dev)
        for b in range(s.batch):
            inverse[b, table[b].long()[pos // s.page] * s.page + pos % s.page] = pos
        logits = data.randn(gen, (s.batch, s.max_len), dev)
        starts = torch.zeros(s.batch, dtype=torch.int32, device=dev)
        return {"logits": logits, "starts": starts, "ends": st["lens"], "table": table, "inverse": inverse,
                "row_to_batch": torch.arange(s.batch, dtype=torch.int32, device=dev)}

    def run(fn, a: Inputs) -> Tensor:
        return fn(a["logits"], a["starts"], a["ends"], s.k, a["table"], a["row_to_batch"], s.page)  # type: ignore[return-value]

    case = _fused_case(s.batch, s.max_len, s.k, s.page, "randn", "quick")
    return Step("topk_transform", "topk.topk_transform", "bf16", {"k": s.k, "page_size": s.page}, build, run,
                case.check, case)


def _decode(layout: str, s: Shape) -> Step:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        st = _request_state(gen, dev, s)
        keys = torch.rand(s.batch, s.max_len, generator=gen, device=dev)
        keys = torch.where(torch.arange(s.max_len, device=dev)[None, :] < st["lens"][:, None], keys, 2.0)
        sel = keys.argsort(dim=1)[:, : s.k]
        pos = torch.where(keys.gather(1, sel) < 1.0, sel, -1)  # -1 past each request's length
        safe = pos.clamp(min=0)
        slots = st["table"].long().gather(1, safe // s.page) * s.page + safe % s.page
        slots = torch.where(pos >= 0, slots, -1)
        rows = s.pages * s.page
        c, k_pe = data.randn(gen, (rows, D_LATENT), dev).bfloat16(), data.randn(gen, (rows, D_ROPE), dev).bfloat16()
        cache = torch.cat([c, k_pe], -1) if layout == "bf16" else pack_mla_656(c, k_pe, "ue8m0")
        q = data.randn(gen, (s.batch, 1, s.heads, D_QK), dev).bfloat16()
        return {"q": q, "cache": cache.reshape(s.pages, s.page, -1), "indices": slots.to(torch.int32)[:, None, :]}

    def run(fn, a: Inputs) -> object:
        return fn(a["q"], a["cache"], a["indices"], SM_SCALE, layout=layout)

    needs = {"heads": s.heads, "k": s.k, "page_size": s.page, "decode_queries": 1}
    return Step(f"decode_{layout}", "sparse_attn.decode", layout, needs, build, run,
                lambda ctx: _check_attn(ctx, (s.batch, 1, s.heads, 512)))


def steps(s: Shape) -> list[Step]:
    """The decode-path calls in engine order: store the new rows, index, select, attend."""
    return [_store_mla("bf16", s), _store_mla("fp8_656", s), _store_index_k(s), _logits_paged(s), _topk_transform(s),
            _decode("bf16", s), _decode("fp8_656", s)]
