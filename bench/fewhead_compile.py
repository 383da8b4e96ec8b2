"""Which gathers of the few-head decode kernel Triton pipelines, compiled for sm_90 on any machine (no GPU).

    python bench/fewhead_compile.py

Compiles ``_fewhead_cols_kernel`` (:mod:`dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_fewhead`) for
every variant, layout and the default row steps (``fewhead_plan.DEFAULTS``), with the divisibility hints
the launcher gives real pointers and sizes (multiples of 16), and counts in its TTGIR the 2-D row gathers
(``[BLOCK_N, 128]`` latent blocks and ``[BLOCK_N, 64]`` rope) issued as ``cp.async``
(``ttg.async_copy_global_to_local``, prefetched ``num_stages`` deep) against those left as synchronous
``tt.load`` inside the loop, plus the shared memory the launch needs.
Every gather should be asynchronous: a tile used by two dots was not, and the FP8 kernel ran 20% slower.
Exits 1 when a gather is synchronous.
"""

from __future__ import annotations

import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dsa_runtime.plugins.cuda_hopper.triton import sparse_mla_decode_fewhead as few
from dsa_runtime.plugins.cuda_hopper.triton.fewhead_plan import DEFAULTS

POINTERS = {"q_ptr": "*bf16", "idx_ptr": "*i32", "part_ptr": "*fp32", "plse_ptr": "*fp32", "out_ptr": "*bf16",
            "lse_ptr": "*fp32", "count_ptr": "*i32"}
NOT_ALIGNED = {"SPLITS", "qk_scale"}  # runtime values the launcher does not see as multiples of 16


def compile_ttgir(fp8: bool, fold: bool, block_n: int, stages: int, warps: int) -> tuple[str, int]:
    kern = few._fewhead_cols_kernel
    consts = {"FP8": fp8, "D_OUT": 512, "BLOCK_H": 16, "BLOCK_N": block_n, "BLOCK_S": 4, "FUSED": False,
              "FOLD": fold, "UPCAST": False}
    sig = {}
    for name in kern.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name == "kv_ptr":
            sig[name] = "*u8" if fp8 else "*bf16"
        else:
            sig[name] = POINTERS.get(name, "fp32" if name == "qk_scale" else "i32")
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(kern.arg_names)
             if sig[name] != "constexpr" and name not in NOT_ALIGNED}
    src = ASTSource(fn=kern, signature=sig, attrs=attrs,
                    constexprs={(kern.arg_names.index(k),): v for k, v in consts.items()})
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps,
                                                                              "num_stages": stages})
    return compiled.asm["ttgir"], compiled.metadata.shared


def gathers(ttgir: str, block_n: int) -> tuple[int, int]:
    """(asynchronous, synchronous) ``[block_n, 128]`` / ``[block_n, 64]`` row gathers in the TTGIR."""
    shape = re.compile(rf"tensor<{block_n}x(128|64)x!tt\.ptr")
    lines = [ln for ln in ttgir.splitlines() if shape.search(ln)]
    return (sum("async_copy_global_to_local" in ln for ln in lines),
            sum(re.search(r"= tt\.load ", ln) is not None for ln in lines))


def main() -> int:
    print("| layout | variant | rows / step | stages | shared memory | async gathers | sync gathers |")
    print("|---|---|---:|---:|---:|---:|---:|")
    bad = 0
    for (layout, heads), cfg in DEFAULTS.items():
        if heads != 16:
            continue
        for variant in ("cols", "fold") if layout == "fp8_656" else ("cols",):
            fp8 = layout == "fp8_656"
            ttgir, smem = compile_ttgir(fp8, fp8 and variant == "fold", cfg.block_n, cfg.num_stages, cfg.num_warps)
            n_async, n_sync = gathers(ttgir, cfg.block_n)
            bad += n_sync > 0 or n_async == 0
            print(f"| {layout} | {variant} | {cfg.block_n} | {cfg.num_stages} | {smem} | {n_async} | {n_sync} |")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
