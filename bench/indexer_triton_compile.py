"""Compile every Triton indexer kernel config for SM90 on a machine without a GPU (Triton's bundled ptxas) and
print registers, spill stack and whether the dot became ``wgmma``: catches compile errors and register spills
before the GPU run of ``bench/indexer_triton.py``.

    python bench/indexer_triton_compile.py [ragged] [paged] [quant]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from dsa_runtime.plugins.cuda_hopper.triton import indexer_logits as il
from dsa_runtime.plugins.cuda_hopper.triton import indexer_quant as iq

TARGET = GPUTarget("cuda", 90, 32)
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
RAGGED_SIG = {"q_ptr": "*fp8e4nv", "w_ptr": "*fp32", "k_ptr": "*fp8e4nv", "ks_ptr": "*i32", "ke_ptr": "*i32",
              "sc_ptr": "*fp32", "out_ptr": "*fp32", "T": "i32", "S": "i32", "H": "i32"}
PAGED_SIG = {"q_ptr": "*fp8e4nv", "w_ptr": "*fp32", "kv_ptr": "*fp8e4nv", "kvf_ptr": "*fp32", "lens_ptr": "*i32",
             "table_ptr": "*i32", "out_ptr": "*fp32", "H": "i32", "P": "i32", "max_pages": "i32",
             "stride_table": "i32", "W": "i32", "STEPS": "i32"}
# What the launcher specializes as divisible by 16 at V3.2's shapes (page 64, 16-byte aligned buffers): without
# these hints the gathers compile to synchronous loads and the report (registers, cp.async) is not the GPU's.
PAGED_ALIGNED = ("q_ptr", "w_ptr", "kv_ptr", "kvf_ptr", "lens_ptr", "table_ptr", "out_ptr", "P", "max_pages",
                 "stride_table", "W")
QUANT_SIG = {"h_ptr": "*bf16", "q_ptr": "*fp8e4nv", "s_ptr": "*fp32", "hw_ptr": "*fp32", "w_ptr": "*fp32",
             "R": "i32", "stride_x": "i32", "w_const": "fp32", "ITERS": "i32"}


def compile_report(fn, sig: dict, consts: dict, num_warps: int, num_stages: int, aligned: tuple[str, ...] = ()) -> str:
    """``aligned``: arguments to compile as divisible by 16 (as the launcher specializes 16-aligned pointers
    and strides), which is what lets gathers become 16-byte copies."""
    try:
        full = {**sig, **dict.fromkeys(consts, "constexpr")}
        attrs = {(fn.arg_names.index(a),): [["tt.divisibility", 16]] for a in aligned}
        src = ASTSource(fn=fn, signature=full, constexprs=consts, attrs=attrs)
        kernel = triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})
    except Exception as exc:  # reported, not fatal
        return f"FAILED {type(exc).__name__}: {str(exc)[:400]}"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as fh:
        fh.write(kernel.asm["cubin"])
    try:
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", fh.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(fh.name)
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", usage, re.S)
    regs, stack = (m.group(1), m.group(2)) if m else ("?", "?")
    spill = " SPILLS" if stack not in ("0", "?") else ""
    ptx = kernel.asm["ptx"]
    return (f"regs {regs} stack {stack}{spill} smem {kernel.metadata.shared} wgmma {'wgmma' in ptx} "
            f"cp.async {ptx.count('cp.async.cg') + ptx.count('cp.async.ca')}")


def main() -> int:
    which = set(sys.argv[1:]) or {"ragged", "paged", "quant"}
    if "ragged" in which:
        for name, cfg in il.RAGGED_CONFIGS.items():
            for heads in (64, 32):
                hp = il.pad_heads(heads)
                consts = {"HP": hp, "QPD": max(1, min(cfg.qpd, 256 // hp, cfg.block_m)), "BLOCK_M": cfg.block_m,
                          "BLOCK_N": cfg.block_n, "NUM_STAGES": cfg.num_stages, "IMPRECISE": cfg.imprecise_acc}
                rep = compile_report(il._ragged_kernel, RAGGED_SIG, consts, cfg.num_warps, cfg.num_stages)
                print(f"ragged {name:12} h{heads:<3} {rep}", flush=True)
    if "paged" in which:
        for name, cfg in {"default": il.PagedConfig(), **il.PAGED_CONFIGS}.items():
            for n_q, heads in ((1, 64), (2, 64)):
                consts = {"NQ": n_q, "NQP": triton.next_power_of_2(n_q), "HP": il.pad_heads(heads),
                          "BLOCK_N": cfg.block_n, "NUM_STAGES": cfg.num_stages, "IMPRECISE": cfg.imprecise_acc}
                rep = compile_report(il._paged_kernel, PAGED_SIG, consts, cfg.num_warps, cfg.num_stages,
                                     PAGED_ALIGNED)
                print(f"paged  {name:12} n{n_q} h{heads:<3} {rep}", flush=True)
    if "quant" in which:
        for fp32 in (False, True):
            sig = {"x_ptr": "*fp32" if fp32 else "*bf16", **QUANT_SIG}
            consts = {"FP32_IN": fp32, "UE8M0": True, "HAS_W": True, "BLOCK_R": 64, "PRE_ROUND": False,
                      "UPCAST": False}
            rep = compile_report(iq._rotate_quant_kernel, sig, consts, 4, 3)
            print(f"quant  {'fp32' if fp32 else 'bf16':12} {rep}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
