"""MoE cases: grouped ``noaux_tc`` routing and SwiGLU experts (bf16 and FP8 block-scaled weights).

Routing is judged per token as a set: the chosen expert ids must equal the reference's (ties: lower index
wins, per the contract) and each id's weight must match the reference's weight for that id
(``moe.route_weights``); order inside a row is free. Expert outputs are judged by per-token relative L2 error
(``moe.out_bf16`` / ``moe.out_fp8``; the FP8 bound leaves room for per-128 FP8 activation quantization).
Expert weights use partial 128-blocks in the small cases and random, partly power-of-two block scales.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dsa_runtime.families import QUANT_BLOCK, ExpertWeights
from dsa_runtime.testing import data
from dsa_runtime.testing.case import Case, CheckContext, Inputs
from dsa_runtime.testing.compare import close, expect_tensor, rel_l2
from dsa_runtime.testing.fp8util import random_e4m3
from dsa_runtime.testing.tolerances import tolerance

FAMILY = "moe"


def _route_case(
    tokens: int, n_exp: int, n_group: int, topk_group: int, top_k: int, renorm: bool, scale: float, values: str,
    tier: str,
) -> Case:
    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        logits = data.randn(gen, (tokens, n_exp), dev) * 2.0
        bias = data.uniform(gen, (n_exp,), dev, -0.3, 0.3)
        if values == "ties":  # experts in runs of 3 with equal logits and bias: top-k splits runs
            logits = logits[:, ::3].repeat_interleave(3, dim=1)[:, :n_exp]
            bias = bias[::3].repeat_interleave(3)[:n_exp]
        return {"logits": logits.contiguous(), "bias": bias.contiguous()}

    def run(kern: object, a: Inputs) -> tuple[Tensor, Tensor]:
        return kern.route(  # type: ignore[attr-defined]
            a["logits"], a["bias"], top_k=top_k, n_group=n_group, topk_group=topk_group,
            routed_scaling_factor=scale, renormalize=renorm,
        )

    def check(ctx: CheckContext) -> str | None:
        got = ctx.got
        if not isinstance(got, (tuple, list)) or len(got) != 2:
            return f"expected (weights, ids), got {type(got).__name__}"
        w, ids = got
        if msg := expect_tensor("weights", w, (tokens, top_k), torch.float32) or expect_tensor(
            "ids", ids, (tokens, top_k), torch.int32
        ):
            return msg
        want_w, want_ids = ctx.want
        g_ids, g_perm = ids.long().sort(dim=1)
        r_ids, r_perm = want_ids.long().sort(dim=1)
        diff = (g_ids != r_ids).any(dim=1)
        if bool(diff.any()):
            t = int(torch.nonzero(diff)[0])
            return (
                f"ids: {int(diff.sum())} of {tokens} tokens chose other experts; first token {t}: "
                f"got {g_ids[t].tolist()}, want {r_ids[t].tolist()}"
            )
        return close(
            "weights (matched by expert id)", w.gather(1, g_perm), want_w.gather(1, r_perm),
            tolerance("moe.route_weights"),
        )

    flags = f"{'renorm' if renorm else 'norenorm'}/s{scale:g}"
    return Case(
        f"moe/route/e{n_exp}/g{n_group}x{topk_group}/k{top_k}/t{tokens}/{flags}/{values}", FAMILY, tier, {},
        build, run, check,  # type: ignore[arg-type]
        f"grouped routing over {n_exp} experts ({values} scores)",
    )


def _weights(gen: torch.Generator, dev: torch.device, n: int, rows: int, cols: int, fp8: bool) -> tuple[Tensor, Tensor | None]:
    """``[n, rows, cols]`` weights of std ``cols**-0.5`` (bf16), or e4m3 with ``[n, ceil/128, ceil/128]`` scales."""
    if not fp8:
        return (data.randn(gen, (n, rows, cols), dev) * cols**-0.5).to(torch.bfloat16), None
    w8 = random_e4m3(gen, (n, rows, cols), dev, spread=96.0)
    nb = (n, -(-rows // QUANT_BLOCK), -(-cols // QUANT_BLOCK))
    jitter = data.uniform(gen, nb, dev, -1.5, 1.5)
    jitter = torch.where(torch.rand(nb, generator=gen, device=dev) < 0.5, jitter.round(), jitter)  # half powers of 2
    return w8, torch.exp2(jitter) * (cols**-0.5 / 96.0)


def _experts(gen: torch.Generator, dev: torch.device, n: int, dim: int, inter: int, fp8: bool) -> ExpertWeights:
    w13, s13 = _weights(gen, dev, n, 2 * inter, dim, fp8)
    w2, s2 = _weights(gen, dev, n, dim, inter, fp8)
    return ExpertWeights(w13=w13, w2=w2, w13_scale=s13, w2_scale=s2)


def _experts_case(
    tokens: int, n_exp: int, top_k: int, dim: int, inter: int, dtype: str, shared: bool, ids: str, tier: str,
    out: str = "bf16",
) -> Case:
    """``out`` ``fp32``: the unrounded fp32 sum a tensor-parallel rank asks for (``out_dtype=torch.float32``)."""
    fp8 = dtype == "fp8"
    out_dtype = torch.float32 if out == "fp32" else torch.bfloat16

    def build(gen: torch.Generator, dev: torch.device) -> Inputs:
        x = data.randn(gen, (tokens, dim), dev).to(torch.bfloat16)
        chosen = torch.rand(tokens, n_exp, generator=gen, device=dev).argsort(dim=1)[:, :top_k]
        drop = torch.rand(tokens, top_k, generator=gen, device=dev) < 0.15
        if ids == "all_neg":
            drop[0] = True
        chosen = torch.where(drop, -1, chosen)
        weights = data.uniform(gen, (tokens, top_k), dev, 0.3, 1.0)
        return {
            "x": x, "w": weights, "ids": chosen.to(torch.int32), "experts": _experts(gen, dev, n_exp, dim, inter, fp8),
            "shared": _experts(gen, dev, 1, dim, inter, fp8) if shared else None,
        }

    def run(kern: object, a: Inputs) -> Tensor:
        if out == "fp32":
            return kern.experts(a["x"], a["w"], a["ids"], a["experts"], a["shared"],  # type: ignore[attr-defined]
                                out_dtype=torch.float32)
        return kern.experts(a["x"], a["w"], a["ids"], a["experts"], a["shared"])  # type: ignore[attr-defined]

    def check(ctx: CheckContext) -> str | None:
        return expect_tensor("out", ctx.got, (tokens, dim), out_dtype) or rel_l2(
            "out", ctx.got, ctx.want, tolerance("moe.out_fp8" if fp8 else "moe.out_bf16")
        )

    return Case(
        f"moe/experts/{dtype}/e{n_exp}/k{top_k}/d{dim}/i{inter}/t{tokens}/{'shared' if shared else 'noshared'}/{ids}"
        + ("/out_fp32" if out == "fp32" else ""),
        FAMILY, tier, {"weight_dtype": "fp8_e4m3" if fp8 else "bf16"}, build, run, check,  # type: ignore[arg-type]
        f"SwiGLU experts, {dtype} weights, ids -1 skipped, shared expert {'on' if shared else 'off'}, {out} out",
    )


def cases() -> list[Case]:
    out = [
        _route_case(*spec, "quick")
        for spec in [
            (9, 16, 4, 2, 4, True, 2.5, "random"),
            (9, 64, 8, 4, 8, True, 2.5, "random"),
            (33, 256, 8, 4, 8, True, 2.5, "random"),
            (9, 256, 8, 4, 8, False, 1.0, "random"),
            (12, 48, 8, 4, 8, True, 2.5, "ties"),
            (7, 8, 1, 1, 2, True, 1.0, "random"),
            (6, 32, 8, 4, 1, True, 2.5, "random"),
        ]
    ]
    out += [
        _route_case(4096, 256, 8, 4, 8, True, 2.5, "random", "full"),
        _route_case(16384, 256, 8, 4, 8, False, 1.0, "random", "full"),
        _route_case(4096, 96, 8, 4, 8, True, 2.5, "ties", "full"),
    ]
    for dtype in ("bf16", "fp8"):
        out += [
            _experts_case(*spec, "quick")
            for spec in [
                (7, 6, 3, 320, 96, dtype, True, "neg_ids"),
                (5, 4, 2, 256, 128, dtype, False, "neg_ids"),
                (6, 8, 4, 200, 72, dtype, True, "all_neg"),
                (6, 8, 8, 128, 64, dtype, False, "all_neg"),
            ]
        ]
        # fp32 out at decode and at prefill sizes (backends often switch paths past a few dozen tokens).
        out += [_experts_case(*spec, "quick", out="fp32") for spec in [
            (7, 6, 3, 256, 128, dtype, True, "neg_ids"),
            (96, 8, 4, 256, 128, dtype, True, "neg_ids"),
        ]]
        out += [
            _experts_case(64, 16, 8, 7168, 2048, dtype, True, "neg_ids", "full"),
            _experts_case(512, 64 if dtype == "fp8" else 32, 8, 7168, 2048, dtype, False, "neg_ids", "full"),
        ]
    return out
