"""Sparse MLA benchmark of the cuda_hopper ``triton`` backend at DeepSeek-V3.2 sizes.

Correctness first: prefill (4096 queries over 8192 keys, 128 heads, top-2048) and bf16 paged decode (batch
1 / 64 / 128 at a 32K context, 128 and 16 heads, page 64, top-2048), each against the reference backend on
CUDA (on a subset of query rows, to stay fast). Then every candidate launch shape is timed (median of
``triton.testing.do_bench``; decode also replayed in a CUDA graph) and printed in TFLOP/s with
``FLOPs = 2 * H * (576 + 512) * K`` per query row, beside a bf16 ``torch.matmul`` 8192^3 ceiling measured in
the same run. A shape that fails to compile (e.g. out of shared memory) is reported, not fatal.

    python3 bench/sparse_attn_triton.py [--out bench/results/sparse_attn_triton.json] [--quick]
    python3 bench/sparse_attn_triton.py --sweep   # every candidate of sparse_attn_candidates (bench/sparse_attn_sweep.py)
"""

from __future__ import annotations

import argparse
import datetime
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_ms, bf16_matmul_ceiling_tflops, device_info, graph_ms, write_json  # noqa: E402

from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_decode_bf16 import decode_bf16, plan_splits, sm_count  # noqa: E402
from dsa_runtime.plugins.cuda_hopper.triton.sparse_mla_prefill import (  # noqa: E402
    AttnConfig,
    default_config,
    flops,
    sparse_mla_forward,
)
from dsa_runtime.reference.sparse_attn import ReferenceSparseAttn  # noqa: E402
from dsa_runtime.testing.compare import out_and_lse  # noqa: E402
from dsa_runtime.testing.tolerances import tolerance  # noqa: E402

SCALE, K, PAGE = 0.135234, 2048, 64
C = AttnConfig
# Offline sm_90 compiles (triton.compile for GPUTarget("cuda", 90, 32) + ptxas -v, no GPU) of each candidate:
# h64_n32_dv512_w8_s2 (the default): 144 KB smem, 244 regs, no spill; _s3: 144 KB, no spill; n16_s4: 108 KB, no
# spill; n64_s2: 216 KB, 80 B spill; _s1 shapes spill 360-450 B (no cp.async pipeline); dv256_w4_s2: 176 KB, no
# spill (QK computed twice per head block). Left out: h64_n64_dv256 (280 KB smem: does not fit), 4-warp dv512
# (2 KB spills), 32-head tiles (mma.sync, not wgmma, and spills).
PREFILL_CONFIGS = [  # (block_h, block_n, block_dv, warps, stages); the default is timed first
    C(64, 32, 512, 8, 3), C(64, 16, 512, 8, 4), C(64, 64, 512, 8, 2), C(64, 32, 512, 8, 1),
    C(64, 64, 512, 8, 1), C(64, 32, 256, 4, 2), C(64, 32, 256, 4, 3),
]
DECODE_CONFIGS = {
    128: [C(64, 64, 512, 8, 2), C(64, 32, 512, 8, 3), C(64, 32, 256, 4, 2)],
    16: [C(16, 32, 512, 4, 3), C(16, 64, 512, 4, 3), C(16, 128, 512, 4, 2), C(16, 64, 256, 4, 2)],
}


def check(name: str, got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor]) -> bool:
    msg = out_and_lse(got[0].float(), got[1], want[0].float(), want[1],
                      tolerance("sparse_attn.out"), tolerance("sparse_attn.lse"))
    print(f"  check {name}: {'ok' if msg is None else 'FAILED ' + msg}", flush=True)
    return msg is None


def prefill_inputs(t: int, s: int, heads: int, gen: torch.Generator):
    q = torch.randn(t, heads, 576, device="cuda", generator=gen).bfloat16()
    kv = torch.randn(s, 576, device="cuda", generator=gen).bfloat16()
    idx = torch.rand(t, s, device="cuda", generator=gen).argsort(dim=1)[:, :K].to(torch.int32)
    idx[:: 7, -100:] = -1  # some padding, as the indexer leaves for short contexts
    return q, kv, idx


