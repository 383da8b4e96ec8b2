"""Compile every Triton top-k kernel variant for SM90 without a GPU (the interpreter accepts code that the GPU
compiler refuses, e.g. a constexpr re-bound in an unrolled loop or plain-int globals read in a kernel).

    python bench/topk_triton_compile.py      # exit 1 when any variant fails to compile

Also fails on "tl.where with a non-boolean condition" deprecation warnings (the conditions must be boolean).
"""

from __future__ import annotations

import io
import sys
import warnings
from contextlib import redirect_stderr, redirect_stdout

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from indexer_triton_compile import compile_report  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.triton import topk_bisect as tb
from dsa_runtime.plugins.cuda_hopper.triton import topk_bisect_split as tbs
from dsa_runtime.plugins.cuda_hopper.triton import topk_cand as tc
from dsa_runtime.plugins.cuda_hopper.triton import topk_radix as tr
from dsa_runtime.plugins.cuda_hopper.triton import topk_sample as tsa
from dsa_runtime.plugins.cuda_hopper.triton import topk_slots as tsl
from dsa_runtime.plugins.cuda_hopper.triton import topk_split as ts

TARGET = GPUTarget("cuda", 90, 32)
P32, I32 = "*fp32", "i32"
IP = "*i32"
TABLE = {"table_ptr": IP, "stride_table": I32, "batch_ptr": IP, "page_size": I32}


def comp(fn, sig: dict, consts: dict, warps: int = 8) -> str:
    src = ASTSource(fn=fn, signature={**sig, **dict.fromkeys(consts, "constexpr")}, constexprs=consts)
    buf = io.StringIO()
    try:
        with warnings.catch_warnings(record=True) as caught, redirect_stderr(buf), redirect_stdout(buf):
            warnings.simplefilter("always")
            k = triton.compile(src, target=TARGET, options={"num_warps": warps})
        msgs = [str(w.message) for w in caught] + [ln for ln in buf.getvalue().splitlines() if "warn" in ln.lower()]
        bad = [m for m in msgs if "non-boolean" in m]
        if bad:
            return f"FAILED warning: {bad[0][:200]}"
        return f"ok smem {k.metadata.shared}"
    except Exception as e:  # reported per variant
        return f"FAILED {type(e).__name__}: {str(e)[-600:]}"


