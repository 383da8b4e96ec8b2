"""The DeepGEMM adapter's Triton glue (SwiGLU + re-quantization, weighted combine of expert-sorted rows) on CPU
under ``TRITON_INTERPRET=1``, with the plain-torch stand-in for ``deep_gemm``: the prefill path equals the
torch-glue path and the fp32 reference. Prints one line per check; exit 1 on a miss."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repo root
assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

import dsa_runtime.plugins.cuda_hopper.deepgemm_moe as moe_mod  # noqa: E402
from dsa_runtime.families import ExpertWeights  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.deepgemm_api import DeepGEMMAPI  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.moe_quant import swiglu_quantize_rows  # noqa: E402
from dsa_runtime.reference.moe import ReferenceMoE  # noqa: E402
from tests.hopper.fake_deep_gemm import make_module  # noqa: E402


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    keep = b.norm(dim=1) > 0
    return float(((a - b).norm(dim=1)[keep] / b.norm(dim=1)[keep]).max())


def check(name: str, ok: bool, detail: str = "") -> int:
    print(f"{'passed' if ok else 'FAILED'} {name} {detail}")
    return 0 if ok else 1


def main() -> int:
    gen = torch.Generator().manual_seed(3)
    bad = 0
    for fmt in ("ue8m0", "float"):
        h13 = (torch.randn(37, 512, generator=gen) * 3).bfloat16()
        q, s = swiglu_quantize_rows(h13, fmt)
        q_t, s_t = moe_mod._swiglu_quant(h13, 256, fmt)
        deq, deq_t = q.float() * s.repeat_interleave(128, 1), q_t.float() * s_t.repeat_interleave(128, 1)
        bad += check(f"swiglu+quant {fmt}: scales equal, values within one e4m3 step",
                     torch.equal(s, s_t) and rel(deq, deq_t) < 0.07, f"(rel {rel(deq, deq_t):.4f})")
    n_exp, dim, inter, tokens, top_k = 6, 256, 128, 70, 3
    w13 = (torch.randn(n_exp, 2 * inter, dim, generator=gen) * 8).to(torch.float8_e4m3fn)
    w2 = (torch.randn(n_exp, dim, inter, generator=gen) * 8).to(torch.float8_e4m3fn)
    ew = ExpertWeights(w13, w2, torch.rand(n_exp, 2, 2, generator=gen) * 0.01 + 0.001,
                       torch.rand(n_exp, 2, 1, generator=gen) * 0.01 + 0.001)
    sh = ExpertWeights(w13[:1].clone(), w2[:1].clone(), ew.w13_scale[:1] * 2, ew.w2_scale[:1] * 3)
    x = torch.randn(tokens, dim, generator=gen).bfloat16()
    ids = torch.randint(-1, n_exp, (tokens, top_k), generator=gen, dtype=torch.int32)
    ids[5] = -1  # a token with no routed expert
    w = torch.rand(tokens, top_k, generator=gen) + 0.2
    api = DeepGEMMAPI(make_module("fp8_fp4"), "fp8_fp4")
    kern = moe_mod.DeepGEMMMoE("ue8m0", masked_max_tokens=16, api=api)  # 70 tokens: the contiguous prefill path
    for shared in (None, sh):
        got = kern.experts(x, w, ids, ew, shared)
        want = ReferenceMoE().experts(x, w, ids, ew, shared)
        real = moe_mod._triton_glue
        moe_mod._triton_glue = lambda t: False
        try:
            torch_glue = kern.experts(x, w, ids, ew, shared)
        finally:
            moe_mod._triton_glue = real
        tag = "with shared" if shared is not None else "routed only"
        bad += check(f"prefill Triton glue vs fp32 reference ({tag})", got.dtype == torch.bfloat16 and rel(got, want) < 0.12,
                     f"(rel {rel(got, want):.4f})")
        bad += check(f"prefill Triton glue vs torch glue ({tag})", rel(got, torch_glue) < 0.03,
                     f"(rel {rel(got, torch_glue):.4f})")
        if shared is None:
            bad += check("token without routed experts is zero", bool((got[5] == 0).all()))
    got32 = kern.experts(x, w, ids, ew, sh, out_dtype=torch.float32)  # a TP rank's partial sum, unrounded
    bad += check("prefill Triton glue, out_dtype float32: fp32, within one bf16 step of the bf16 output",
                 got32.dtype == torch.float32 and rel(got32, got) < 2**-7,  # one bf16 step, either rounding
                 f"({got32.dtype}, rel {rel(got32, got):.5f})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