def decode_inputs(batch: int, heads: int, ctx: int, gen: torch.Generator):
    pages_per = ctx // PAGE
    n_pages = batch * pages_per + 1
    cache = torch.randn(n_pages, PAGE, 576, device="cuda", generator=gen).bfloat16()
    table = torch.randperm(n_pages - 1, device="cuda", generator=gen).view(batch, pages_per)
    pos = torch.rand(batch, ctx, device="cuda", generator=gen).argsort(dim=1)[:, :K]
    slots = (torch.gather(table, 1, pos // PAGE) * PAGE + pos % PAGE).to(torch.int32)
    q = torch.randn(batch, 1, heads, 576, device="cuda", generator=gen).bfloat16()
    return q, cache, slots.view(batch, 1, K)


def timed(label: str, fn, n_flops: int, ceiling: float, rows: list[dict], extra: dict, graph: bool = False) -> None:
    try:
        ms = bench_ms(fn)
        g_ms = graph_ms(fn) if graph else float("nan")
    except Exception as exc:  # noqa: BLE001 - a shape that does not compile is a result, not a crash
        why = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        print(f"  {label:44s} FAILED: {why}", flush=True)
        rows.append({**extra, "label": label, "error": why})
        return
    best = min(ms, g_ms) if g_ms == g_ms else ms
    tf = n_flops / best / 1e9
    print(f"  {label:44s} {ms * 1e3:10.1f} us  graph {g_ms * 1e3:10.1f} us  {tf:7.1f} TFLOP/s  "
          f"{100 * tf / ceiling:5.1f}% of matmul", flush=True)
    rows.append({**extra, "label": label, "us": ms * 1e3, "graph_us": g_ms * 1e3, "tflops": tf,
                 "pct_of_matmul": 100 * tf / ceiling})


def bench_prefill(args, gen, ceiling: float, rows: list[dict]) -> bool:
    heads, ok = 128, True
    q, kv, idx = prefill_inputs(4096, 8192, heads, gen)
    if not args.no_check:
        got = sparse_mla_forward(q, kv, idx, SCALE)
        sub = slice(0, 4096, 32)
        ok = check("prefill t4096 s8192 h128 k2048 (every 32nd row)", (got[0][sub], got[1][sub]),
                   ReferenceSparseAttn().prefill(q[sub], kv, idx[sub], SCALE))
    print("prefill: 4096 queries, 8192 keys, 128 heads, k 2048", flush=True)
    configs = PREFILL_CONFIGS[:2] if args.quick else PREFILL_CONFIGS
    for cfg in dict.fromkeys([default_config(heads, torch.bfloat16), *configs]):
        timed(cfg.label(), lambda cfg=cfg: sparse_mla_forward(q, kv, idx, SCALE, config=cfg),
              flops(4096, heads, K), ceiling, rows, {"config": cfg.__dict__})
    return ok


def bench_decode(args, gen, batch: int, heads: int, ceiling: float, rows: list[dict]) -> bool:
    ok = True
    q, cache, slots = decode_inputs(batch, heads, 32768, gen)
    sms = sm_count(torch.cuda.current_device())
    cfg0 = default_config(heads, torch.bfloat16, "decode")
    print(f"decode: batch {batch}, {heads} heads, 32K context, k {K}, page {PAGE} "
          f"(planned splits {plan_splits(batch, heads, K, sms, cfg0)})", flush=True)
    if not args.no_check:
        sub = slice(0, batch, max(1, batch // 8))
        want = ReferenceSparseAttn().decode(q[sub], cache, slots[sub], SCALE, layout="bf16")
        ok &= check(f"decode b{batch} h{heads}", decode_bf16(q[sub], cache, slots[sub], SCALE), want)
        ok &= check(f"decode b{batch} h{heads} unsplit", decode_bf16(q[sub], cache, slots[sub], SCALE, num_splits=1),
                    want)
    for cfg in dict.fromkeys([cfg0] if args.quick else [cfg0, *DECODE_CONFIGS[heads]]):
        n_plan = plan_splits(batch, heads, K, sms, cfg)
        for n in sorted({n_plan, 1, 2 * n_plan} if cfg is cfg0 else {n_plan}):
            timed(f"{cfg.label()} splits {n}",
                  lambda cfg=cfg, n=n: decode_bf16(q, cache, slots, SCALE, config=cfg, num_splits=n),
                  flops(batch, heads, K), ceiling, rows,
                  {"batch": batch, "heads": heads, "config": cfg.__dict__, "splits": n}, graph=True)
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "sparse_attn_triton.json"))
    ap.add_argument("--quick", action="store_true", help="first two prefill configs and the default decode only")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    ap.add_argument("--sweep", action="store_true", help="time every candidate of sparse_attn_candidates (bf16 + fp8)")
    ap.add_argument("--budget-s", type=float, default=240.0, help="--sweep: skip what remains after this many seconds")
    ap.add_argument("--dry-run", action="store_true",
                    help="--sweep on the CPU at tiny shapes (set TRITON_INTERPRET=1): checks the script, times nothing")
    args = ap.parse_args()
    if args.sweep:
        from sparse_attn_sweep import main as sweep_main

        out = args.out.replace("sparse_attn_triton.json", "sparse_attn_sweep" + ("_dry" if args.dry_run else "") + ".json")
        return sweep_main(out, args.budget_s, dry_run=args.dry_run)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    info = device_info()
    print(info, flush=True)
    ceiling = bf16_matmul_ceiling_tflops()
    print(f"bf16 matmul 8192^3: {ceiling:.1f} TFLOP/s", flush=True)
    results: dict = {"device": info, "matmul_tflops": ceiling, "prefill": [], "decode": []}
    ok = bench_prefill(args, gen, ceiling, results["prefill"])
    torch.cuda.empty_cache()
    for heads in (128, 16):
        for batch in (1, 64, 128):
            ok &= bench_decode(args, gen, batch, heads, ceiling, results["decode"])
            torch.cuda.empty_cache()
    results["checks_ok"] = bool(ok)
    results["when"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    write_json(args.out, results)
    print(f"checks {'ok' if ok else 'FAILED'}; wrote {args.out}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:
        traceback.print_exc()
        sys.exit(1)
