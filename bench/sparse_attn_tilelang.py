"""Our TileLang sparse MLA (cuda_hopper ``tilelang`` backend) on an H100/H200: correctness, then speed beside Triton.

1. Correctness against the reference backend on CUDA, for the default launch shape and every other candidate of
   :data:`~dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla.CANDIDATES`: 64 and 128 heads, k 2048 and 64 /
   128, T = 3 and 512, ragged ``-1`` padding (one row all ``-1``), duplicated indices, every unselected KV row
   poisoned with NaN (row 0 and the last row included: a read ``-1`` shows) and the outputs poisoned (NaN left
   in the caching allocator's blocks the kernel reuses). bf16 decode (batch 4 with split-K, batch 64
   unsplit) the same way.
2. Speed: prefill of 4096 queries over 8K and 32K keys, 128 heads, k 2048, for each candidate and the Triton
   default in the same run (event-timed median, ``bench/common.time_ms``); bf16 decode batch 64 at a 32K context
   (page 64) for the default and Triton. TFLOP/s with ``FLOPs = 2 * H * (576 + 512) * K`` per query, and the %
   of a bf16 ``torch.matmul`` 8192^3 measured in the same run (issue 9: aim >= 55%).

    python3 bench/sparse_attn_tilelang.py [--out bench/results/sparse_attn_tilelang.json] [--quick] [--no-triton]

Prints PASS/FAIL per check, a table last, and writes JSON (atomically). Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bf16_matmul_ceiling_tflops, time_ms, write_json  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_attn import TileLangSparseAttn, plan_splits  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import (  # noqa: E402
    CANDIDATES,
    DEFAULT_CONFIG,
    flops,
    precompile,
)
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn  # noqa: E402
from dsa_runtime.testing.compare import out_and_lse  # noqa: E402
from dsa_runtime.testing.tolerances import tolerance  # noqa: E402

SCALE, PAGE, K = 0.135234, 64, 2048
REF = ReferenceSparseAttn()


def poison_allocator(nbytes: int) -> None:
    """Leave NaN in freed blocks of the caching allocator, so outputs the kernel does not write show up."""
    blob = torch.full((nbytes // 4,), float("nan"), device="cuda")
    del blob


def prefill_case(gen: torch.Generator, t: int, s: int, heads: int, k: int):
    """Random q/kv, distinct indices with ragged -1 padding, one all -1 row, a duplicated index; unselected KV
    rows (always row 0 and the last) are NaN."""
    q = torch.randn(t, heads, 576, device="cuda", generator=gen).bfloat16()
    kv = torch.randn(s, 576, device="cuda", generator=gen).bfloat16()
    pool = s - 2  # rows 1 .. s-2 may be selected
    idx = torch.rand(t, pool, device="cuda", generator=gen).argsort(dim=1)[:, :k].to(torch.int32) + 1
    if t > 1:
        idx[1, k // 3:] = -1  # ragged: a short context
        idx[0, :] = -1  # an empty query: zeros and lse +inf
    if t > 2:
        idx[2, 1] = idx[2, 0]  # a duplicate: counts twice
    idx[3::5, ::7] = -1
    used = torch.zeros(s, dtype=torch.bool, device="cuda")
    used[idx[idx >= 0].long()] = True
    kv[~used] = float("nan")
    return q, kv, idx


def check(name: str, got, want) -> bool:
    out, lse = got
    msg = out_and_lse(out.float(), lse, want[0].float(), want[1], tolerance("sparse_attn.out"),
                      tolerance("sparse_attn.lse"))
    empty = torch.isposinf(want[1])
    if msg is None and bool(empty.any()) and bool((out[empty] != 0).any()):
        msg = "a query with no valid index has a non-zero output"
    if msg is None and not bool(torch.isfinite(out).all()):
        msg = "non-finite output"
    err = (out.float() - want[0].float()).abs().max().item()
    fin = torch.isfinite(want[1])
    lerr = (lse[fin] - want[1][fin]).abs().max().item() if bool(fin.any()) else 0.0
    print(f"  {'PASS' if msg is None else 'FAIL'} {name:54s} max|out err| {err:.3e}  max|lse err| {lerr:.3e}"
          + ("" if msg is None else f"  {msg}"), flush=True)
    return msg is None


CHECK_SHAPES = [(3, 300, 64, 64), (3, 300, 128, 128), (512, 4096, 128, 2048), (512, 3000, 64, 2048)]


def warm(configs, quick: bool) -> None:
    """Compile every kernel this run uses up front, in parallel (a cold compile takes tens of seconds each)."""
    keys = []
    for _t, _s, heads, k in CHECK_SHAPES[2:3] if quick else CHECK_SHAPES:
        for cfg in configs if k == 2048 and heads == 128 else configs[:1]:
            keys.append((heads, k, SCALE, TileLangSparseAttn(config=cfg)._config(k), False))
    for rows in (4, 64):
        n = plan_splits(rows, 128, K) if rows == 4 else 1
        keys.append((128, K // n, SCALE, DEFAULT_CONFIG, n > 1))
    keys.append((128, K // 2, SCALE, DEFAULT_CONFIG, True))  # decode timed with 2 splits
    t0 = time.time()
    errors = precompile(keys)
    for key, why in errors.items():
        print(f"  compile FAILED heads {key[0]} k {key[1]} {key[3].label()} split {key[4]}: {why}", flush=True)
    print(f"compiled {len(set(keys))} kernels in {time.time() - t0:.0f} s ({len(errors)} failed)", flush=True)


def correctness(gen: torch.Generator, configs, quick: bool) -> bool:
    ok = True
    for t, s, heads, k in CHECK_SHAPES[2:3] if quick else CHECK_SHAPES:
        q, kv, idx = prefill_case(gen, t, s, heads, k)
        want = REF.prefill(q[:64], kv, idx[:64], SCALE)  # the reference on the first rows (keeps it quick)
        for cfg in configs if (heads, k) == (128, 2048) else configs[:1]:
            poison_allocator(4 * t * heads * 512 * 2)
            got = TileLangSparseAttn(config=cfg).prefill(q, kv, idx, SCALE)
            torch.cuda.synchronize()
            ok &= check(f"prefill {cfg.label()} t{t} s{s} h{heads} k{k}", (got[0][:64], got[1][:64]), want)
    for batch, splits in ((4, None), (64, 1)):
        heads = 128
        pages = batch * 8 + 1
        cache = torch.randn(pages, PAGE, 576, device="cuda", generator=gen).bfloat16()
        slots = torch.rand(batch, (pages - 1) * PAGE, device="cuda", generator=gen).argsort(dim=1)[:, :K] + PAGE
        slots = slots.to(torch.int32).view(batch, 1, K)
        slots[0, 0, 100:] = -1
        used = torch.zeros(pages * PAGE, dtype=torch.bool, device="cuda")
        used[slots[slots >= 0].long()] = True
        cache.view(-1, 576)[~used] = float("nan")
        q = torch.randn(batch, 1, heads, 576, device="cuda", generator=gen).bfloat16()
        n = splits or plan_splits(batch, heads, K)
        poison_allocator(4 * batch * heads * 512 * 4 * n)
        got = TileLangSparseAttn(decode_splits=n).decode(q, cache, slots, SCALE, layout="bf16")
        want = REF.decode(q, cache, slots, SCALE, layout="bf16")
        ok &= check(f"decode bf16 b{batch} h{heads} k{K} splits {n}", got, want)
    return ok


def prefill_inputs(gen: torch.Generator, s: int):
    q = torch.randn(4096, 128, 576, device="cuda", generator=gen).bfloat16()
    kv = torch.randn(s, 576, device="cuda", generator=gen).bfloat16()
    idx = torch.rand(4096, s, device="cuda", generator=gen).argsort(dim=1)[:, :K].to(torch.int32)
    return q, kv, idx


def timed(rows: list[dict], shape: str, label: str, fn, n_flops: int, ceiling: float) -> None:
    t0 = time.time()
    try:
        ms = time_ms(fn)
    except Exception as exc:  # noqa: BLE001 - a candidate that fails to compile or run is a result
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:200]
        print(f"  {shape:22s} {label:24s} FAILED: {why}", flush=True)
        rows.append({"shape": shape, "label": label, "error": why})
        return
    tf = n_flops / ms / 1e9
    print(f"  {shape:22s} {label:24s} {ms * 1e3:9.1f} us {tf:7.1f} TFLOP/s {100 * tf / ceiling:5.1f}% of matmul"
          f"  (incl. compile {time.time() - t0:.0f} s)", flush=True)
    rows.append({"shape": shape, "label": label, "us": ms * 1e3, "tflops": tf, "pct_of_matmul": 100 * tf / ceiling})


def speed_prefill(rows: list[dict], gen: torch.Generator, s: int, configs, ceiling: float, triton: bool) -> None:
    q, kv, idx = prefill_inputs(gen, s)
    shape = f"prefill t4096 s{s // 1024}K"
    for cfg in configs:
        kern = TileLangSparseAttn(config=cfg)
        timed(rows, shape, f"tilelang {cfg.label()}", lambda k=kern: k.prefill(q, kv, idx, SCALE),
              flops(4096, 128, K), ceiling)
    if triton:
        from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_prefill import sparse_mla_forward

        timed(rows, shape, "triton default", lambda: sparse_mla_forward(q, kv, idx, SCALE), flops(4096, 128, K),
              ceiling)


def speed(gen: torch.Generator, configs, ceiling: float, triton: bool) -> list[dict]:
    rows: list[dict] = []
    for s in (8192, 32768):
        speed_prefill(rows, gen, s, configs, ceiling, triton)
        torch.cuda.empty_cache()
    batch, ctx = 64, 32768
    pages = batch * ctx // PAGE + 1
    cache = torch.randn(pages, PAGE, 576, device="cuda", generator=gen).bfloat16()
    slots = torch.stack([torch.randperm(ctx, device="cuda", generator=gen)[:K] + b * ctx for b in range(batch)])
    slots = slots.to(torch.int32).view(batch, 1, K)
    qd = torch.randn(batch, 1, 128, 576, device="cuda", generator=gen).bfloat16()
    shape = f"decode b{batch} 32K h128"
    for n in sorted({plan_splits(batch, 128, K), 2}):
        kern = TileLangSparseAttn(decode_splits=n)
        timed(rows, shape, f"tilelang default splits {n}",
              lambda k=kern: k.decode(qd, cache, slots, SCALE, layout="bf16"), flops(batch, 128, K), ceiling)
    if triton:
        from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_bf16 import decode_bf16

        timed(rows, shape, "triton default", lambda: decode_bf16(qd, cache, slots, SCALE), flops(batch, 128, K),
              ceiling)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sparse_attn_tilelang.json"))
    ap.add_argument("--quick", action="store_true", help="the default launch shape only, one correctness shape")
    ap.add_argument("--no-triton", action="store_true", help="do not time the Triton kernels beside")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    import tilelang

    props = torch.cuda.get_device_properties(0)
    info = {"gpu": props.name, "sms": str(props.multi_processor_count), "torch": torch.__version__,
            "tilelang": tilelang.__version__, "cuda": str(torch.version.cuda)}
    print(info, flush=True)
    start = time.time()
    gen = torch.Generator(device="cuda").manual_seed(0)
    configs = [DEFAULT_CONFIG] if args.quick else list(CANDIDATES)
    warm(configs, args.quick)
    ok = True if args.no_check else correctness(gen, configs, args.quick)
    print(f"correctness {'PASS' if ok else 'FAIL'} ({time.time() - start:.0f} s)", flush=True)
    ceiling = bf16_matmul_ceiling_tflops()
    print(f"bf16 matmul 8192^3: {ceiling:.1f} TFLOP/s", flush=True)
    rows = speed(gen, configs, ceiling, not args.no_triton)
    print(f"\n{'shape':22s} {'kernel':36s} {'us':>9s} {'TFLOP/s':>8s} {'% matmul':>8s}")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:22s} {r['label']:36s} FAILED {r['error'][:60]}")
        else:
            print(f"{r['shape']:22s} {r['label']:36s} {r['us']:9.1f} {r['tflops']:8.1f} {r['pct_of_matmul']:8.1f}")
    write_json(args.out, {"device": info, "matmul_tflops": ceiling, "checks_ok": bool(ok), "rows": rows,
                          "seconds": time.time() - start,
                          "when": datetime.datetime.now(datetime.timezone.utc).isoformat()})
    print(f"checks {'PASS' if ok else 'FAIL'}; {time.time() - start:.0f} s; wrote {args.out}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
