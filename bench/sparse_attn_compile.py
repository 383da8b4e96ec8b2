"""Compile sparse MLA kernel candidates for SM90 without a GPU (Triton's bundled ptxas): registers, spill stack,
shared memory, wgmma and cp.async counts, so the GPU sweep starts from configs that fit.

    python bench/sparse_attn_compile.py [prefill] [fp8]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from indexer_triton_compile import compile_report  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.triton import mla_fp8_decode as f8  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton import sparse_mla_pipe as sp  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton import sparse_mla_prefill as pf  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.sparse_attn_candidates import BF16_CANDIDATES, FP8_CANDIDATES  # noqa: E402

I32 = "i32"
BF16_SIG = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "idx_ptr": "*i32", "out_ptr": "*bf16", "lse_ptr": "*fp32",
            **dict.fromkeys(["n_q_rows", "heads", "top_k", "n_kv_rows", "chunk", "d_v", "n_hb", "n_dvb",
                             "stride_qt", "stride_qh", "stride_kv", "stride_it", "stride_os", "stride_ot",
                             "stride_oh", "stride_ls", "stride_lt"], I32), "scale_log2": "fp32"}
FP8_SIG = {"q_ptr": "*bf16", "c8_ptr": "*fp8e4nv", "s32_ptr": "*fp32", "pe16_ptr": "*bf16", "idx_ptr": "*i32",
           "out_ptr": "*bf16", "lse_ptr": "*fp32", "H": I32, "K": I32, "K_PER_SPLIT": I32, "qk_scale": "fp32",
           **dict.fromkeys(["stride_qm", "stride_qh", "stride_im", "stride_om", "stride_os", "stride_oh",
                            "stride_lm", "stride_ls"], I32)}


BF16_ALIGNED = ("q_ptr", "kv_ptr", "idx_ptr", "out_ptr", "lse_ptr", "stride_qt", "stride_qh", "stride_kv",
                "stride_it", "stride_os", "stride_ot", "stride_oh", "stride_ls", "stride_lt")
FP8_ALIGNED = ("q_ptr", "c8_ptr", "s32_ptr", "pe16_ptr", "idx_ptr", "out_ptr", "lse_ptr", "stride_qm",
               "stride_qh", "stride_im", "stride_om", "stride_os", "stride_oh", "stride_lm", "stride_ls")


def main() -> int:
    which = set(sys.argv[1:]) or {"prefill", "fp8"}
    if "prefill" in which:
        for cfg in dict.fromkeys(c for cs in BF16_CANDIDATES.values() for c in cs):
            fn = {"pipe": sp._sparse_mla_pipe_kernel, "pipew": sp._sparse_mla_wide_kernel}.get(
                cfg.variant, pf._sparse_mla_kernel)
            consts = {"BLOCK_H": cfg.block_h, "BLOCK_N": cfg.block_n, "BLOCK_DV": cfg.block_dv, "SPLIT": False,
                      "PRECISION": "tf32", "UPCAST": False}
            print(f"bf16 {cfg.label():32} {compile_report(fn, BF16_SIG, consts, cfg.num_warps, cfg.num_stages, BF16_ALIGNED)}",
                  flush=True)
    if "fp8" in which:
        for cfg in dict.fromkeys(c for cs in FP8_CANDIDATES.values() for c in cs):
            fn = f8._kernels()[cfg.variant]
            consts = {"D_OUT": 512, "SPLIT": False, "BLOCK_H": cfg.block_h, "BLOCK_N": cfg.block_n, "UPCAST": False}
            print(f"fp8  {cfg!s:80} {compile_report(fn, FP8_SIG, consts, cfg.num_warps, cfg.num_stages, FP8_ALIGNED)}",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
