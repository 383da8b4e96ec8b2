"""The timings of bench/sparse_attn_tilelang.py: each candidate's prefill, bf16 decode and ``fp8_656`` decode, and
the Triton kernels beside, as TFLOP/s and the % of the run's bf16 matmul (rows into ``RESULTS["rows"]``)."""

from __future__ import annotations

import time

import torch
from common import bench_ms
from sparse_attn_tilelang_setup import PAGE, RESULTS, SCALE, SIZES, fp8_timing_cache, prefill_inputs, step

from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_attn import TileLangSparseAttn, plan_splits
from dsa_runtime.plugins.cuda_hopper.tilelang.sparse_mla import DEFAULT_CONFIG, FP8_VARIANTS, flops


def cpu_ms(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def speed_fp8(rows: list[dict], gen: torch.Generator, configs, ceiling: float, triton: bool) -> None:
    """fp8_656 decode of each FP8 candidate (planned splits) and of the Triton FP8 decode, batch x the decode context."""
    for batch in SIZES.fp8_batches:
        speed_fp8_batch(rows, gen, batch, configs, ceiling, triton)
        if SIZES.dev == "cuda":
            torch.cuda.empty_cache()


def speed_fp8_batch(rows: list[dict], gen: torch.Generator, batch: int, configs, ceiling: float,
                    triton: bool) -> None:
    cache = fp8_timing_cache(gen, batch * SIZES.dec_ctx + PAGE)
    slots = torch.stack([torch.randperm(SIZES.dec_ctx, device=SIZES.dev, generator=gen)[:SIZES.k] + b * SIZES.dec_ctx
                         for b in range(batch)]).to(torch.int32).view(batch, 1, SIZES.k)
    qd = torch.randn(batch, 1, 128, 576, device=SIZES.dev, generator=gen).bfloat16()
    shape = f"decode fp8 b{batch} {SIZES.dec_ctx // 1024}K h128"
    n = plan_splits(batch, 128, SIZES.k)
    for cfg in configs:
        kern = TileLangSparseAttn(config=cfg, decode_splits=n)
        timed(rows, shape, f"tilelang {cfg.label()} splits {n}",
              lambda k=kern: k.decode(qd, cache, slots, SCALE, layout="fp8_656"), flops(batch, 128, SIZES.k), ceiling)
    if triton:
        from dsa_runtime.plugins.cuda_hopper.triton.mla_fp8_decode import decode_fp8_656

        timed(rows, shape, "triton fp8 default", lambda: decode_fp8_656(qd, cache, slots, SCALE),
              flops(batch, 128, SIZES.k), ceiling)


def timed(rows: list[dict], shape: str, label: str, fn, n_flops: int, ceiling: float) -> None:
    t0 = time.time()
    step(f"timing {shape} {label}")
    try:
        ms = bench_ms(fn) if SIZES.dev == "cuda" else cpu_ms(fn)
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
    shape = f"prefill t{SIZES.t_pre} s{s // 1024}K"
    for cfg in configs:
        kern = TileLangSparseAttn(config=cfg)
        timed(rows, shape, f"tilelang {cfg.label()}", lambda k=kern: k.prefill(q, kv, idx, SCALE),
              flops(SIZES.t_pre, 128, SIZES.k), ceiling)
    if triton:
        from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_prefill import sparse_mla_forward

        timed(rows, shape, "triton default", lambda: sparse_mla_forward(q, kv, idx, SCALE), flops(SIZES.t_pre, 128, SIZES.k),
              ceiling)


def speed(gen: torch.Generator, configs, ceiling: float, triton: bool, default_decode: bool = True,
          fp8_triton: bool = False) -> list[dict]:
    """Timings of ``configs`` (the bf16 ones: prefill and bf16 decode; the FP8 ones: fp8_656 decode) and, with
    ``triton``, the Triton kernels beside (the FP8 decode when ``fp8_triton``)."""
    rows: list[dict] = RESULTS["rows"]
    fp8 = [c for c in configs if c.variant in FP8_VARIANTS]
    if fp8 or fp8_triton:
        speed_fp8(rows, gen, fp8, ceiling, triton and fp8_triton)
    configs = [c for c in configs if c.variant not in FP8_VARIANTS]
    if not configs and not triton:
        return rows
    for s in SIZES.s_pre:
        speed_prefill(rows, gen, s, configs, ceiling, triton)
        if SIZES.dev == "cuda":
            torch.cuda.empty_cache()
    batch, ctx = SIZES.dec_batch, SIZES.dec_ctx
    pages = batch * ctx // PAGE + 1
    cache = torch.randn(pages, PAGE, 576, device=SIZES.dev, generator=gen).bfloat16()
    slots = torch.stack([torch.randperm(ctx, device=SIZES.dev, generator=gen)[:SIZES.k] + b * ctx for b in range(batch)])
    slots = slots.to(torch.int32).view(batch, 1, SIZES.k)
    qd = torch.randn(batch, 1, 128, 576, device=SIZES.dev, generator=gen).bfloat16()
    shape = f"decode b{batch} {ctx // 1024}K h128"
    n_plan = plan_splits(batch, 128, SIZES.k)
    for cfg, n in [(c, n_plan) for c in configs] + ([(DEFAULT_CONFIG, 2)] if default_decode else []):
        kern = TileLangSparseAttn(config=cfg, decode_splits=n)
        timed(rows, shape, f"tilelang {cfg.label()} splits {n}",
              lambda k=kern: k.decode(qd, cache, slots, SCALE, layout="bf16"), flops(batch, 128, SIZES.k), ceiling)
    if triton:
        from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_bf16 import decode_bf16

        timed(rows, shape, "triton default", lambda: decode_bf16(qd, cache, slots, SCALE), flops(batch, 128, SIZES.k),
              ceiling)
    return rows
