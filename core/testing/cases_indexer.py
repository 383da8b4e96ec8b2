"""Lightning-indexer cases: Hadamard + FP8 quantization of q and k, ragged prefill logits, paged decode logits.

Quantization is judged against the exact rotation computed by the kit (float64 Sylvester matrix): q8 is
dequantized with the q scale *recovered from the returned weights* (``w / (head_weights * H**-0.5 *
128**-0.5)``), so a wrong rotation, a wrong scale or a wrong weight fold all fail. A ``ue8m0`` scale must be
exactly ``2^ceil(log2(amax/448))`` (either neighbour within ``indexer.scale_amax`` of a boundary, since the
kernel's rotation rounds), a ``float`` one anywhere from ``amax/448`` to that power; values within half an
e4m3 ulp at that scale (``indexer.quant_q``). Logits get FP8 inputs drawn by the kit and are compared with the reference
relative to the row's scale; the ``-inf`` pattern (windows, causal limit of each MTP query) must match
exactly. Cache slots no request owns are poison holding e4m3 NaNs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import INDEX_HEAD_DIM, INDEX_K_ROW_BYTES
from dsa_runtime.testing import data
from dsa_runtime.testing.case import Case, CheckContext, Inputs
from dsa_runtime.testing.compare import close, expect_tensor
from dsa_runtime.testing.fp8util import (
    edge_tiles,
    hadamard_rotate,
    index_cache_write,
    quant_error,
    random_bytes,
    random_e4m3,
    scale_error,
)
from dsa_runtime.testing.tolerances import tolerance

FAMILY = "indexer"
E4M3 = torch.float8_e4m3fn
D = INDEX_HEAD_DIM


def _vectors(gen: torch.Generator, dev: torch.device, rows: int, values: str, dtype: torch.dtype) -> Tensor:
    """``[rows, 128]`` pre-rotation vectors; ``edge`` ones rotate *into* FP8 scale edge patterns."""
    if values == "edge":  # H is its own inverse, so rotating H y gives back y (the edge pattern)
        return hadamard_rotate(edge_tiles(gen, rows, D, dev)).to(dtype)
    x = data.randn(gen, (rows, D), dev) * torch.exp2(data.uniform(gen, (rows, 1), dev, -4, 4))
    return x.to(dtype)


def _quant_q_case(heads: int, tokens: int, scale_fmt: str, values: str, dtype: str, tier: str) -> Case:
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32

    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        q = _vectors(gen, dev, tokens * heads, values, tdtype).reshape(tokens, heads, D)
        sign = torch.where(torch.rand(tokens, heads, generator=gen, device=dev) < 0.5, -1.0, 1.0)
        return {"q": q, "hw": sign * data.uniform(gen, (tokens, heads), dev, 0.5, 1.5)}

    def run(kern: object, a: Inputs) -> tuple[Tensor, Tensor]:
        return kern.quantize_q(a["q"], a["hw"], scale_fmt=scale_fmt)  # type: ignore[attr-defined]

    def check(ctx: CheckContext) -> str | None:
        a, got = ctx.inputs, ctx.got
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return f"expected (q8, weights), got {type(got).__name__}"
        q8, w = got
        if msg := expect_tensor("q8", q8, (tokens, heads, D), E4M3) or expect_tensor(
            "weights", w, (tokens, heads), torch.float32
        ):
            return msg
        q_scale = (w / (a["hw"] * heads**-0.5 * D**-0.5))[..., None]
        exact = hadamard_rotate(a["q"])
        return scale_error(
            "q_scale recovered from weights", q_scale, exact, scale_fmt,
            amax_rtol=tolerance("indexer.scale_amax").rtol, rtol=1e-5,
        ) or quant_error(
            "q8 * q_scale recovered from weights, vs Hadamard(q)", q8.float() * q_scale, exact,
            tolerance("indexer.quant_q"), scales=q_scale,
        )

    return Case(
        f"indexer/quantize_q/h{heads}/t{tokens}/{scale_fmt}/{dtype}/{values}", FAMILY, tier,
        {"index_heads": heads, "scale_fmt": scale_fmt}, build, run, check,  # type: ignore[arg-type]
        "Hadamard rotation, per-(token, head) FP8 and the head-weight fold",
    )


def _quant_k_case(n: int, scale_fmt: str, values: str, dtype: str, tier: str) -> Case:
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32

    def run(kern: object, a: Inputs) -> tuple[Tensor, Tensor]:
        return kern.quantize_k(a["k"], scale_fmt=scale_fmt)  # type: ignore[attr-defined]

    def check(ctx: CheckContext) -> str | None:
        got = ctx.got
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return f"expected (k8, k_scale), got {type(got).__name__}"
        k8, k_scale = got
        if msg := expect_tensor("k8", k8, (n, D), E4M3) or expect_tensor("k_scale", k_scale, (n,), torch.float32):
            return msg
        exact = hadamard_rotate(ctx.inputs["k"])
        return scale_error(
            "k_scale", k_scale[:, None], exact, scale_fmt, amax_rtol=tolerance("indexer.scale_amax").rtol
        ) or quant_error(
            "k8 * k_scale vs Hadamard(k)", k8.float() * k_scale[:, None], exact, tolerance("indexer.quant_k"),
            scales=k_scale[:, None],
        )

    return Case(
        f"indexer/quantize_k/n{n}/{scale_fmt}/{dtype}/{values}", FAMILY, tier, {"scale_fmt": scale_fmt},  # type: ignore[arg-type]
        lambda g, d: {"k": _vectors(g, d, n, values, tdtype)}, run, check, "Hadamard rotation and per-token FP8 of k",
    )


def _fp8_queries(gen: torch.Generator, dev: torch.device, shape: tuple[int, ...], heads: int) -> tuple[Tensor, Tensor]:
    """Random e4m3 queries and weights of realistic size (``head_weight * H**-0.5 * q_scale * 128**-0.5``)."""
    q8 = random_e4m3(gen, (*shape, heads, D), dev)
    w = data.randn(gen, (*shape, heads), dev) * heads**-0.5 * 2e-3 * D**-0.5
    return q8, w.reshape(-1, heads)


def _check_logits(ctx: CheckContext, shape: tuple[int, int]) -> str | None:
    return expect_tensor("logits", ctx.got, shape, torch.float32) or close(
        "logits", ctx.got, ctx.want, tolerance("indexer.logits"), row_dims=1
    )


def _ragged_case(heads: int, n_req: int, max_len: int, windows: str, tier: str) -> Case:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        if windows == "chunked":  # the last max_len queries of one long context of 16 * max_len keys
            s_total = 16 * max_len
            ke = torch.arange(s_total - max_len + 1, s_total + 1, device=dev)
            ks = torch.zeros_like(ke)
        else:
            ks, ke, _, lens = data.ragged_causal(gen, n_req, max_len, dev)
            s_total = sum(lens)
            if windows == "empty":  # some rows see nothing, one row sees every key
                drop = torch.rand(ks.shape, generator=gen, device=dev) < 0.3
                ke = torch.where(drop, ks, ke)
                ks[-1], ke[-1] = 0, s_total
        q8, w = _fp8_queries(gen, dev, (int(ks.numel()),), heads)
        k8 = random_e4m3(gen, (s_total, D), dev)
        k_scale = torch.exp2(data.uniform(gen, (s_total,), dev, -10, -4))
        return {"q8": q8, "w": w, "k8": k8, "k_scale": k_scale, "ks": ks.to(torch.int32), "ke": ke.to(torch.int32)}

    def run(kern: object, a: Inputs) -> Tensor:
        return kern.logits_ragged(a["q8"], a["w"], a["k8"], a["k_scale"], a["ks"], a["ke"])  # type: ignore[attr-defined]

    return Case(
        f"indexer/logits_ragged/h{heads}/b{n_req}x{max_len}/{windows}", FAMILY, tier, {"index_heads": heads},  # type: ignore[arg-type]
        build, run, lambda ctx: _check_logits(ctx, (ctx.inputs["q8"].shape[0], ctx.inputs["k8"].shape[0])),
        f"prefill logits with per-row key windows ({windows})",
    )


def _paged_case(heads: int, n_q: int, page: int, batch: int, max_len: int, tier: str) -> Case:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        lens = data.randint(gen, n_q, max_len + 1, (batch,), dev).tolist()
        lens[0] = max_len
        if batch > 2:
            lens[1], lens[2] = n_q, max(n_q, (max_len // page) * page)  # shortest, and a whole number of pages
        table, n_pages = data.page_tables(gen, lens, page, dev)
        cache = random_bytes(gen, (n_pages, page * INDEX_K_ROW_BYTES), dev)
        cache[:, ::37] = 0x7F  # e4m3 NaNs in every token's key bytes of unowned slots
        slots = torch.cat([data.slots_of(table, b, torch.arange(n, device=dev), page) for b, n in enumerate(lens)])
        k8 = random_e4m3(gen, (slots.numel(), D), dev)
        k_scale = torch.exp2(data.uniform(gen, (slots.numel(),), dev, -10, -4))
        q8, w = _fp8_queries(gen, dev, (batch, n_q), heads)
        return {
            "q8": q8, "w": w, "cache": index_cache_write(cache, slots, k8, k_scale),
            "lens": torch.tensor(lens, dtype=torch.int32, device=dev), "table": table, "max_len": max_len + 3,
        }

    def run(kern: object, a: Inputs) -> Tensor:
        return kern.logits_paged(a["q8"], a["w"], a["cache"], a["lens"], a["table"], a["max_len"])  # type: ignore[attr-defined]

    return Case(
        f"indexer/logits_paged/h{heads}/q{n_q}/p{page}/b{batch}/l{max_len}", FAMILY, tier,
        {"index_heads": heads, "page_size": page, "decode_queries": n_q}, build, run,  # type: ignore[arg-type]
        lambda ctx: _check_logits(ctx, (batch * n_q, max_len + 3)),
        f"decode logits over index_k_132 pages, {n_q} queries per request (causal limit per query)",
    )


def cases() -> list[Case]:
    out: list[Case] = []
    for fmt in ("ue8m0", "float"):
        out += [_quant_q_case(h, 5, fmt, "random", "bf16", "quick") for h in (1, 16, 64)]
        out += [_quant_q_case(8, 4, fmt, "edge", "fp32", "quick"), _quant_q_case(64, 3, fmt, "random", "fp32", "quick")]
        out += [_quant_k_case(37, fmt, v, dt, "quick") for v, dt in (("random", "bf16"), ("random", "fp32"), ("edge", "fp32"))]
        out += [_quant_q_case(64, 4096, fmt, "random", "bf16", "full"), _quant_k_case(65536, fmt, "random", "bf16", "full")]
    out += [
        _ragged_case(*spec, "quick")
        for spec in [(1, 3, 12, "ragged"), (16, 3, 12, "ragged"), (64, 3, 10, "empty"), (64, 1, 8, "chunked")]
    ]
    out += [_ragged_case(64, 4, 2048, "ragged", "full"), _ragged_case(64, 1, 1024, "chunked", "full"),
            _ragged_case(32, 4, 1024, "empty", "full")]
    out += [
        _paged_case(*spec, "quick")
        for spec in [(16, 1, 64, 3, 150), (64, 2, 64, 3, 150), (64, 2, 16, 4, 70), (32, 1, 16, 3, 40), (1, 2, 1, 3, 9),
                     (64, 4, 64, 3, 150), (16, 4, 16, 3, 70)]  # 4 queries: an MTP verify of 3 drafts
    ]
    out += [_paged_case(64, 2, 64, 32, 32768, "full"), _paged_case(64, 1, 64, 128, 8192, "full"),
            _paged_case(32, 2, 64, 16, 4096, "full"), _paged_case(64, 4, 64, 16, 8192, "full")]
    return out
