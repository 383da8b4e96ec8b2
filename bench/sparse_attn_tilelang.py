"""Our TileLang sparse MLA (cuda_hopper ``tilelang`` backend) on an H100/H200: correctness, then speed beside Triton.

1. Correctness against the reference backend on CUDA, for the default launch shape and every other candidate of
   :data:`~dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla.CANDIDATES`: 64 and 128 heads, k 2048 and 64 /
   128, T = 3 and 512, ragged ``-1`` padding (one row all ``-1``), duplicated indices, every unselected KV row
   poisoned with NaN (row 0 and the last row included: a read ``-1`` shows) and the outputs poisoned (NaN left
   in the caching allocator's blocks the kernel reuses). bf16 decode (batch 4 with split-SIZES.k, batch 64
   unsplit) the same way. Each ``fp8_656`` decode candidate (``wsf8``, ``wsf8h``, ``wsf8c``, ``ws4f8``: decode only) against the
   reference decode with ``layout="fp8_656"``: batch 4 with split-K and batch 64 unsplit, -1 rows, one empty
   query, unselected cache rows poisoned with e4m3 NaN bytes, outputs poisoned.
2. Speed: prefill of 4096 queries over 8K and 32K keys, 128 heads, k 2048, for each candidate and the Triton
   default in the same run (``triton.testing.do_bench`` median through ``bench/common.bench_ms``: calls queued
   back to back, as in a CUDA graph, so the host's launch overhead is not counted; the event-timed single calls
   used before 2026-11-23 08:00 UTC counted it, ~50 us a decode call); bf16 decode batch 64 at a 32K context
   (page 64) for the default and Triton; ``fp8_656`` decode at batch 64 and 128 x 32K for each FP8 candidate and
   the Triton FP8 decode (``mla_fp8_decode.decode_fp8_656``). TFLOP/s with ``FLOPs = 2 * H * (576 + 512) * SIZES.k`` per query, and the %
   of a bf16 ``torch.matmul`` 8192^3 measured in the same run (the prefill target: >= 55%).

    python3 bench/sparse_attn_tilelang.py [--out bench/results/sparse_attn_tilelang.json] [--quick] [--no-triton]
        [--only pipe,ws4] [--skip wsa] [--no-isolate]

Every warp-specialised candidate (``ws``, ``wsa``, ``ws4``) runs in its own child process (this script with
``--child``) after the ``pipe`` candidates' results are in the JSON: a kernel that faults (a sticky CUDA error
poisons the whole process) or hangs costs only its own rows, recorded as a FAIL with the child's exit code.
``--only`` / ``--skip`` take comma-separated parts of labels. Prints PASS/FAIL per check, a table last, and
writes JSON (atomically, again after each child). Exit 1 when a check fails or a child dies.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bf16_matmul_ceiling_tflops, write_json  # noqa: E402
from sparse_attn_tilelang_setup import (  # noqa: E402
    PAGE,
    PROGRESS,
    RESULTS,
    SCALE,
    SIZES,
    check,
    fp8_check_case,
    poison_allocator,
    prefill_case,
    step,
)
from sparse_attn_tilelang_speed import speed  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_attn import TileLangSparseAttn, plan_splits  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import (  # noqa: E402
    CANDIDATES,
    DEFAULT_CONFIG,
    FP8_VARIANTS,
    precompile,
)
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn  # noqa: E402

REF = ReferenceSparseAttn()
def sync() -> None:
    if SIZES.dev == "cuda":
        torch.cuda.synchronize()


def dry_run() -> None:
    """CPU plumbing check: tiny sizes, and the reference (with the kernel's split conventions) as the kernel."""
    SIZES.shrink_for_cpu()

    fault = os.environ.get("DSA_TILELANG_DRY_FAULT")  # tests: this candidate's process dies like a faulting kernel

    def run(self, q, kv, idx, sm_scale, split, decode=False):
        if fault and self.config is not None and self.config.label() == fault:
            os._exit(134)
        if idx.shape[0] != q.shape[0]:  # split rows: index row t over q row t % R (q read in place)
            q = q.repeat(idx.shape[0] // q.shape[0], 1, 1)
        if kv.dtype == torch.float8_e4m3fn:  # the fp8_656 rows: dequantised as the kernel's gather does
            from dsa_runtime.reference.kv_quant import unpack_mla_fp32

            kv = unpack_mla_fp32(kv.view(torch.uint8), "fp8_656").bfloat16()
        out, lse = REF.prefill(q, kv, idx, sm_scale)
        return (out.float(), torch.where(torch.isposinf(lse), float("-inf"), lse)) if split else (out, lse)

    def combine(part, part_lse, pdl=False):
        m = part_lse.max(dim=0).values
        empty = torch.isneginf(m)
        w = torch.exp(part_lse - torch.where(empty, 0.0, m)[None])
        tot = torch.where(empty, 1.0, w.sum(0))
        out = (w[..., None] * part).sum(0) / tot[..., None]
        return out.bfloat16(), torch.where(empty, float("inf"), torch.where(empty, 0.0, m) + torch.log(tot))

    import types

    TileLangSparseAttn._run = run
    mod = types.ModuleType("sparse_mla_combine")
    mod.combine_splits = combine
    sys.modules["dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_combine"] = mod


def watchdog(out: str) -> None:
    while True:
        time.sleep(5)
        if time.time() - PROGRESS["t"] > PROGRESS["limit"]:
            print(f"\nHANG: '{PROGRESS['what']}' did not finish in {PROGRESS['limit']:.0f} s; exiting", flush=True)
            RESULTS["hang"] = PROGRESS["what"]
            try:
                write_json(out, RESULTS)
            finally:
                os._exit(3)


def warm(configs, quick: bool, default_decode: bool = True) -> None:
    """Compile every kernel this run uses up front, in parallel (a cold compile takes tens of seconds each)."""
    keys = []
    fp8 = [c for c in configs if c.variant in FP8_VARIANTS]
    for cfg in fp8:  # the fp8_656 decode checks and timings
        for rows, splits in SIZES.fp8_checks + [(b, None) for b in SIZES.fp8_batches]:
            n = splits or plan_splits(rows, 128, SIZES.k)
            keys.append((128, SIZES.k // n, SCALE, cfg, n > 1))
    configs = [c for c in configs if c.variant not in FP8_VARIANTS]
    for _t, _s, heads, k in SIZES.check_shapes[2:3] if quick or not configs else SIZES.check_shapes:
        for cfg in configs if (heads, k) == (128, SIZES.k) else configs[:1]:
            keys.append((heads, k, SCALE, TileLangSparseAttn(config=cfg)._config(k), False))
    n_plan = plan_splits(SIZES.dec_batch, 128, SIZES.k)
    for cfg in configs:  # the timed decode of each candidate
        keys.append((128, SIZES.k // n_plan, SCALE, TileLangSparseAttn(config=cfg)._config(SIZES.k // n_plan), n_plan > 1))
    if default_decode:
        for rows in (4, 64):
            n = plan_splits(rows, 128, SIZES.k) if rows == 4 else 1
            keys.append((128, SIZES.k // n, SCALE, DEFAULT_CONFIG, n > 1))
        keys.append((128, SIZES.k // 2, SCALE, DEFAULT_CONFIG, True))  # decode timed with 2 splits
    t0 = time.time()
    step(f"compiling {len(set(keys))} kernels", limit=420)
    errors = precompile(keys)
    for key, why in errors.items():
        print(f"  compile FAILED heads {key[0]} k {key[1]} {key[3].label()} split {key[4]}: {why}", flush=True)
    print(f"compiled {len(set(keys))} kernels in {time.time() - t0:.0f} s ({len(errors)} failed)", flush=True)


def correctness(gen: torch.Generator, configs, quick: bool, decode: bool = True) -> bool:
    """Every check passes; records PASS/FAIL per launch shape in RESULTS["checks"]."""
    ok = True
    per_cfg = RESULTS["checks"]
    for cfg in [c for c in configs if c.variant in FP8_VARIANTS]:
        for batch, splits in SIZES.fp8_checks:
            passed = check_fp8_decode(gen, cfg, batch, splits)
            per_cfg[cfg.label()] = per_cfg.get(cfg.label(), True) and passed
            ok &= passed
    configs = [c for c in configs if c.variant not in FP8_VARIANTS]
    for t, s, heads, k in (SIZES.check_shapes[2:3] if quick else SIZES.check_shapes) if configs else ():
        q, kv, idx = prefill_case(gen, t, s, heads, k)
        want = REF.prefill(q[:64], kv, idx[:64], SCALE)  # the reference on the first rows (keeps it quick)
        for cfg in configs if (heads, k) == (128, SIZES.k) else configs[:1]:
            poison_allocator(4 * t * heads * 512 * 2)
            name = f"prefill {cfg.label()} t{t} s{s} h{heads} k{k}"
            step(name)
            got = TileLangSparseAttn(config=cfg).prefill(q, kv, idx, SCALE)
            sync()
            passed = check(name, (got[0][:64], got[1][:64]), want)
            per_cfg[cfg.label()] = per_cfg.get(cfg.label(), True) and passed
            ok &= passed
    for batch, splits in ((4, None), (64, 1)) if decode else ():
        heads = 128
        pages = batch * 8 + 1
        cache = torch.randn(pages, PAGE, 576, device=SIZES.dev, generator=gen).bfloat16()
        slots = torch.rand(batch, (pages - 1) * PAGE, device=SIZES.dev, generator=gen).argsort(dim=1)[:, :SIZES.k] + PAGE
        slots = slots.to(torch.int32).view(batch, 1, SIZES.k)
        slots[0, 0, 100:] = -1
        used = torch.zeros(pages * PAGE, dtype=torch.bool, device=SIZES.dev)
        used[slots[slots >= 0].long()] = True
        cache.view(-1, 576)[~used] = float("nan")
        q = torch.randn(batch, 1, heads, 576, device=SIZES.dev, generator=gen).bfloat16()
        n = splits or plan_splits(batch, heads, SIZES.k)
        poison_allocator(4 * batch * heads * 512 * 4 * n)
        name = f"decode bf16 b{batch} h{heads} k{SIZES.k} splits {n}"
        step(name)
        got = TileLangSparseAttn(decode_splits=n).decode(q, cache, slots, SCALE, layout="bf16")
        sync()
        want = REF.decode(q, cache, slots, SCALE, layout="bf16")
        passed = check(name, got, want)
        per_cfg[f"decode splits {n}"] = passed
        ok &= passed
    return ok




def check_fp8_decode(gen: torch.Generator, cfg, batch: int, splits: int | None) -> bool:
    """One fp8_656 decode check of ``cfg`` against the reference decode."""
    q, cache, slots = fp8_check_case(gen, batch)
    n = splits or plan_splits(batch, 128, SIZES.k)
    poison_allocator(4 * batch * 128 * 512 * 4 * n)
    name = f"decode fp8_656 {cfg.label()} b{batch} h128 k{SIZES.k} splits {n}"
    step(name)
    got = TileLangSparseAttn(config=cfg, decode_splits=n).decode(q, cache, slots, SCALE, layout="fp8_656")
    sync()
    return check(name, got, REF.decode(q, cache, slots, SCALE, layout="fp8_656"))


def pick(configs, only: str | None, skip: str | None) -> list:
    """The candidates whose label contains one of ``only``'s comma-separated parts and none of ``skip``'s."""
    want = [w for w in (only or "").split(",") if w]
    drop = [w for w in (skip or "").split(",") if w]
    return [c for c in configs if (not want or any(w in c.label() for w in want))
            and not any(w in c.label() for w in drop)]


def run_isolated(cfg, args, ceiling: float) -> bool:
    """One warp-specialised candidate in a child process; merges its rows and checks into RESULTS."""
    import json
    import subprocess
    import tempfile

    label = cfg.label()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "child.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--label", label, "--out", str(out),
               "--ceiling", repr(ceiling), "--no-triton"]
        cmd += [f for f, on in (("--dry-run", args.dry_run), ("--no-check", args.no_check),
                                ("--quick", args.quick)) if on]
        print(f"\n== {label} in a child process (a fault or hang there costs only its rows) ==", flush=True)
        step(f"child {label}", limit=args.child_timeout + 60)
        try:
            rc = subprocess.run(cmd, timeout=args.child_timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        child = json.loads(out.read_text()) if out.is_file() else {}
    RESULTS["rows"] += child.get("rows", [])
    RESULTS["checks"].update(child.get("checks", {}))
    RESULTS.setdefault("children", {})[label] = {"rc": rc, **({"hang": child["hang"]} if "hang" in child else {})}
    if rc and not args.no_check:
        RESULTS["checks"][label] = False  # died before its checks finished, or one failed
    if rc:
        print(f"  FAIL {label}: child exited {rc}" + (" (timeout)" if rc == 124 else ""), flush=True)
    write_json(args.out, RESULTS)
    return rc == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sparse_attn_tilelang.json"))
    ap.add_argument("--quick", action="store_true", help="the default launch shape only, one correctness shape")
    ap.add_argument("--no-triton", action="store_true", help="do not time the Triton kernels beside")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    ap.add_argument("--only", help="comma-separated parts of labels to run (e.g. pipe_i64_s2,ws4)")
    ap.add_argument("--skip", help="comma-separated parts of labels to leave out (e.g. wsa)")
    ap.add_argument("--no-isolate", action="store_true",
                    help="run the warp-specialised candidates in this process too (one fault ends the run)")
    ap.add_argument("--child-timeout", type=float, default=420.0, help="seconds for one isolated candidate")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one isolated candidate
    ap.add_argument("--label", help=argparse.SUPPRESS)  # --child: the exact label
    ap.add_argument("--ceiling", type=float, help=argparse.SUPPRESS)  # --child: the parent's matmul TFLOP/s
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU check of this script at tiny sizes (the reference stands in for the kernel; no timings)")
    args = ap.parse_args()
    if args.dry_run:
        dry_run()
        args.no_triton = True
    elif not torch.cuda.is_available():
        print("needs a CUDA GPU (or --dry-run)")
        return 2
    from importlib.metadata import PackageNotFoundError, version

    try:
        tl_version = version("tilelang")
    except PackageNotFoundError:
        tl_version = "not installed"
    info = {"torch": torch.__version__, "tilelang": tl_version, "cuda": str(torch.version.cuda)}
    if SIZES.dev == "cuda":
        props = torch.cuda.get_device_properties(0)
        info |= {"gpu": props.name, "sms": str(props.multi_processor_count)}
    if not args.child:
        print(info, flush=True)
    start = time.time()
    gen = torch.Generator(device=SIZES.dev).manual_seed(0)
    if args.child:
        configs = [c for c in CANDIDATES if c.label() == args.label]
    else:
        configs = pick([DEFAULT_CONFIG] if args.quick else list(CANDIDATES), args.only, args.skip)
    if not configs:
        print("no candidate left after --only / --skip")
        return 2
    isolated = [] if args.child or args.no_isolate else [c for c in configs if c.variant != "pipe"]
    here = [c for c in configs if c not in isolated]
    RESULTS["device"] = info
    threading.Thread(target=watchdog, args=(args.out,), daemon=True).start()
    # The pipe candidates own the decode checks and timings of the default; a child runs only its candidate.
    with_default = not args.child and DEFAULT_CONFIG in here
    if SIZES.dev == "cuda" and here:
        warm(here, args.quick, default_decode=with_default)
    ok = True
    if here and not args.no_check:
        ok = correctness(gen, here, args.quick, decode=with_default)
        print(f"correctness {'PASS' if ok else 'FAIL'} ({time.time() - start:.0f} s)", flush=True)
    if args.ceiling is not None:
        ceiling = args.ceiling
    else:
        step("bf16 matmul ceiling")
        ceiling = bf16_matmul_ceiling_tflops() if SIZES.dev == "cuda" else 1.0
        print(f"bf16 matmul 8192^3: {ceiling:.1f} TFLOP/s", flush=True)
    RESULTS["matmul_tflops"] = ceiling
    if here or not args.no_triton:
        # The Triton FP8 decode is timed (in this process) when an FP8 candidate runs, or with --only triton_fp8.
        fp8_triton = any(c.variant in FP8_VARIANTS for c in configs) or "triton_fp8" in (args.only or "")
        speed(gen, here, ceiling, not args.no_triton, default_decode=with_default, fp8_triton=fp8_triton)
    if isolated:
        write_json(args.out, RESULTS | {"partial": True})  # the pipe results are safe before any child runs
        if SIZES.dev == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        for cfg in isolated:
            ok &= run_isolated(cfg, args, ceiling)
    rows = RESULTS["rows"]
    step("table", limit=60)
    checks = RESULTS["checks"]
    if not args.child:
        print(f"\n{'shape':22s} {'kernel':36s} {'us':>9s} {'TFLOP/s':>8s} {'% matmul':>8s}  check")
        for r in rows:
            cfg_label = r["label"].split()[1] if r["label"].startswith("tilelang") else ""
            verdict = {True: "PASS", False: "FAIL"}.get(checks.get(cfg_label), "-")
            if "error" in r:
                print(f"{r['shape']:22s} {r['label']:36s} FAILED {r['error'][:60]}")
            else:
                print(f"{r['shape']:22s} {r['label']:36s} {r['us']:9.1f} {r['tflops']:8.1f} "
                      f"{r['pct_of_matmul']:8.1f}  {verdict}")
        for label, child in RESULTS.get("children", {}).items():
            if child["rc"]:
                print(f"{label}: child exited {child['rc']}" + (f", hung in {child['hang']}" if "hang" in child else ""))
    ok = ok and all(checks.values()) if not args.no_check else ok
    RESULTS.update(checks_ok=bool(ok), seconds=time.time() - start,
                   when=datetime.datetime.now(datetime.timezone.utc).isoformat())
    RESULTS.pop("partial", None)
    write_json(args.out, RESULTS)
    print(f"{'child ' + args.label + ': ' if args.child else ''}checks {'PASS' if ok else 'FAIL'}; "
          f"{time.time() - start:.0f} s; wrote {args.out}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