def variants():
    rows = {"logits_ptr": P32, "stride_row": I32, "starts_ptr": IP, "ends_ptr": IP, "out_ptr": IP, "k": I32, **TABLE}
    for bits in (8, 11):
        for fuse in (False, True):
            yield f"rows b{bits} fuse{fuse}", tr._topk_rows_kernel, rows, {"BITS": bits, "BLOCK": 2048, "FUSE": fuse}, 8
    hist = {"logits_ptr": P32, "stride_row": I32, "starts_ptr": IP, "ends_ptr": IP, "ws_ptr": IP, "state_ptr": IP,
            "k": I32, "S": I32, "R": I32}
    for bits in (8, 11):
        for p in range(-(-32 // bits)):
            yield f"split-hist b{bits} p{p}", ts._split_hist_kernel, hist, {"p": p, "BITS": bits, "BLOCK": 2048}, 8
    fin = {"logits_ptr": P32, "stride_row": I32, "starts_ptr": IP, "ends_ptr": IP, "ws_ptr": IP, "state_ptr": IP,
           "out_ptr": IP, "k": I32, "S": I32, "R": I32, **TABLE}
    for bits in (8, 11):
        for fuse in (False, True):
            yield (f"split-final b{bits} fuse{fuse}", ts._split_final_kernel, fin,
                   {"NPASS": -(-32 // bits), "BITS": bits, "BLOCK": 2048, "FUSE": fuse}, 8)
    crow = {"logits_ptr": P32, "stride_row": I32, "starts_ptr": IP, "ends_ptr": IP, "out_ptr": IP, "cand_ptr": IP,
            "ckey_ptr": IP, "k": I32, "C": I32, **TABLE}
    chist = {"logits_ptr": P32, "stride_row": I32, "starts_ptr": IP, "ends_ptr": IP, "ws_ptr": IP, "k": I32, "S": I32,
             "R": I32, "C": I32}
    cfin = {"logits_ptr": P32, "stride_row": I32, "starts_ptr": IP, "ends_ptr": IP, "ws_ptr": IP, "out_ptr": IP,
            "cand_ptr": IP, "ckey_ptr": IP, "k": I32, "S": I32, "R": I32, "C": I32, **TABLE}
    for block, warps in ((1024, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16)):
        for fuse in (False, True):
            yield f"cand-rows blk{block} w{warps} fuse{fuse}", tc._cand_rows_kernel, crow, {"BLOCK": block, "FUSE": fuse}, warps
            yield (f"cand-scatter blk{block} w{warps} fuse{fuse}", tc._cand_scatter_kernel, cfin,
                   {"BLOCK": block, "FUSE": fuse}, warps)
        for level in (0, 1):
            yield (f"cand-hist L{level} blk{block} w{warps}", tc._cand_hist_kernel, chist,
                   {"LEVEL": level, "BLOCK": block}, warps)
    for block, warps in ((512, 4), (1024, 4), (1024, 8), (2048, 8), (4096, 16)):
        for fuse in (False, True):
            yield (f"cand-finish blk{block} w{warps} fuse{fuse}", tc._cand_finish_kernel, cfin,
                   {"BLOCK": block, "FUSE": fuse}, warps)
    # Integer arguments equal to 1 are specialised to constexprs by the launcher (1 row, k = 1, page size 1):
    # the kernels must compile that way too.
    ones = ("k", "R", "C", "page_size")
    for name, fn, sig in (("cand-rows", tc._cand_rows_kernel, crow), ("cand-scatter", tc._cand_scatter_kernel, cfin),
                          ("cand-finish", tc._cand_finish_kernel, cfin), ("rows", tr._topk_rows_kernel, rows)):
        spec = {a: 1 for a in ones if a in sig}
        extra = {"BITS": 8} if fn is tr._topk_rows_kernel else {}
        yield (f"{name} ints=1", fn, {a: t for a, t in sig.items() if a not in spec},
               {**spec, **extra, "BLOCK": 1024, "FUSE": True}, 4)
    for level in (0, 1):
        yield (f"cand-hist L{level} ints=1", tc._cand_hist_kernel,
               {a: t for a, t in chist.items() if a not in ("k", "R", "C")}, {"k": 1, "R": 1, "C": 1, "LEVEL": level,
                                                                             "BLOCK": 1024}, 4)
    brows = {**rows, "skip_ptr": IP}
    for width, warps in ((1024, 4), (4096, 4), (8192, 8), (16384, 16), (32768, 32), (32768, 16)):
        for fuse in (False, True):
            yield (f"bisect W{width} w{warps} fuse{fuse}", tb._topk_bisect_kernel, brows,
                   {"WIDTH": width, "BLOCK": min(1024, width), "FUSE": fuse}, warps)
    for width, warps in ((8192, 8), (16384, 16), (32768, 32)):
        for skip in (False, True):
            tag = " skip" if skip else ""
            yield (f"bisect regs W{width} w{warps}{tag}", tb._topk_bisect_kernel, brows,
                   {"WIDTH": width, "BLOCK": 1024, "FUSE": True, "REG_WRITE": True, "HAS_SKIP": skip}, warps)
            sl = {"logits_ptr": P32, "stride_row": I32, "starts_ptr": IP, "ends_ptr": IP, "ckey_ptr": IP,
                  "ccol_ptr": IP, "k": I32, "S": I32, "SLICE": I32, "skip_ptr": IP}
            yield (f"bisect-slice W{width} w{warps}{tag}", tbs._slice_kernel, sl,
                   {"WIDTH": width, "BLOCK": 1024, "HAS_SKIP": skip}, warps)
            mg = {"ckey_ptr": IP, "ccol_ptr": IP, "starts_ptr": IP, "out_ptr": IP, "k": I32, "SK": I32, **TABLE,
                  "skip_ptr": IP, "skip_div": I32}
            for fuse in (False, True):
                yield (f"bisect-merge W{width} w{warps} fuse{fuse}{tag}", tbs._merge_kernel, mg,
                       {"WIDTH": width, "BLOCK": 1024, "FUSE": fuse, "HAS_SKIP": skip}, warps)
            yield (f"bisect-merge W{width} w{warps} out-cand{tag}", tbs._merge_kernel, mg,
                   {"WIDTH": width, "BLOCK": 1024, "FUSE": False, "OUT_CAND": True, "HAS_SKIP": skip}, warps)
    yield ("bisect ints=1", tb._topk_bisect_kernel, {a: t for a, t in brows.items() if a not in ("k", "page_size")},
           {"k": 1, "page_size": 1, "WIDTH": 8192, "BLOCK": 1024, "FUSE": True}, 8)
    yield from sample_variants()
    slots = {"pos_ptr": IP, "stride_pos": I32, "table_ptr": IP, "stride_table": I32, "batch_ptr": IP, "out_ptr": IP,
             "k": I32, "page_size": I32}
    yield "slots", tsl._slots_kernel, slots, {"BLOCK": 1024}, 4


def sample_variants():
    """The sampled-bound search (:mod:`.topk_sample`) at the shapes the plan uses and a few it may try."""
    F32 = "fp32"
    samp = {"logits_ptr": P32, "stride_row": I32, "starts_ptr": IP, "ends_ptr": IP, "bound_ptr": IP, "k": I32,
            "sigmas": F32, "cap": I32}
    for sample, warps in ((4096, 4), (8192, 8), (16384, 16)):
        yield f"sample S{sample} w{warps}", tsa._sample_kernel, samp, {"SAMPLE": sample, "CHUNK": 32}, warps
    scan = {"logits_ptr": P32, "stride_row": I32, "starts_ptr": IP, "ends_ptr": IP, "bound_ptr": IP, "cnt_ptr": IP,
            "ckey_ptr": IP, "ccol_ptr": IP, "k": I32, "S": I32, "CAPS": I32, "sigmas": F32, "cap": I32}
    for block, warps, stages in ((1024, 4, 1), (2048, 4, 1), (4096, 8, 1), (2048, 4, 3), (2048, 4, 4),
                                 (1024, 4, 4), (1024, 4, 6)):
        yield (f"scan blk{block} w{warps} st{stages}", tsa._scan_kernel, scan,
               {"SAMPLE": 8192, "CHUNK": 32, "FUSED": False, "BLOCK": block, "STAGES": stages}, warps)
    yield ("scan blk2048 w4 pdl", tsa._scan_kernel, scan,  # programmatic dependent launch (griddepcontrol)
           {"SAMPLE": 8192, "CHUNK": 32, "FUSED": False, "BLOCK": 2048, "PDL": True}, 4)
    yield ("sample S8192 w8 pdl", tsa._sample_kernel, samp, {"SAMPLE": 8192, "CHUNK": 32, "PDL": True}, 8)
    for sample, warps in ((4096, 4), (8192, 8)):
        yield (f"scan fused S{sample} w{warps}", tsa._scan_kernel, scan,
               {"SAMPLE": sample, "CHUNK": 32, "FUSED": True, "BLOCK": 2048}, warps)
    fin = {"starts_ptr": IP, "ends_ptr": IP, "cnt_ptr": IP, "ckey_ptr": IP, "ccol_ptr": IP, "out_ptr": IP,
           "done_ptr": IP, "k": I32, "S": I32, "CAPS": I32, **TABLE}
    for cap, warps in ((4096, 4), (4096, 8), (8192, 8)):
        for fuse in (False, True):
            yield (f"sample-finish C{cap} w{warps} fuse{fuse}", tsa._finish_kernel, fin,
                   {"CAP": cap, "SP": 64, "BLOCK": 1024, "FUSE": fuse}, warps)
    yield ("sample-finish C4096 w8 pdl", tsa._finish_kernel, fin,
           {"CAP": 4096, "SP": 64, "BLOCK": 1024, "FUSE": False, "PDL": True}, 8)
    yield ("sample-finish ints=1", tsa._finish_kernel, {a: t for a, t in fin.items() if a not in ("S", "CAPS")},
           {"S": 1, "CAPS": 1, "CAP": 4096, "SP": 1, "BLOCK": 1024, "FUSE": False}, 8)


def main() -> int:
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    bad = 0
    for name, fn, sig, consts, warps in variants():
        if only and only not in name:
            continue
        res = comp(fn, sig, consts, warps)
        if fn in (tb._topk_bisect_kernel, tbs._slice_kernel, tbs._merge_kernel, tsa._sample_kernel, tsa._scan_kernel,
                  tsa._finish_kernel) and res.startswith("ok"):  # register-resident: spills matter
            res = compile_report(fn, sig, consts, warps, 3)
        print(f"{name}: {res}", flush=True)
        bad += res.startswith("FAILED")
    print("all compiled" if not bad else f"{bad} FAILED")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
